"""What differs between the Airflow versions this provider supports (3.1, 3.2, 3.3), in one place.

The provider's Airflow side imports the names that moved from here, and asks the flags below
where a feature is missing; nothing else in the package looks at Airflow's version. (The Ray
side has its own: :mod:`airflow_provider_raybatch.pipeline.ray_compat`.)

What an older Airflow lacks, and what the provider does instead (docs/compatibility.md):

- **the task state store (3.3)**: a try of a cluster task reads the Ray job attempt its earlier
  try reached from it. Without it, a try walks the chain of submission ids from attempt 0 (a
  request per earlier attempt): it still finds the live or finished job, never submits a second.
- **``BaseTrigger.on_kill`` (3.3)**: a task marked failed while deferred stops its Ray job.
  Without it, the job runs on until it ends or its deadline; stop it from the Ray dashboard.
- **``conn-fields`` in the provider info (3.2)**: the ``ray`` connection form's named fields.
  On 3.1 the extras are the JSON "Extra" field, and the hook's own form method gives the labels
  (read by 3.1 only where the FAB provider's wtforms is installed).
- **``airflow.sdk.exceptions``, ``airflow.sdk.configuration`` (3.2)**: on 3.1 the same classes
  and settings live in ``airflow.exceptions`` and ``airflow.configuration``.
"""

from __future__ import annotations

import logging

from airflow import __version__ as AIRFLOW_VERSION_TEXT  # noqa: N812 - a constant

# A deprecated argument's warning, as the official providers give it: here on every supported version.
from airflow.exceptions import AirflowProviderDeprecationWarning
from packaging.version import Version

log = logging.getLogger(__name__)


def _base_version(text: str) -> Version:
    """``3.2.0rc1`` and ``3.2.0.dev0`` count as 3.2.0: a pre-release has the release's features."""
    return Version(Version(text).base_version)


AIRFLOW_VERSION = _base_version(AIRFLOW_VERSION_TEXT)
AIRFLOW_V_3_2_PLUS = Version("3.2.0") <= AIRFLOW_VERSION
AIRFLOW_V_3_3_PLUS = Version("3.3.0") <= AIRFLOW_VERSION

if AIRFLOW_V_3_2_PLUS:
    from airflow.sdk.configuration import conf
    from airflow.sdk.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowNotFoundException,
        AirflowTaskTimeout,
    )
else:  # Airflow 3.1: the task runner raises and catches these classes
    from airflow.configuration import conf  # type: ignore[no-redef]
    from airflow.exceptions import (  # type: ignore[no-redef]
        AirflowException,
        AirflowFailException,
        AirflowNotFoundException,
        AirflowTaskTimeout,
    )


def redact(text: str) -> str:
    """``text`` with the secrets Airflow's masker knows of (connections' passwords and extras, masked
    values) hidden; its module moved under ``airflow.sdk._shared`` after 3.1."""
    try:
        from airflow.sdk._shared.secrets_masker import redact as _redact
    except ImportError:  # Airflow 3.1
        from airflow.sdk.execution_time.secrets_masker import redact as _redact
    return str(_redact(text))


#: Whether a deferred task's trigger is told when the task is killed (``BaseTrigger.on_kill``).
TRIGGER_ON_KILL = AIRFLOW_V_3_3_PLUS

_noted: set[str] = set()


def note_once(key: str, message: str, *args: object) -> None:
    """Log what an older Airflow does not do, once per process (a worker runs many tasks)."""
    if key not in _noted:
        _noted.add(key)
        log.info(message, *args)


__all__ = [
    "AIRFLOW_VERSION",
    "AIRFLOW_V_3_2_PLUS",
    "AIRFLOW_V_3_3_PLUS",
    "TRIGGER_ON_KILL",
    "AirflowException",
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowProviderDeprecationWarning",
    "AirflowTaskTimeout",
    "conf",
    "note_once",
    "redact",
]
