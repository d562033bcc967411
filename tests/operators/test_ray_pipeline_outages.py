"""The operator on a real Ray cluster whose Jobs API goes away while the task's job runs (a proxy in
front of the dashboard makes the outage): a short outage costs nothing, in the worker and in the
triggerer; past the connection's outage_timeout the try fails, and the last try stops its job."""

from __future__ import annotations

import json
import threading
import time

import pytest

from airflow_provider_raybatch.hooks.ray import RayHook
from tests.conftest import run_dag
from tests.operators.test_ray_pipeline_on_cluster import jobs_of, wait_for_status
from tests.support.cluster_dags import CONN_ID, LOGICAL_DATE, cluster_dag
from tests.support.data import assert_exactly_once, read_output, write_input
from tests.support.outage_proxy import OutageProxy
from tests.support.ray_cluster import connection

pytestmark = pytest.mark.usefixtures("airflow_db")


@pytest.fixture
def proxy(ray_cluster):
    with OutageProxy(ray_cluster.dashboard_port) as proxy:
        yield proxy


def connect_through(proxy: OutageProxy, cluster, monkeypatch, outage_timeout: float) -> None:
    conn = json.loads(connection(cluster, outage_timeout=outage_timeout))
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({**conn, "host": proxy.url}))


def outage_once_running(cluster, proxy: OutageProxy, dag_id: str, kind: str, seconds: float, marker=None):
    """Once the task's job runs: an outage of ``kind`` for ``seconds``; then the job may finish (``marker`` removed)."""

    def run() -> None:
        deadline = time.monotonic() + 180
        while not any(j["status"] == "RUNNING" for j in jobs_of(cluster, dag_id).values()):
            if time.monotonic() > deadline:
                return
            time.sleep(0.3)
        with proxy.outage(kind):
            time.sleep(seconds)
        if marker is not None:
            marker.unlink()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def held_dag(tmp_path, dag_id: str, marker, **kwargs):
    """A run whose job waits while ``marker`` exists."""
    write_input(tmp_path / "in", [200])
    marker.touch()
    return cluster_dag(
        dag_id,
        input_path=str(tmp_path / "in"),
        output_path=str(tmp_path / "out"),
        rows_per_range=100,
        predictor="tests.support.predictors:WaitWhileMarked",
        predictor_kwargs={"marker": str(marker)},
        batch_size=50,
        **kwargs,
    )


@pytest.mark.parametrize(("deferrable", "kind"), [(False, "refused"), (True, "503")])
def test_an_outage_shorter_than_the_bound_does_not_fail_the_try(
    tmp_path, ray_cluster, proxy, monkeypatch, capfd, deferrable, kind
):
    connect_through(proxy, ray_cluster, monkeypatch, outage_timeout=60)
    dag_id = f"outage_{'deferred' if deferrable else 'worker'}"
    marker = tmp_path / "hold"
    dag = held_dag(tmp_path, dag_id, marker, deferrable=deferrable)
    outage = outage_once_running(ray_cluster, proxy, dag_id, kind, seconds=6, marker=marker)

    ti = run_dag(dag, LOGICAL_DATE).get_task_instance("score")
    outage.join()
    assert proxy.faults[kind] > 0
    assert ti.state == "success" and ti.xcom_pull(task_ids="score")["rows_out"] == 200
    assert len(jobs_of(ray_cluster, dag_id)) == 1
    log = capfd.readouterr().out
    assert "The Ray Jobs API is unavailable" in log and "answers again" in log, log[-3000:]
    assert_exactly_once(read_output(tmp_path / "out"), range(200))


@pytest.mark.parametrize(
    ("deferrable", "outage_s", "stopped"),
    # The API is back before the stop's own bound ends: the job is stopped. Or it stays away: the log says so.
    [(False, 5, True), (True, 5, True), (False, 12, False)],
)
def test_past_the_bound_the_last_try_fails_and_stops_its_job(
    tmp_path, ray_cluster, proxy, monkeypatch, capfd, deferrable, outage_s, stopped
):
    connect_through(proxy, ray_cluster, monkeypatch, outage_timeout=4)
    dag_id = f"outage_last_try_{int(deferrable)}_{outage_s}"
    dag = held_dag(tmp_path, dag_id, tmp_path / "hold", deferrable=deferrable, retries=0)
    outage = outage_once_running(ray_cluster, proxy, dag_id, "refused", seconds=outage_s)

    ti = run_dag(dag, LOGICAL_DATE).get_task_instance("score")
    outage.join()
    (sid,) = jobs_of(ray_cluster, dag_id)
    try:
        log = capfd.readouterr().out
        assert ti.state == "failed"
        assert "past the connection's outage_timeout of 4 s" in log, log[-3000:]
        if stopped:
            assert f"This is the task's last try: stopped its Ray job {sid}" in log
            assert wait_for_status(ray_cluster, sid, "STOPPED") == "STOPPED"
        else:
            assert f"This is the task's last try, and its Ray job {sid} could not be stopped" in log
            assert RayHook(CONN_ID).get_job_info(sid).status == "RUNNING"
    finally:
        (tmp_path / "hold").unlink(missing_ok=True)
        RayHook(CONN_ID).stop_job(sid)
