"""The ``ray`` connection: run on an embedded local Ray, or on a cluster through its Jobs API."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException

if TYPE_CHECKING:
    # The client (aiohttp) is imported where it is used: DAG files importing operators stay light.
    from airflow_provider_raybatch.hooks.jobs_client import RayJobsClient

#: Seconds the connection form's Test button waits for the cluster.
TEST_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RayClusterSettings:
    """Where and how to reach a cluster's Jobs API; the secrets are kept out of ``repr``."""

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
        return f"{self.address}/#/jobs/{submission_id}"


class RayHook(BaseHook):
    """Resolves a ``ray`` connection to where a pipeline runs.

    With no connection of that id, a connection without a host, or ``ray_conn_id=None``,
    pipelines run on an embedded local Ray started inside the task and shut down when it ends:
    everything works on a laptop. Otherwise the host is a Ray cluster's dashboard / Jobs API
    address (``http(s)://head:8265``) and pipelines run there as Ray Jobs. The password, if set,
    is the cluster's auth token (sent as ``Authorization: Bearer``); the extras are declared in
    ``get_provider_info`` (``conn-fields``).

    :param ray_conn_id: the ``ray`` connection to use; None for the embedded local Ray.
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = "ray"
    hook_name = "Ray"

    def __init__(self, ray_conn_id: str | None = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id

    @cached_property
    def cluster(self) -> RayClusterSettings | None:
        """The cluster's settings, or None for the embedded local Ray."""
        if self.ray_conn_id is None:
            return None
        try:
            conn = self.get_connection(self.ray_conn_id)
        except AirflowNotFoundException:
            self.log.info("No connection %r: using an embedded local Ray", self.ray_conn_id)
            return None
        return cluster_settings(conn)

    async def acluster(self) -> RayClusterSettings | None:
        """:attr:`cluster`, for async code (triggers)."""
        if self.ray_conn_id is None:
            return None
        return cluster_settings(await self.aget_connection(self.ray_conn_id))

    def get_conn(self) -> RayJobsClient:
        from airflow_provider_raybatch.hooks.jobs_client import RayJobsClient

        if self.cluster is None:
            raise AirflowException(f"connection {self.ray_conn_id!r} names no Ray cluster (no host)")
        return RayJobsClient(self.cluster)

    def test_connection(self) -> tuple[bool, str]:
        """Reach the cluster and report its Ray version and resources (the UI's Test button)."""
        from airflow_provider_raybatch.hooks.jobs_client import RayJobsClient, RayJobsError, run_sync

        try:
            # The UI waits on this answer: a shorter timeout than the jobs' calls.
            client = RayJobsClient(replace(self.get_conn().settings, timeout_s=TEST_TIMEOUT_S))
            version, nodes = run_sync(_describe(client))
        except (AirflowException, RayJobsError, ValueError) as e:
            return False, str(e)
        totals: dict[str, float] = {}
        for node in nodes:
            for key in ("CPU", "GPU"):
                totals[key] = totals.get(key, 0) + node.get("resources_total", {}).get(key, 0)
        return True, (
            f"Ray {version} at {client.address}: {len(nodes)} node(s), "
            f"{totals.get('CPU', 0):g} CPUs, {totals.get('GPU', 0):g} GPUs"
        )


async def _describe(client: RayJobsClient) -> tuple[str, list[dict[str, Any]]]:
    return await client.version(), await client.nodes()


def cluster_settings(conn: Any) -> RayClusterSettings | None:
    """Settings from a ``ray`` connection; None when it has no host (embedded local Ray)."""
    if not conn.host:
        return None
    address = conn.host.rstrip("/")
    if "://" not in address:
        address = f"http://{address}"
    scheme, _, rest = address.partition("://")
    if scheme not in ("http", "https"):
        raise ValueError(
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
            raise ValueError(f"connection {conn.conn_id!r}: extra {name!r} is not valid JSON ({e.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"connection {conn.conn_id!r}: extra {name!r} must be a JSON object")
    return value


def _number(conn: Any, extra: dict[str, Any], name: str, kind: type) -> Any:
    value = extra.get(name)
    if value in (None, ""):
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"connection {conn.conn_id!r}: extra {name!r} must be a number, got {value!r}") from None
