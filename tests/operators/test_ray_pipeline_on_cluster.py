"""The operators on a real Ray cluster (`ray start --head`) through the Jobs API, under dag.test()."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from airflow_provider_raybatch.hooks.jobs_client import run_sync
from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.pipeline.planning import footers
from airflow_provider_raybatch.pipeline.shards import plan_shards
from tests.conftest import REPO, run_dag
from tests.support.cluster_dags import CONN_ID, LOGICAL_DATE, cluster_dag, mapped_cluster_dag
from tests.support.data import assert_exactly_once, read_output, write_input
from tests.support.pipeline_runs import config
from tests.support.ray_cluster import connection

pytestmark = pytest.mark.usefixtures("airflow_db")


@pytest.fixture
def cluster(ray_cluster, monkeypatch):
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection(ray_cluster))
    return ray_cluster


def jobs_of(cluster, dag_id: str, task_id: str = "score") -> dict[str, dict]:
    """The cluster's jobs of the DAG's task, by submission id (from the Jobs API itself)."""
    request = urllib.request.Request(
        f"{cluster.dashboard}/api/jobs/", headers={"Authorization": f"Bearer {cluster.token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        jobs = json.load(response)
    prefix = f"raybatch-{dag_id}.{task_id}-"
    return {j["submission_id"]: j for j in jobs if (j.get("submission_id") or "").startswith(prefix)}


def start_task_process(tmp_path, **kwargs) -> subprocess.Popen:
    """Runs the DAG's task with dag.test() in a process of its own, so that it can be killed."""
    log = open(tmp_path / "task-process.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.cluster_dags", json.dumps(kwargs)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for_running_job(cluster, dag_id: str, process: subprocess.Popen, tmp_path) -> str:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        running = [sid for sid, j in jobs_of(cluster, dag_id).items() if j["status"] == "RUNNING"]
        if running:
            return running[0]
        assert process.poll() is None, (tmp_path / "task-process.log").read_text()[-3000:]
        time.sleep(0.5)
    raise AssertionError("the task never got a RUNNING job")


def wait_for_lease(output: str, submission_id: str, process: subprocess.Popen, tmp_path) -> None:
    """Until the Ray job ``submission_id`` holds the output's lease (a RUNNING job may not have taken it yet)."""
    from airflow_provider_raybatch.pipeline.status import OutputNotFoundError, read_status

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            lease = read_status(output).lease
        except OutputNotFoundError:
            lease = None
        if lease is not None and lease.live and lease.ray_job == submission_id:
            return
        assert process.poll() is None, (tmp_path / "task-process.log").read_text()[-3000:]
        time.sleep(0.5)
    raise AssertionError(f"the Ray job {submission_id} never held the lease of {output}")


def wait_for_status(cluster, submission_id: str, wanted: str) -> str:
    hook = RayHook(CONN_ID)
    deadline = time.monotonic() + 60
    status = None
    while time.monotonic() < deadline:
        status = hook.get_job_info(submission_id).status
        if status == wanted:
            break
        time.sleep(0.5)
    return status


def test_a_job_runs_on_the_cluster_streams_its_log_and_a_rerun_takes_its_result(tmp_path, cluster, capfd, monkeypatch):
    # Credentials of the task's storage connections (resolved by each provider) never travel with the job.
    from tests.support.storage_servers import service_account_key

    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_FAKE", json.dumps({"conn_type": "aws", "login": "AKIAFAKE", "password": "s3cr3t-value"})
    )
    gcp_key = service_account_key("http://127.0.0.1:9/token")
    monkeypatch.setenv(
        "AIRFLOW_CONN_GCP_FAKE",
        json.dumps({"conn_type": "google_cloud_platform", "extra": {"keyfile_dict": json.dumps(gcp_key)}}),
    )
    azure_key = "YXp1cmUtc2VjcmV0LWtleS1mb3ItdGhlLXRlc3Q="
    monkeypatch.setenv(
        "AIRFLOW_CONN_AZURE_FAKE",
        json.dumps({"conn_type": "wasb", "login": "fakeacct", "password": azure_key}),
    )
    secrets = ["s3cr3t-value", azure_key, gcp_key["private_key"].splitlines()[5]]
    write_input(tmp_path / "in", [300])
    dag = cluster_dag(
        "on_cluster",
        input_path=str(tmp_path / "in"),
        output_path=str(tmp_path / "out"),
        rows_per_range=100,
        aws_conn_id="aws_fake",
        gcp_conn_id="gcp_fake",
        azure_conn_id="azure_fake",
    )
    ti = run_dag(dag, LOGICAL_DATE).get_task_instance("score")
    assert ti.state == "success"
    summary = ti.xcom_pull(task_ids="score")
    (sid,) = jobs_of(cluster, "on_cluster")
    assert summary["ray_submission_id"] == sid and sid.endswith("-0")
    assert summary["rows_out"] == 300 and summary["ranges_done"] == 3
    assert_exactly_once(read_output(tmp_path / "out"), range(300))

    log = capfd.readouterr().out
    job_lines = [line for line in log.splitlines() if "[ray job]" in line]
    assert any("Committed 3/3 ranges" in line for line in job_lines), log[-3000:]
    assert ti.xcom_pull(task_ids="score", key="ray_job_url") == f"{cluster.dashboard}/#/jobs/{sid}"
    assert ti.xcom_pull(task_ids="score", key="_link_RayJobLink") == f"{cluster.dashboard}/#/jobs/{sid}"
    job = json.dumps(jobs_of(cluster, "on_cluster")[sid])
    assert cluster.token not in job
    for secret in secrets:  # not in the job's entrypoint, runtime_env, metadata, nor the task's log
        assert secret not in job and secret not in log and secret not in json.dumps(summary)

    # The same task instance again (a clear, a retry): the job succeeded, so its result is taken.
    again = run_dag(dag, LOGICAL_DATE).get_task_instance("score").xcom_pull(task_ids="score")
    assert again == summary
    assert list(jobs_of(cluster, "on_cluster")) == [sid]


