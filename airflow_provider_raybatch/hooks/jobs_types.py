"""What the provider and a Ray cluster's Jobs API say to each other: settings (read from a ``ray``
connection), job info and its outcome, errors.

Kept apart from the client (:mod:`.jobs_client`) so that everything importing these types (the
hook, the operators, the trigger, and so DAG files) stays free of aiohttp, which only the code
that talks to a cluster loads. No Airflow import here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_raybatch.pipeline.errors import ERROR_PREFIX, NOT_RETRYABLE_EXIT, ConfigError

#: Ray job statuses of a job that has not ended.
ACTIVE = ("PENDING", "RUNNING")
#: Ray job statuses of a job that has ended.
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class RayJobsError(Exception):
    """The Jobs API could not be reached or refused a request; the message says why."""


class JobDeadlineExceeded(RayJobsError):
    """The task's deadline passed while the job was still running."""


class JobAlreadyExists(RayJobsError):
    """A job with this submission id exists already (another try submitted it)."""


@dataclass(frozen=True)
class RayClusterSettings:
    """Where and how to reach a cluster's Jobs API; the secrets are kept out of ``repr``.

    :param timeout_s: the longest a single request may take (a log stream only waits this long
        to connect).
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

    def job_url(self, submission_id: str) -> str:
        """The job's page in the Ray dashboard."""
        return f"{self.address}/#/jobs/{submission_id}"


@dataclass(frozen=True)
class JobFailure:
    """Why a job did not succeed, and whether running it again could help."""

    message: str
    retryable: bool


@dataclass(frozen=True)
class JobInfo:
    """A Ray job's state as the Jobs API reports it (also the trigger's event payload)."""

    submission_id: str
    status: str
    message: str = ""
    driver_exit_code: int | None = None

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def is_successful(self) -> bool:
        return self.status == "SUCCEEDED"

    @property
    def failure(self) -> JobFailure | None:
        """Why the job ended without success; None while it runs or once it succeeded.

        A pipeline job that exits with :data:`~airflow_provider_raybatch.pipeline.errors.NOT_RETRYABLE_EXIT`
        found bad settings or input, or too many engine errors: not retryable, and the message is
        the job's own (the last line it wrote after ``ERROR_PREFIX``). Anything else (a crash, a
        lost node, a stop) may pass on another try.
        """
        if not self.is_terminal or self.is_successful:
            return None
        if self.status == "FAILED" and self.driver_exit_code == NOT_RETRYABLE_EXIT:
            lines = self.message.splitlines()
            errors = [line.removeprefix(ERROR_PREFIX) for line in lines if line.startswith(ERROR_PREFIX)]
            return JobFailure(errors[-1] if errors else self.message, retryable=False)
        return JobFailure(f"Ray job {self.submission_id} ended {self.status}: {self.message}", retryable=True)


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
    )


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
