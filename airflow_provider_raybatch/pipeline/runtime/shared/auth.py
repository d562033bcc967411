"""Presenting the shared head's token: Ray's token auth, whose settings Ray reads at import."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from airflow_provider_raybatch.pipeline import ray_compat

_AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")


def use_head_token(token_path: Path) -> dict[str, str | None]:
    """Make this process present the token in ``token_path``; return the variables it replaced,
    for :func:`restore_auth`.

    Ray's public way is its environment (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN_PATH``), read
    once, when Ray is imported: a task that has not imported Ray yet (the operator and the
    runner import it only to connect) needs nothing else.
    """
    saved = {k: os.environ.get(k) for k in _AUTH_VARIABLES}
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_path)
    if "ray" in sys.modules:
        ray_compat.reload_auth_settings()
    return saved


def restore_auth(saved: Mapping[str, str | None]) -> None:
    """Put back what :func:`use_head_token` replaced (a process may connect to another Ray next)."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if "ray" in sys.modules:
        ray_compat.reload_auth_settings()