def test_a_killed_task_process_reattaches_to_its_job(tmp_path, cluster):
    write_input(tmp_path / "in", [600])
    kwargs = {
        "dag_id": "reattach",
        "input_path": str(tmp_path / "in"),
        "output_path": str(tmp_path / "out"),
        "rows_per_range": 100,
        "predictor": "tests.support.predictors:SlowScore",
        "predictor_kwargs": {"delay_s": 1.0},
        "batch_size": 50,
    }
    process = start_task_process(tmp_path, **kwargs)
    sid = wait_for_running_job(cluster, "reattach", process, tmp_path)
    os.killpg(process.pid, signal.SIGKILL)  # the worker dies: no on_kill, the job goes on
    process.wait()

    ti = run_dag(cluster_dag(**kwargs), LOGICAL_DATE).get_task_instance("score")
    assert ti.state == "success"
    assert ti.xcom_pull(task_ids="score")["ray_submission_id"] == sid
    assert list(jobs_of(cluster, "reattach")) == [sid]  # one job for the task, never two
    assert_exactly_once(read_output(tmp_path / "out"), range(600))


def test_a_failed_job_is_resubmitted_under_a_new_id_and_resumes(tmp_path, cluster):
    write_input(tmp_path / "in", [600])
    marker = tmp_path / "fail"
    marker.touch()
    dag = cluster_dag(
        "resubmit",
        input_path=str(tmp_path / "in"),
        output_path=str(tmp_path / "out"),
        rows_per_range=100,
        predictor="tests.support.predictors:FailWhileMarked",
        predictor_kwargs={"marker": str(marker), "fail_from_id": 300, "output": str(tmp_path / "out")},
        batch_size=100,
    )
    assert run_dag(dag, LOGICAL_DATE).get_task_instance("score").state == "failed"
    (first,) = jobs_of(cluster, "resubmit").values()
    assert first["status"] == "FAILED"

    marker.unlink()
    ti = run_dag(dag, LOGICAL_DATE).get_task_instance("score")
    summary = ti.xcom_pull(task_ids="score")
    assert ti.state == "success" and summary["ray_submission_id"] == first["submission_id"][:-1] + "1"
    assert summary["ranges_skipped"] >= 1 and summary["rows_processed"] <= 600 - 100
    assert {j["status"] for j in jobs_of(cluster, "resubmit").values()} == {"FAILED", "SUCCEEDED"}
    assert_exactly_once(read_output(tmp_path / "out"), range(600))


