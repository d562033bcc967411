"""RayJobTrigger driven directly against a real Ray cluster."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from airflow_provider_raybatch.hooks.jobs_client import RayJobsClient
from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.triggers.ray_job import RayJobTrigger
from tests.ray_cluster import connection

CONN_ID = "ray_trigger_test"


@pytest.fixture
def client(ray_cluster, monkeypatch) -> RayJobsClient:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection(ray_cluster))
    return RayJobsClient(RayHook(CONN_ID).cluster)


async def submit(client: RayJobsClient, script: str) -> str:
    submission_id = f"trigger-test-{uuid.uuid4().hex[:8]}"
    await client.submit(submission_id, f"python -c {script!r}", {})
    return submission_id


async def wait_until(client: RayJobsClient, submission_id: str, statuses: tuple[str, ...]) -> str:
    for _ in range(120):
        status = (await client.get_job(submission_id)).status
        if status in statuses:
            return status
        await asyncio.sleep(0.5)
    return status


def test_serialize_round_trip():
    trigger = RayJobTrigger(ray_conn_id="c", submission_id="s", poll_interval=2.0, deadline=123.0)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_raybatch.triggers.ray_job.RayJobTrigger"
    assert RayJobTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_the_trigger_streams_the_job_s_log_and_fires_its_status(client, capfd):
    async def scenario():
        sid = await submit(client, "print('first line'); print('second line')")
        trigger = RayJobTrigger(ray_conn_id=CONN_ID, submission_id=sid, poll_interval=0.5)
        return sid, [event async for event in trigger.run()]

    sid, events = asyncio.run(scenario())
    assert [e.payload["status"] for e in events] == ["SUCCEEDED"] and events[0].payload["submission_id"] == sid
    logged = capfd.readouterr().out  # Airflow's structlog writes the trigger's log lines here
    assert logged.index("[ray job] first line") < logged.index("[ray job] second line")


def test_past_the_deadline_the_job_is_stopped_and_the_task_times_out(client):
    async def scenario():
        sid = await submit(client, "import time; time.sleep(120)")
        await wait_until(client, sid, ("RUNNING",))
        trigger = RayJobTrigger(ray_conn_id=CONN_ID, submission_id=sid, poll_interval=0.5, deadline=time.time() + 2)
        events = [event async for event in trigger.run()]
        return events, await wait_until(client, sid, ("STOPPED",))

    events, status = asyncio.run(scenario())
    assert events[0].payload["status"] == "TIMEOUT" and status == "STOPPED"


def test_on_kill_stops_the_job_and_cleanup_does_not(client):
    async def scenario():
        sid = await submit(client, "import time; time.sleep(120)")
        await wait_until(client, sid, ("RUNNING",))
        trigger = RayJobTrigger(ray_conn_id=CONN_ID, submission_id=sid)
        await trigger.cleanup()  # a triggerer restart or a move: the job must survive it
        await asyncio.sleep(1)
        after_cleanup = (await client.get_job(sid)).status
        await trigger.on_kill()  # the user marked the deferred task failed
        return after_cleanup, await wait_until(client, sid, ("STOPPED",))

    assert asyncio.run(scenario()) == ("RUNNING", "STOPPED")
