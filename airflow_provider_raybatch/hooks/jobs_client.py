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
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

import aiohttp

from airflow_provider_raybatch.hooks.jobs_types import (
    JobAlreadyExists,
    JobDeadlineExceeded,
    JobInfo,
    JobsApiUnavailable,
    JobStatus,
    RayJobsError,
)
from airflow_provider_raybatch.hooks.ray_connection import RayClusterSettings

T = TypeVar("T")


class RayJobsClient:
    """One method per Jobs API call used by the provider; each request times out, and each call
    rides out an outage of the API for up to the settings' ``outage_timeout_s``.

    Open it with ``async with``: the requests made inside share one HTTP session (and its
    connections), closed on leaving.
    """

    def __init__(self, settings: RayClusterSettings, log: logging.Logger | None = None):
        self.settings = settings
        #: where outages are reported (the hook passes its own logger: the task's or the trigger's log)
        self.log = log or logging.getLogger(__name__)
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
        """One call, retried while the API is unavailable, for up to the settings' ``outage_timeout_s``.

        Retrying a POST is safe here: a submit names its submission id (a submit whose reply was
        lost answers "already exists" when retried, and the caller finds its job), and a stop of a
        stopped job answers that it had ended.
        """
        outage = _Outage(self, f"{method} {path}")
        while True:
            attempted = time.monotonic()
            try:
                answer = await self._attempt(method, path, **kwargs)
            except JobsApiUnavailable as e:
                await outage.failed(e, attempted)
                continue
            outage.recovered()
            return answer

    async def _attempt(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
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
            raise JobsApiUnavailable(f"cannot reach the Ray Jobs API at {self.address}: {e.os_error or e}") from e
        except TimeoutError as e:
            raise JobsApiUnavailable(
                f"no answer from the Ray Jobs API at {self.address} within {self.settings.timeout_s:g}s"
            ) from e
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            # A reset or a connection closed mid-answer: a dashboard restarting, a proxy in between.
            raise JobsApiUnavailable(f"the Ray Jobs API at {self.address} dropped the connection: {e}") from e
        except aiohttp.ClientError as e:
            raise RayJobsError(f"request to the Ray Jobs API at {self.address} failed: {e}") from e
        if status in (401, 403):
            what = "missing" if status == 401 else "rejected"
            raise RayJobsError(
                f"the Ray cluster at {self.address} answered {status}: authentication {what}; "
                f"set the connection's auth token (password) or headers/cookies ({body.strip()[:200]})"
            )
        if status in _UNAVAILABLE or (status == 500 and "try again" in body.lower()):
            raise JobsApiUnavailable(f"{method} {path} on {self.address} answered {status}: {body.strip()[:300]}")
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
        """Ask Ray to stop the job (SIGTERM, then SIGKILL); False if it had already ended.

        Ray answers ``stopped`` as long as the job's supervisor lives, also once the job's status is final (seen in
        CI under load: a job stopped while pending read STOPPED, and a second stop 3 s later was answered
        ``stopped`` again). A final status answers first.
        """
        info = await self.get_job(submission_id)
        if info is None or info.is_terminal:
            return False
        answer = await self._json("POST", f"/api/jobs/{submission_id}/stop", ok=(200, 404))
        return bool(answer and answer.get("stopped"))

    async def tail_logs(self, submission_id: str) -> AsyncIterator[str]:
        """The job's log as it is written (from its start), until the job ends or the stream breaks.

        A stream cut without a word (a dashboard restarting) ends as if the job had ended: aiohttp
        reports both as a normal close; ask the job's status to tell them apart.

        :raises JobsApiUnavailable: the stream could not be opened, or was reset.
        """
        try:
            async with self.session.ws_connect(
                f"{self.address}/api/jobs/{submission_id}/logs/tail",
                ssl=self.settings.verify,
                # Pings: a stream whose peer vanished without a word (a head pod gone) is noticed.
                heartbeat=_LOG_HEARTBEAT_S,
            ) as ws:
                async for message in ws:
                    if message.type == aiohttp.WSMsgType.TEXT:
                        yield message.data
                    elif message.type == aiohttp.WSMsgType.ERROR:
                        raise JobsApiUnavailable(f"the log stream broke: {ws.exception()}")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise JobsApiUnavailable(f"the log stream broke: {e or type(e).__name__}") from e

    async def wait(
        self,
        submission_id: str,
        *,
        poll_interval: float,
        deadline: float | None = None,
        log_line: Callable[[str], None] | None = None,
    ) -> JobInfo:
        """Poll until the job ends, passing each of its log lines to ``log_line`` meanwhile.

        Each poll rides out an outage of the Jobs API (see :meth:`_request`), and the log stream
        reconnects where it broke; only an outage longer than ``outage_timeout_s`` ends the wait,
        with :class:`JobsApiUnavailable` (the job may still run: the caller decides).

        :param poll_interval: seconds between status checks.
        :param deadline: a Unix time; past it, :class:`JobDeadlineExceeded` is raised (the job is
            left running: the caller decides whether to stop it).
        :param log_line: called with each line of the job's log; None: the log is not read.
        """
        logs = asyncio.create_task(self._pump_logs(submission_id, log_line)) if log_line else None
        try:
            while True:
                info = await self._poll(submission_id, deadline)
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

    async def _poll(self, submission_id: str, deadline: float | None) -> JobInfo | None:
        """:meth:`get_job`, given up at the deadline even while it rides out an outage."""
        if deadline is None:
            return await self.get_job(submission_id)
        try:
            return await asyncio.wait_for(self.get_job(submission_id), timeout=max(deadline - time.time(), 0.1))
        except TimeoutError:
            raise JobDeadlineExceeded(
                f"Ray job {submission_id} was still running, as far as the unavailable Jobs API last said, "
                "at the task's deadline"
            ) from None

    async def _pump_logs(self, submission_id: str, log_line: Callable[[str], None]) -> None:
        """Pass the job's log on line by line; a stream that breaks is opened again until the job ends.

        A new stream starts from the log's beginning again: the characters already passed on are
        skipped, so no line is lost or repeated. Runs until a stream ends with the job ended (the
        dashboard closes it then), or the wait cancels it.
        """
        pending, delivered, broken = "", 0, 0
        while True:
            skip = delivered
            try:
                async for chunk in self.tail_logs(submission_id):
                    if skip >= len(chunk):
                        skip -= len(chunk)
                        continue
                    chunk, skip = chunk[skip:], 0
                    delivered += len(chunk)
                    if broken:
                        self.log.info("The log stream of Ray job %s is back", submission_id)
                        broken = 0
                    pending += chunk
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        log_line(line)
                info = await self.get_job(submission_id)
                if info is None or info.is_terminal:
                    break
                raise JobsApiUnavailable(f"the log stream ended while the job is {info.status.value}")
            except JobsApiUnavailable as e:
                if not broken:
                    self.log.warning("The log stream of Ray job %s broke (%s): reconnecting", submission_id, e)
                broken += 1
                await asyncio.sleep(min(0.5 * 2.0 ** (broken - 1), _MAX_BACKOFF_S))
        if pending:
            log_line(pending)


#: Statuses of a gateway, an ingress or a restarting dashboard while the API is briefly away.
_UNAVAILABLE = (502, 503, 504)
#: The longest pause between two attempts while the API is unavailable.
_MAX_BACKOFF_S = 15.0
#: Seconds between pings on a log stream (no pong within half of it: the stream is reopened).
_LOG_HEARTBEAT_S = 30.0
#: While an outage lasts, it is logged again this often (seconds).
_OUTAGE_LOG_EVERY_S = 60.0


class _Outage:
    """How long the Jobs API has been unavailable to one call: backs off, logs, and gives up past the bound."""

    def __init__(self, client: RayJobsClient, call: str):
        self.client, self.call = client, call
        self.started: float | None = None
        self.attempts = 0
        self.logged = 0.0

    async def failed(self, error: JobsApiUnavailable, attempted: float) -> None:
        """Sleep before the next attempt, or raise once the outage has lasted ``outage_timeout_s``.

        :param attempted: when the failed attempt began (``time.monotonic()``): an outage counts
            from its first failed attempt's start, so an attempt that timed out counts in full.
        """
        now = time.monotonic()
        if self.started is None:
            self.started = attempted
        bound = self.client.settings.outage_timeout_s
        lasted = now - self.started
        if lasted >= bound:
            if bound == 0:
                raise error
            raise JobsApiUnavailable(
                f"{error} (unavailable for {lasted:.0f} s, past the connection's outage_timeout of {bound:g} s)"
            ) from error
        if self.attempts == 0 or now - self.logged >= _OUTAGE_LOG_EVERY_S:
            self.client.log.warning(
                "The Ray Jobs API is unavailable (%s): retrying %s for up to %g s more (outage_timeout)",
                error,
                self.call,
                bound - lasted,
            )
            self.logged = now
        self.attempts += 1
        await asyncio.sleep(min(0.5 * 2.0 ** (self.attempts - 1), _MAX_BACKOFF_S, max(bound - lasted, 0.0)))

    def recovered(self) -> None:
        if self.started is not None:
            self.client.log.info(
                "The Ray Jobs API at %s answers again (%s, after %.0f s and %d retries)",
                self.client.address,
                self.call,
                time.monotonic() - self.started,
                self.attempts,
            )


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