def test_bad_settings_fail_fast_with_the_cluster_s_reason_and_no_retry(tmp_path, cluster, capfd):
    write_input(tmp_path / "in", [10])
    dag = cluster_dag(
        "bad_on_cluster",
        input_path=str(tmp_path / "missing"),
        output_path=str(tmp_path / "out"),
        retries=3,
    )
    ti = run_dag(dag, LOGICAL_DATE).get_task_instance("score")
    assert ti.state == "failed"  # not up_for_retry
    assert str(tmp_path / "missing") in capfd.readouterr().out


def test_killing_the_task_stops_its_job(tmp_path, cluster):
    write_input(tmp_path / "in", [400])
    process = start_task_process(
        tmp_path,
        dag_id="killed",
        input_path=str(tmp_path / "in"),
        output_path=str(tmp_path / "out"),
        predictor="tests.support.predictors:SlowScore",
        predictor_kwargs={"delay_s": 2.0},
        batch_size=20,
    )
    sid = wait_for_running_job(cluster, "killed", process, tmp_path)
    os.killpg(process.pid, signal.SIGTERM)  # what Airflow sends a task it kills: on_kill runs
    try:
        assert wait_for_status(cluster, sid, "STOPPED") == "STOPPED"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_second_run_on_an_output_fails_naming_the_ray_job_that_writes_it(tmp_path, cluster, capfd):
    write_input(tmp_path / "in", [600])
    # The first run holds its output until the second has been refused (a run that merely took long
    # could end first: the second run's start is seconds of Airflow and Ray on a loaded machine).
    marker = tmp_path / "hold"
    marker.touch()
    common = {
        "input_path": str(tmp_path / "in"),
        "output_path": str(tmp_path / "out"),
        "rows_per_range": 100,
        "predictor": "tests.support.predictors:WaitWhileMarked",
        "predictor_kwargs": {"marker": str(marker)},
        "batch_size": 50,
    }
    process = start_task_process(tmp_path, dag_id="writer_one", **common)
    sid = wait_for_running_job(cluster, "writer_one", process, tmp_path)
    try:
        # A RUNNING job starts its driver: on a loaded machine the second run's job could take the lease first.
        wait_for_lease(common["output_path"], sid, process, tmp_path)
        ti = run_dag(cluster_dag("writer_two", **common), LOGICAL_DATE).get_task_instance("score")
        assert ti.state == "failed"
        log = capfd.readouterr().out
        assert f"is being written by dag writer_one, run {ti.run_id}, task score, try 1, Ray job {sid}" in log
        (second,) = jobs_of(cluster, "writer_two").values()
        assert second["status"] == "FAILED"
        marker.unlink()
        process.wait(timeout=300)
        assert wait_for_status(cluster, sid, "SUCCEEDED") == "SUCCEEDED"  # the first run is not disturbed
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            RayHook(CONN_ID).stop_job(sid)
    assert_exactly_once(read_output(tmp_path / "out"), range(600))


def test_the_deferrable_path_waits_in_a_trigger(tmp_path, cluster, capfd):
    write_input(tmp_path / "in", [200])
    dag = cluster_dag(
        "deferred",
        input_path=str(tmp_path / "in"),
        output_path=str(tmp_path / "out"),
        rows_per_range=100,
        deferrable=True,
    )
    ti = run_dag(dag, LOGICAL_DATE).get_task_instance("score")
    assert ti.state == "success" and ti.xcom_pull(task_ids="score")["rows_out"] == 200
    assert "[ray job]" in capfd.readouterr().out
    assert_exactly_once(read_output(tmp_path / "out"), range(200))


