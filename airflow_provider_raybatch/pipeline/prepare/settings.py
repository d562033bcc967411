"""The settings an output was started with against a run's: each difference named with both values,
secrets masked, so that the refusal to mix them says what to change back (or to overwrite).

The pipeline imports no Airflow, so Airflow's secrets masker (which hides the values the hooks
register) is not at hand where the refusal is raised: settings are masked here by their key's
name, in the words of Airflow's list of sensitive fields, and a URL's user and password wherever
they appear.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
#: A key holding any of these words (split at ``_``, ``-``, ``.``, spaces and case) holds a secret.
SECRET_WORDS = frozenset(
    {
        "apikey",
        "authorization",
        "bearer",
        "cookie",
        "cookies",
        "credential",
        "credentials",
        "dsn",
        "headers",
        "passphrase",
        "passwd",
        "password",
        "proxies",
        "proxy",
        "secret",
    }
)
#: ... or these words in a row.
SECRET_PHRASES = (
    ("access", "key"),
    ("api", "key"),
    ("auth", "header"),
    ("connection", "string"),
    ("keyfile", "dict"),
    ("private", "key"),
    ("service", "account"),
    ("service", "key"),
    ("webhook", "url"),
)
#: ... or ends with this one (``hf_token``, ``access_token``; not ``max_tokens`` nor ``token_columns``).
SECRET_LAST_WORD = "token"
#: Changes listed before the rest are counted, and characters of a value shown: the refusal stays readable.
MAX_CHANGES = 10
MAX_VALUE_CHARS = 120

_URL_USER = re.compile(r"(://)[^/@\s]+@")


def is_secret_key(key: str) -> bool:
    """Whether the setting named ``key`` holds a secret. A key ending in ``env`` (``api_key_env``)
    names the environment variable that holds one, which is no secret."""
    words = re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower())
    words = [w for w in words if w]
    if not words or words[-1] == "env":
        return False
    if words[-1] == SECRET_LAST_WORD or SECRET_WORDS.intersection(words):
        return True
    return any(tuple(words[i : i + len(p)]) == p for p in SECRET_PHRASES for i in range(len(words)))


def masked(value: Any) -> Any:
    """``value`` (JSON-like) with what every secret key holds replaced by :data:`MASK`, at any depth,
    and the user and password of URLs in its strings."""
    if isinstance(value, dict):
        return {k: MASK if is_secret_key(str(k)) else masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked(v) for v in value]
    if isinstance(value, str):
        return _URL_USER.sub(rf"\1{MASK}@", value)
    return value


def setting_changes(recorded: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Each setting of ``new`` that differs from ``recorded``, as ``where: recorded -> new``
    (``stages[0].predictor_kwargs.model_path: '/models/a.pt' -> '/models/b.pt'``), secrets masked;
    at most :data:`MAX_CHANGES`, then how many more.

    A top-level setting that ``recorded`` lacks (an output of a release before it existed) counts
    as None, as the check of the settings counts it.

    :param recorded: the job signature an output was started with (:attr:`.PlanRecord.job`).
    :param new: the run's (:meth:`.BatchInferenceConfig.job_signature`).
    """
    changes: list[str] = []
    for key, value in new.items():
        _compare(recorded.get(key), value, key, changes)
    if len(changes) > MAX_CHANGES:
        changes[MAX_CHANGES:] = [f"... and {len(changes) - MAX_CHANGES} more"]
    return changes


#: A key or stage one side lacks (None would read as a value).
_ABSENT = object()


def _compare(old: Any, new: Any, where: str, changes: list[str], secret: bool = False) -> None:
    if old == new:
        return
    if not secret and isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys(), key=str):
            before, after = old.get(key, _ABSENT), new.get(key, _ABSENT)
            _compare(before, after, f"{where}.{key}", changes, is_secret_key(str(key)))
        return
    # Stages are compared one by one: a list of names or numbers is one setting.
    if not secret and isinstance(old, list) and isinstance(new, list) and any(isinstance(v, dict) for v in new):
        for i in range(max(len(old), len(new))):
            before = old[i] if i < len(old) else _ABSENT
            after = new[i] if i < len(new) else _ABSENT
            _compare(before, after, f"{where}[{i}]", changes)
        return
    before, after = _shown(old, secret), _shown(new, secret)
    # Values that differ only where they are masked read the same: say why they are listed.
    changes.append(f"{where}: {before} -> {after}" + (" (a secret changed)" if before == after else ""))


def _shown(value: Any, secret: bool) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = MASK if secret else repr(masked(value))
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."
