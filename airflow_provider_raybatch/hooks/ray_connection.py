"""The ``ray`` connection: a Ray cluster's Jobs API address, its auth, and the jobs' settings.

A connection without a host means the embedded local Ray (:func:`cluster_settings` returns None).
No Airflow import here: the connection object is passed in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_raybatch.pipeline.errors import ConfigError

#: Seconds the Jobs API may stay unavailable before a call (a wait's poll included) gives up: long
#: enough for a dashboard restart or a head pod rescheduled, short enough that a cluster that is
#: really gone fails the try (which the next try then reattaches, or resubmits).
DEFAULT_OUTAGE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RayClusterSettings:
    """Where and how to reach a cluster's Jobs API; the secrets are kept out of ``repr``.

    :param timeout_s: the longest a single request may take (a log stream only waits this long
        to connect).
    :param outage_timeout_s: how long a call keeps retrying while the Jobs API is unavailable
        (:class:`~airflow_provider_raybatch.hooks.jobs_types.JobsApiUnavailable`) before it fails;
        0: one attempt.
    """

    address: str
    verify: bool = True
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    cookies: dict[str, str] = field(default_factory=dict, repr=False)
    runtime_env: dict[str, Any] = field(default_factory=dict, repr=False)
    entrypoint_num_cpus: float | None = None
    entrypoint_num_gpus: float | None = None
    entrypoint_memory: int | None = None
    namespace: str | None = None
    timeout_s: float = 10.0
    outage_timeout_s: float = DEFAULT_OUTAGE_TIMEOUT_S

    def job_url(self, submission_id: str) -> str:
        """The job's page in the Ray dashboard."""
        return f"{self.address}/#/jobs/{submission_id}"


def cluster_settings(conn: Any) -> RayClusterSettings | None:
    """Settings from a ``ray`` connection; None when it has no host (embedded local Ray)."""
    if not conn.host:
        return None
    address = conn.host.rstrip("/")
    if "://" not in address:
        address = f"http://{address}"
    scheme, _, rest = address.partition("://")
    if scheme not in ("http", "https"):
        raise ConfigError(
            f"connection {conn.conn_id!r}: host {conn.host!r} must be the Ray dashboard / Jobs API address "
            "http(s)://host:8265, not a Ray Client or GCS address"
        )
    if conn.port and ":" not in rest:
        address = f"{address}:{conn.port}"
    extra = conn.extra_dejson
    headers = {str(k): str(v) for k, v in _json_field(conn, extra, "headers").items()}
    if conn.password and not any(k.lower() == "authorization" for k in headers):
        headers["Authorization"] = f"Bearer {conn.password}"
    verify = extra.get("verify", True)
    return RayClusterSettings(
        address=address,
        verify=verify.strip().lower() not in ("false", "0", "no") if isinstance(verify, str) else bool(verify),
        headers=headers,
        cookies={str(k): str(v) for k, v in _json_field(conn, extra, "cookies").items()},
        runtime_env=_json_field(conn, extra, "runtime_env"),
        entrypoint_num_cpus=_number(conn, extra, "entrypoint_num_cpus", float),
        entrypoint_num_gpus=_number(conn, extra, "entrypoint_num_gpus", float),
        entrypoint_memory=_number(conn, extra, "entrypoint_memory", int),
        namespace=extra.get("namespace") or None,
        outage_timeout_s=_seconds(conn, extra, "outage_timeout", DEFAULT_OUTAGE_TIMEOUT_S),
    )


def _seconds(conn: Any, extra: dict[str, Any], name: str, default: float) -> float:
    value = _number(conn, extra, name, float)
    if value is None:
        return default
    if value < 0:
        raise ConfigError(f"connection {conn.conn_id!r}: extra {name!r} must be >= 0 seconds, got {value:g}")
    return value


def _json_field(conn: Any, extra: dict[str, Any], name: str) -> dict[str, Any]:
    value = extra.get(name) or {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            # The value may be secret (headers, cookies): name the field, never echo the value.
            raise ConfigError(f"connection {conn.conn_id!r}: extra {name!r} is not valid JSON ({e.msg})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"connection {conn.conn_id!r}: extra {name!r} must be a JSON object")
    return value


def _number(conn: Any, extra: dict[str, Any], name: str, kind: type) -> Any:
    value = extra.get(name)
    if value in (None, ""):
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"connection {conn.conn_id!r}: extra {name!r} must be a number, got {value!r}") from None
