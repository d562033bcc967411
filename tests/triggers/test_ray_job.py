"""RayJobTrigger driven directly against a real Ray cluster."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.triggers.ray_job import RayJobTrigger
from tests.support.ray_cluster import connection

CONN_ID = "ray_trigger_test"


@pytest.fixture
def hook(ray_cluster, monkeypatch) -> RayHook:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection(ray_cluster))
    return RayHook(CONN_ID)


async def submit(hook: RayHook, script: str) -> str:
    info = await hook.asubmit_or_attach(f"trigger-test-{uuid.uuid4().hex[:8]}", lambda _: f"python -c {script!r}")
    return info.submission_id


async def wait_until(hook: RayHook, submission_id: str, statuses: tuple[str, ...]) -> str:
    for _ in range(120):
        status = (await hook.aget_job_info(submission_id)).status
        if status in statuses:
            return status
        await asyncio.sleep(0.5)
    return status


def test_serialize_round_trip():
    trigger = RayJobTrigger(ray_conn_id="c", submission_id="s", poll_interval=2.0, deadline=123.0)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_raybatch.triggers.ray_job.RayJobTrigger"
    assert RayJobTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_the_trigger_streams_the_job_s_log_and_fires_its_status(hook, capfd):
    async def scenario():
        sid = await submit(hook, "print('first line'); print('second line')")
        trigger = RayJobTrigger(ray_conn_id=CONN_ID, submission_id=sid, poll_interval=0.5)
        return sid, [event async for event in trigger.run()]

    sid, events = asyncio.run(scenario())
    assert [(e.payload["outcome"], e.payload["status"]) for e in events] == [("ended", "SUCCEEDED")] and events[
        0
    ].payload["submission_id"] == sid
    logged = capfd.readouterr().out  # Airflow's structlog writes the trigger's log lines here
    assert logged.index("[ray job] first line") < logged.index("[ray job] second line")


def test_past_the_deadline_the_job_is_stopped_and_the_task_times_out(hook):
    async def scenario():
        sid = await submit(hook, "import time; time.sleep(120)")
        await wait_until(hook, sid, ("RUNNING",))
        trigger = RayJobTrigger(ray_conn_id=CONN_ID, submission_id=sid, poll_interval=0.5, deadline=time.time() + 2)
        events = [event async for event in trigger.run()]
        return events, await wait_until(hook, sid, ("STOPPED",))

    events, status = asyncio.run(scenario())
    assert (events[0].payload["outcome"], events[0].payload["status"], status) == ("timeout", None, "STOPPED")
    assert events[0].payload["message"].endswith("at the task's deadline; the job was stopped")


def test_a_connection_that_names_no_cluster_fires_an_error():
    async def scenario():
        return [event async for event in RayJobTrigger(ray_conn_id="ray_gone", submission_id="s").run()]

    (event,) = asyncio.run(scenario())
    assert (event.payload["outcome"], event.payload["status"]) == (
        "error",
        None,
    ) and "'ray_gone' names no Ray cluster" in event.payload["message"]


def test_on_kill_stops_the_job_and_cleanup_does_not(hook):
    async def scenario():
        sid = await submit(hook, "import time; time.sleep(120)")
        await wait_until(hook, sid, ("RUNNING",))
        trigger = RayJobTrigger(ray_conn_id=CONN_ID, submission_id=sid)
        await trigger.cleanup()  # a triggerer restart or a move: the job must survive it
        await asyncio.sleep(1)
        after_cleanup = (await hook.aget_job_info(sid)).status
        await trigger.on_kill()  # the user marked the deferred task failed
        return after_cleanup, await wait_until(hook, sid, ("STOPPED",))

    assert asyncio.run(scenario()) == ("RUNNING", "STOPPED")
