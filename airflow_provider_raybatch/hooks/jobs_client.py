"""A small async client of the Ray Jobs REST API (the dashboard, ``http(s)://head:8265``).

Written on aiohttp rather than Ray's ``JobSubmissionClient`` because that client makes blocking
calls without timeouts: a trigger must not block the triggerer's event loop, and an unreachable
address must fail in seconds. Use it through :class:`~airflow_provider_raybatch.hooks.ray.RayHook`;
the worker runs the same coroutines through :func:`run_sync`. No Airflow import here, and nothing
imports this module until a cluster is used: it is the only one that loads aiohttp.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

import aiohttp

from airflow_provider_raybatch.hooks.jobs_types import JobInfo, JobStatus
from airflow_provider_raybatch.hooks.ray_connection import RayClusterSettings
from airflow_provider_raybatch.pipeline.errors import JobAlreadyExists, JobDeadlineExceeded, RayJobsError

T = TypeVar("T")


class RayJobsClient:
    """One method per Jobs API call used by the provider; each request times out.

    Open it with ``async with``: the requests made inside share one HTTP session (and its
    connections), closed on leaving.
    """

    def __init__(self, settings: RayClusterSettings):
        self.settings = settings
        self.address = settings.address.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RayJobsClient:
        self._session = aiohttp.ClientSession(
            headers=self.settings.headers,
            cookies=self.settings.cookies,
            # No overall limit by default: a log stream lives as long as its job. Each request
            # passes its own total timeout (_request).
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.settings.timeout_s),
        )
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("RayJobsClient is used outside `async with`")
        return self._session

    async def _request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        url = f"{self.address}{path}"
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
        try:
            async with self.session.request(
                method, url, ssl=self.settings.verify, timeout=timeout, **kwargs
            ) as response:
                body = await response.text()
                status = response.status
        except aiohttp.ClientConnectorCertificateError as e:
            raise RayJobsError(
                f"TLS certificate of {self.address} could not be verified ({e.certificate_error}); "
                "fix the certificate or set verify=false in the connection"
            ) from e
        except aiohttp.ClientSSLError as e:
            raise RayJobsError(f"TLS handshake with {self.address} failed: {e}") from e
        except aiohttp.ClientConnectorError as e:
            raise RayJobsError(f"cannot reach the Ray Jobs API at {self.address}: {e.os_error or e}") from e
        except TimeoutError as e:
            raise RayJobsError(
                f"no answer from the Ray Jobs API at {self.address} within {self.settings.timeout_s:g}s"
            ) from e
        except aiohttp.ClientError as e:
            raise RayJobsError(f"request to the Ray Jobs API at {self.address} failed: {e}") from e
        if status in (401, 403):
            what = "missing" if status == 401 else "rejected"
            raise RayJobsError(
                f"the Ray cluster at {self.address} answered {status}: authentication {what}; "
                f"set the connection's auth token (password) or headers/cookies ({body.strip()[:200]})"
            )
        return status, body

    async def _json(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kwargs: Any) -> Any:
        status, body = await self._request(method, path, **kwargs)
        if status not in ok:
            raise RayJobsError(f"{method} {path} on {self.address} answered {status}: {body.strip()[:500]}")
        try:
            return json.loads(body) if status == 200 else None
        except ValueError as e:
            raise RayJobsError(
                f"{self.address} did not answer like a Ray dashboard ({method} {path} returned {body[:100]!r}); "
                "check the address and port (the dashboard, usually 8265)"
            ) from e

    async def version(self) -> str:
        return (await self._json("GET", "/api/version"))["ray_version"]

    async def nodes(self) -> list[dict[str, Any]]:
        """The cluster's alive nodes, each with ``resources_total``."""
        answer = await self._json("GET", "/api/v0/nodes", params={"detail": "1", "limit": "10000"})
        return [n for n in answer["data"]["result"]["result"] if n.get("state") == "ALIVE"]

    async def get_job(self, submission_id: str) -> JobInfo | None:
        job = await self._json("GET", f"/api/jobs/{submission_id}", ok=(200, 404))
        if job is None:
            return None
        return JobInfo(
            submission_id=submission_id,
            status=JobStatus(job["status"]),
            message=job.get("message") or "",
            driver_exit_code=job.get("driver_exit_code"),
        )

    async def submit(self, submission_id: str, entrypoint: str, metadata: dict[str, str]) -> None:
        """Submit a job with the connection's runtime_env and driver resources.

        :raises JobAlreadyExists: a job with this submission id exists.
        """
        s = self.settings
        request: dict[str, Any] = {
            "submission_id": submission_id,
            "entrypoint": entrypoint,
            "metadata": metadata,
            "runtime_env": s.runtime_env or None,
            "entrypoint_num_cpus": s.entrypoint_num_cpus,
            "entrypoint_num_gpus": s.entrypoint_num_gpus,
            "entrypoint_memory": s.entrypoint_memory,
        }
        status, body = await self._request("POST", "/api/jobs/", json={k: v for k, v in request.items() if v})
        if status != 200:
            # Ray answers a reused id with a 500 whose text says so: there is no typed error.
            if "already exists" in body:
                raise JobAlreadyExists(submission_id)
            raise RayJobsError(f"submitting Ray job {submission_id} failed with {status}: {body.strip()[-500:]}")

    async def stop(self, submission_id: str) -> bool:
        """Ask Ray to stop the job (SIGTERM, then SIGKILL); False if it had already ended."""
        answer = await self._json("POST", f"/api/jobs/{submission_id}/stop", ok=(200, 404))
        return bool(answer and answer.get("stopped"))

    async def tail_logs(self, submission_id: str) -> AsyncIterator[str]:
        """The job's log as it is written (from its start), until the job ends."""
        async with self.session.ws_connect(
            f"{self.address}/api/jobs/{submission_id}/logs/tail", ssl=self.settings.verify
        ) as ws:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    yield message.data
                elif message.type == aiohttp.WSMsgType.ERROR:
                    break

    async def wait(
        self,
        submission_id: str,
        *,
        poll_interval: float,
        deadline: float | None = None,
        log_line: Callable[[str], None] | None = None,
    ) -> JobInfo:
        """Poll until the job ends, passing each of its log lines to ``log_line`` meanwhile.

        :param poll_interval: seconds between status checks.
        :param deadline: a Unix time; past it, :class:`JobDeadlineExceeded` is raised (the job is
            left running: the caller decides whether to stop it).
        :param log_line: called with each line of the job's log; None: the log is not read.
        """
        logs = asyncio.create_task(self._pump_logs(submission_id, log_line)) if log_line else None
        try:
            while True:
                info = await self.get_job(submission_id)
                if info is None:
                    raise RayJobsError(f"Ray job {submission_id} does not exist on {self.address} (was it deleted?)")
                if info.is_terminal:
                    if logs is not None:
                        # The log stream ends with the job: let it deliver its last lines.
                        await asyncio.wait({logs}, timeout=5)
                    return info
                if deadline is not None and time.time() >= deadline:
                    raise JobDeadlineExceeded(
                        f"Ray job {submission_id} is still {info.status.value} at the task's deadline"
                    )
                await asyncio.sleep(poll_interval if deadline is None else min(poll_interval, deadline - time.time()))
        finally:
            if logs is not None:
                logs.cancel()

    async def _pump_logs(self, submission_id: str, log_line: Callable[[str], None]) -> None:
        pending = ""
        try:
            async for chunk in self.tail_logs(submission_id):
                pending += chunk
                *lines, pending = pending.split("\n")
                for line in lines:
                    log_line(line)
        except (aiohttp.ClientError, TimeoutError) as e:
            # Losing the log stream must not fail the task: the status poll decides the outcome.
            log_line(f"(log stream of Ray job {submission_id} interrupted: {e})")
        if pending:
            log_line(pending)


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, on a loop in a daemon thread.

    A thread, because the caller may be inside a running loop already (``on_kill`` runs in a
    signal handler while a wait runs); a daemon, so that a timeout or kill raised in the waiting
    thread is not held up by the coroutine.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=target, name="ray-jobs-client", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
