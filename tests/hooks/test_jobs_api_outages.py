"""Every Jobs API call rides out an outage of the API shorter than the connection's outage_timeout,
and fails past it: each call the worker, the trigger and the operator make, under each kind of
outage, against a real `ray start --head` cluster behind a proxy that makes the outages."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import pytest

from airflow_provider_raybatch.hooks.jobs_client import RayJobsClient, run_sync
from airflow_provider_raybatch.hooks.jobs_types import JobAlreadyExists, JobsApiUnavailable, JobStatus, RayJobsError
from airflow_provider_raybatch.hooks.ray_connection import RayClusterSettings
from tests.support.outage_proxy import KINDS, OutageProxy

#: The outage_timeout of these tests' connection, and an outage that ends well within it.
BOUND_S = 2.0
SHORT_S = 0.8


@pytest.fixture(scope="module")
def proxy(ray_cluster):
    with OutageProxy(ray_cluster.dashboard_port) as proxy:
        yield proxy


#: A request's timeout in these tests: a submit can take seconds on a busy machine.
TIMEOUT_S = 5.0


def settings(
    ray_cluster, proxy: OutageProxy, outage_timeout_s: float = BOUND_S, timeout_s: float = TIMEOUT_S
) -> RayClusterSettings:
    return RayClusterSettings(
        proxy.url,
        headers={"Authorization": f"Bearer {ray_cluster.token}"},
        timeout_s=timeout_s,
        outage_timeout_s=outage_timeout_s,
    )


def sleeper(seconds: float) -> str:
    return f"python -c 'import time; time.sleep({seconds})'"


async def submit(client: RayJobsClient, sid: str, entrypoint: str) -> None:
    """Submit; a submit whose answer timed out although it landed is found again when retried (the
    hook's submit_or_attach then attaches to the job: the id is this test's own)."""
    with contextlib.suppress(JobAlreadyExists):
        await client.submit(sid, entrypoint, {})


async def submitted(client: RayJobsClient, entrypoint: str) -> str:
    sid = f"outage-{uuid.uuid4().hex[:10]}"
    await submit(client, sid, entrypoint)
    return sid


async def running(client: RayJobsClient, sid: str) -> None:
    for _ in range(240):
        if (await client.get_job(sid)).status is JobStatus.RUNNING:
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"job {sid} never ran")


# Each call of the provider, as (what it does before the outage, the call under the outage, its check).
Call = Callable[[RayJobsClient, str], Awaitable[object]]


async def _submit(client: RayJobsClient, sid: str) -> object:
    new = f"{sid}-new"
    await submit(client, new, sleeper(0))
    return new


async def _get(client: RayJobsClient, sid: str) -> object:
    return (await client.get_job(sid)).submission_id


async def _stop(client: RayJobsClient, sid: str) -> object:
    return await client.stop(sid)


CALLS: dict[str, tuple[Call, Callable[[object, str], bool]]] = {
    "submit": (_submit, lambda new, sid: new == f"{sid}-new"),
    "get_job": (_get, lambda got, sid: got == sid),
    "stop": (_stop, lambda stopped, sid: stopped is True),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("call", list(CALLS))
def test_each_call_rides_out_an_outage_shorter_than_the_bound_and_fails_after_a_longer_one(
    ray_cluster, proxy, call, kind, caplog
):
    do, check = CALLS[call]
    # Unanswered requests must time out within the bound, and the short outage outlast one of them.
    timeout_s, short_s = (1.0, 1.2) if kind == "timeout" else (TIMEOUT_S, SHORT_S)
    client = RayJobsClient(settings(ray_cluster, proxy, timeout_s=timeout_s), logging.getLogger("outage-test"))

    async def scenario() -> tuple[object, float, BaseException | None, str]:
        # The job the call is about, submitted without an outage (or a bound that a slow submit could reach).
        async with RayJobsClient(settings(ray_cluster, proxy, outage_timeout_s=60)) as setup:
            sid = await submitted(setup, sleeper(120 if call == "stop" else 0))
            if call == "stop":
                await running(setup, sid)
        async with client:
            # Shorter than the bound: the call succeeds once the API is back.
            proxy.start_outage(kind)
            asyncio.get_running_loop().call_later(short_s, proxy.end_outage)
            answer = await do(client, sid)
            # Longer than the bound: the call fails, naming it, after about the bound.
            proxy.start_outage(kind)
            started = time.monotonic()
            try:
                await do(client, f"{sid}-again" if call == "submit" else sid)
                error = None
            except RayJobsError as e:
                error = e
            finally:
                proxy.end_outage()
            return answer, time.monotonic() - started, error, sid

    faults_before = proxy.faults[kind]
    with caplog.at_level(logging.INFO, logger="outage-test"):
        answer, lasted, error, sid = run_sync(scenario())
    assert proxy.faults[kind] > faults_before + 1, "the outage never met the call"
    assert check(answer, sid), answer
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and all("The Ray Jobs API is unavailable" in w for w in warnings), warnings
    assert any("answers again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert isinstance(error, JobsApiUnavailable), error
    assert f"past the connection's outage_timeout of {BOUND_S:g} s" in str(error)
    assert BOUND_S <= lasted < BOUND_S + 3
    if call == "stop":
        assert run_sync(_stopped(client, sid))


async def _stopped(client: RayJobsClient, sid: str) -> bool:
    async with client:
        for _ in range(120):
            if (await client.get_job(sid)).status is JobStatus.STOPPED:
                return True
            await asyncio.sleep(0.25)
    return False


def test_an_error_that_retrying_cannot_fix_fails_at_once(ray_cluster, proxy):
    client = RayJobsClient(settings(ray_cluster, proxy))

    async def scenario() -> float:
        async with client:
            started = time.monotonic()
            with proxy.outage("fatal"), pytest.raises(RayJobsError, match="answered 500: Unexpected error") as error:
                await client.get_job("any")
            assert not isinstance(error.value, JobsApiUnavailable)
            return time.monotonic() - started

    assert run_sync(scenario()) < 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_wait_follows_its_job_across_an_outage_and_passes_every_log_line_once(ray_cluster, proxy, kind, tmp_path):
    script = tmp_path / "count.py"
    script.write_text("import time\nfor i in range(30):\n    print(f'line {i}', flush=True)\n    time.sleep(0.1)\n")
    client = RayJobsClient(settings(ray_cluster, proxy))
    lines: list[str] = []

    async def scenario():
        async with client:
            sid = await submitted(client, f"python {script}")
            await running(client, sid)
            # The outage starts while the job writes its log (the stream is cut) and outlasts a poll.
            proxy.outage_after(0.3, kind, 2 * SHORT_S)
            return await client.wait(sid, poll_interval=0.3, log_line=lines.append)

    faults_before = proxy.faults[kind]
    info = run_sync(scenario())
    assert proxy.faults[kind] > faults_before
    assert info.status is JobStatus.SUCCEEDED
    numbered = [line for line in lines if line.startswith("line ")]
    assert numbered == [f"line {i}" for i in range(30)], lines
