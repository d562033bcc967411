"""The ``ray`` connection, and the one door to a cluster's Jobs API: submit or attach, get, stop, wait."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.sdk import BaseHook

from airflow_provider_raybatch.hooks.jobs_types import JobAlreadyExists, JobInfo, JobStatus, RayJobsError
from airflow_provider_raybatch.hooks.ray_connection import RayClusterSettings, cluster_settings
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.version_compat import AIRFLOW_V_3_2_PLUS, AirflowNotFoundException

if TYPE_CHECKING:
    # The client (aiohttp) is imported where it is used: DAG files importing operators stay light.
    from airflow_provider_raybatch.hooks.jobs_client import RayJobsClient

#: Seconds the connection form's Test button waits for the cluster.
TEST_TIMEOUT_S = 5.0

T = TypeVar("T")


class RayHook(BaseHook):
    """Resolves a ``ray`` connection to where a pipeline runs, and runs jobs on a cluster.

    With no connection of that id, a connection without a host, or ``ray_conn_id=None``,
    pipelines run on a local Ray in the task: the host's warm shared Ray by default, or one
    started for the task with ``RAYBATCH_LOCAL_RAY=per-task``; everything works on a laptop. Otherwise the host is a Ray cluster's dashboard / Jobs API
    address (``http(s)://head:8265``) and pipelines run there as Ray Jobs. The password, if set,
    is the cluster's auth token (sent as ``Authorization: Bearer``); the extras are declared in
    ``get_provider_info`` (``conn-fields``).

    The Jobs API methods come in pairs: ``name`` for the worker and ``aname`` for async code (the
    trigger), as ``get_connection`` / ``aget_connection``. Each call (a whole wait included) uses
    one HTTP session; each request in it times out, and is retried while the Jobs API is
    unavailable (refused or reset connections, timeouts, 502/503/504, a 500 "try again later"),
    for up to the connection's ``outage_timeout`` (600 s by default). They raise
    :class:`RayJobsError` when the cluster refuses a request, stays unreachable past that bound
    (:class:`~airflow_provider_raybatch.hooks.jobs_types.JobsApiUnavailable`), or the connection
    names no cluster.

    :param ray_conn_id: the ``ray`` connection to use; None for the embedded local Ray.
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = "ray"
    hook_name = "Ray"

    if not AIRFLOW_V_3_2_PLUS:

        @classmethod
        def get_ui_field_behaviour(cls) -> dict[str, Any]:
            """The connection form on Airflow 3.1, which reads it here (3.2+: the provider info)."""
            from airflow_provider_raybatch.get_provider_info import ray_field_behaviour

            return ray_field_behaviour(named_extras=False)

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
        """:attr:`cluster`, for async code (triggers); read once, then kept."""
        if "cluster" not in self.__dict__:
            try:
                conn = None if self.ray_conn_id is None else await self.aget_connection(self.ray_conn_id)
            except AirflowNotFoundException:
                conn = None
            self.__dict__["cluster"] = None if conn is None else cluster_settings(conn)
        return self.cluster

    def _settings(self) -> RayClusterSettings:
        if self.cluster is None:
            raise RayJobsError(f"connection {self.ray_conn_id!r} names no Ray cluster (missing, or no host)")
        return self.cluster

    def get_conn(self) -> RayJobsClient:
        """A Jobs API client for the cluster; open it with ``async with``."""
        from airflow_provider_raybatch.hooks.jobs_client import RayJobsClient

        return RayJobsClient(self._settings(), self.log)

    @asynccontextmanager
    async def _client(self) -> AsyncIterator[RayJobsClient]:
        from airflow_provider_raybatch.hooks.jobs_client import RayJobsClient

        await self.acluster()
        async with RayJobsClient(self._settings(), self.log) as client:
            yield client

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run an async twin from sync code (the worker, ``on_kill``)."""
        from airflow_provider_raybatch.hooks.jobs_client import run_sync

        try:
            # Read the connection in the caller's thread, not through aget_connection on the
            # helper thread's own event loop.
            self._settings()
        except BaseException:
            coroutine.close()
            raise
        return run_sync(coroutine)

    def submit_or_attach(
        self,
        submission_id_prefix: str,
        entrypoint: Callable[[str], str],
        *,
        metadata: dict[str, str] | None = None,
        start_attempt: int = 0,
        on_submit: Callable[[int], None] | None = None,
    ) -> JobInfo:
        """Find the job of a chain of submission ids that is live or succeeded, or submit the next.

        The ids are ``<prefix>-0, -1, ...``, one per attempt; a new id is used only after the job
        of the previous one ended without success. Each id is computed before it is submitted,
        so a caller that died right after submitting finds its job again from the same prefix:
        never two live jobs for one chain.

        :param submission_id_prefix: the chain's prefix, the same for every try of the work.
        :param entrypoint: the job's command line for a submission id.
        :param metadata: the job's metadata (shown in the dashboard); no secrets.
        :param start_attempt: where to start looking (the last attempt the caller recorded);
            walking on from it also finds jobs whose submission was never recorded.
        :param on_submit: called with the attempt number just before submitting it, for the
            caller to record.
        :return: a PENDING or RUNNING job (reattached, or just submitted), or a SUCCEEDED one
            (its result is there to take).
        """
        return self._run(
            self.asubmit_or_attach(
                submission_id_prefix, entrypoint, metadata=metadata, start_attempt=start_attempt, on_submit=on_submit
            )
        )

    async def asubmit_or_attach(
        self,
        submission_id_prefix: str,
        entrypoint: Callable[[str], str],
        *,
        metadata: dict[str, str] | None = None,
        start_attempt: int = 0,
        on_submit: Callable[[int], None] | None = None,
    ) -> JobInfo:
        """:meth:`submit_or_attach`, for async code."""
        attempt = start_attempt
        async with self._client() as client:
            while True:
                submission_id = f"{submission_id_prefix}-{attempt}"
                info = await client.get_job(submission_id)
                if info is None:
                    if on_submit is not None:
                        on_submit(attempt)
                    try:
                        await client.submit(submission_id, entrypoint(submission_id), metadata or {})
                    except JobAlreadyExists:
                        continue  # submitted meanwhile by another process of the same work: look again
                    self.log.info("Submitted Ray job %s to %s", submission_id, client.address)
                    return JobInfo(submission_id, JobStatus.PENDING)
                if info.is_active:
                    self.log.info("Reattaching to Ray job %s (%s)", submission_id, info.status.value)
                    return info
                if info.is_successful:
                    self.log.info("Ray job %s already succeeded: taking its result", submission_id)
                    return info
                self.log.info(
                    "Ray job %s ended %s: the next job resumes from its committed ranges",
                    submission_id,
                    info.status.value,
                )
                attempt += 1

    def get_job_info(self, submission_id: str) -> JobInfo | None:
        """The job's status and message; None if there is no such job."""
        return self._run(self.aget_job_info(submission_id))

    async def aget_job_info(self, submission_id: str) -> JobInfo | None:
        """:meth:`get_job_info`, for async code."""
        async with self._client() as client:
            return await client.get_job(submission_id)

    def stop_job(self, submission_id: str) -> bool:
        """Stop the job (SIGTERM, then SIGKILL; it and its log stay inspectable); False if it had ended."""
        return self._run(self.astop_job(submission_id))

    async def astop_job(self, submission_id: str) -> bool:
        """:meth:`stop_job`, for async code."""
        async with self._client() as client:
            stopped = await client.stop(submission_id)
        if stopped:
            self.log.info("Stopped Ray job %s", submission_id)
        return stopped

    def wait_for_job(
        self,
        submission_id: str,
        *,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        log_line: Callable[[str], None] | None = None,
    ) -> JobInfo:
        """Wait until the job ends, passing each line of its log to ``log_line`` as it comes.

        :param poll_interval: seconds between status checks.
        :param deadline: a Unix time; past it, :class:`JobDeadlineExceeded` is raised and the job
            is left running (the caller decides whether to stop it).
        :param log_line: called with each log line; None: the log is not read.
        :return: the ended job.
        """
        return self._run(
            self.await_for_job(submission_id, poll_interval=poll_interval, deadline=deadline, log_line=log_line)
        )

    async def await_for_job(
        self,
        submission_id: str,
        *,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        log_line: Callable[[str], None] | None = None,
    ) -> JobInfo:
        """:meth:`wait_for_job`, for async code (the trigger)."""
        async with self._client() as client:
            return await client.wait(submission_id, poll_interval=poll_interval, deadline=deadline, log_line=log_line)

    def test_connection(self) -> tuple[bool, str]:
        """Reach the cluster and report its Ray version and resources (the UI's Test button)."""
        from airflow_provider_raybatch.hooks.jobs_client import RayJobsClient, run_sync

        try:
            # The UI waits on this answer: a shorter timeout than the jobs' calls, and no retry.
            client = RayJobsClient(replace(self._settings(), timeout_s=TEST_TIMEOUT_S, outage_timeout_s=0))
            version, nodes = run_sync(_describe(client))
        except (RayJobsError, ConfigError) as e:
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
    async with client:
        return await client.version(), await client.nodes()