def test_a_stage_runs_on_the_node_that_has_its_custom_resource(tmp_path, cluster):
    cluster.start_node(head=False, num_cpus=1, resources={"side_node": 1})

    async def nodes() -> list[dict]:
        async with RayHook(CONN_ID).get_conn() as client:
            return await client.nodes()

    (side,) = [n["node_id"] for n in run_sync(nodes()) if "side_node" in n["resources_total"]]
    write_input(tmp_path / "in", [200])
    dag = cluster_dag(
        "placed",
        input_path=str(tmp_path / "in"),
        output_path=str(tmp_path / "out"),
        predictor="tests.support.predictors:node_id",
        ray_resources={"side_node": 1},
    )
    assert run_dag(dag, LOGICAL_DATE).get_task_instance("score").state == "success"
    assert set(read_output(tmp_path / "out")["node_id"].to_pylist()) == {side}


def test_the_planning_task_of_a_mapped_run_reads_the_footers_on_the_cluster(tmp_path, ray_cluster, monkeypatch, capfd):
    # Footers are read by Ray tasks from 3 files on (by default from 1,000).
    env = {"PYTHONPATH": str(REPO), footers.RAY_FOOTERS_MIN_FILES_ENV: "3"}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection(ray_cluster, runtime_env={"env_vars": env}))
    write_input(tmp_path / "in", [150, 150, 100, 0])
    here = plan_shards(config(tmp_path, output_path=str(tmp_path / "planned_here")), 2)

    def read_here(*args, **kwargs):
        raise AssertionError("the Airflow task read an input footer")

    # From here on, this process (the Airflow worker of dag.test()) must read no footer.
    monkeypatch.setattr(footers, "read_file_info", read_here)
    dag = mapped_cluster_dag(
        "mapped_on_cluster",
        2,
        plan_deferrable=True,
        input_path=str(tmp_path / "in"),
        output_path=str(tmp_path / "out"),
        rows_per_range=100,
    )
    run = run_dag(dag, LOGICAL_DATE)
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
    assert states == {("plan", -1): "success", ("score", 0): "success", ("score", 1): "success"}
    assert run.get_task_instance("plan").xcom_pull(task_ids="plan") == [p.to_dict() for p in here]

    (plan_job,) = jobs_of(ray_cluster, "mapped_on_cluster", "plan").values()
    assert plan_job["status"] == "SUCCEEDED" and '"plan_partitions": 2' in plan_job["entrypoint"]
    assert {j["status"] for j in jobs_of(ray_cluster, "mapped_on_cluster").values()} == {"SUCCEEDED"}
    job_lines = [line for line in capfd.readouterr().out.splitlines() if "[ray job]" in line]
    assert any("Read 4 footers in 1 Ray task(s)" in line for line in job_lines), job_lines[-20:]
    assert_exactly_once(read_output(tmp_path / "out"), range(400))


def test_a_delta_table_output_on_the_cluster(tmp_path, cluster):
    pytest.importorskip("deltalake")
    from tests.support.tables import read_table

    write_input(tmp_path / "in", [300])
    dag = cluster_dag(
        "table_on_cluster",
        input_path=str(tmp_path / "in"),
        output_path=str(tmp_path / "table"),
        output_format="delta",
        keep_columns=["group"],
        rows_per_range=100,
    )
    ti = run_dag(dag, LOGICAL_DATE).get_task_instance("score")
    assert ti.state == "success"
    summary = ti.xcom_pull(task_ids="score")
    assert summary["ray_submission_id"] and summary["table_version"] == 0
    assert_exactly_once(read_table(tmp_path, "delta", "2026-11-20"), range(300))
