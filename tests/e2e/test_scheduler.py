"""The example DAGs on a real Airflow: scheduler, DAG processor, triggerer and API server
(LocalExecutor with parallelism 4, a temporary AIRFLOW_HOME) on loopback, driven through the REST
API, with Airflow's production metadata database: a PostgreSQL server of its own on loopback
(tests/support/postgres.py), started for this module and stopped at its end.

1. A triggered run whose first try is killed part-way: Airflow's retry processes only the
   remaining ranges and the output holds every row once.
2. A backfill of three dates, two at a time: two dates' tasks run side by side (overlapping
   start and end times), never three; three isolated outputs, each written once; a cleared date
   reruns alone.
3. Bad Params are refused at trigger time naming the parameter; a bad path that passes the
   schema fails the task at once, without retries.
4. The mapped example DAG: one task instance per shard (pool of 2 slots), one output
   written once, one asset event for the run.

Cron scheduling is off (``use_job_schedule=False``) so that only the runs the test creates
exist. Every process started here is stopped at the end, the host's shared Ray that the tasks
used (in a folder of this test's own) included, and then the PostgreSQL server.

The tasks run on the host's shared local Ray (the default): the first task starts it, the others
connect to it, a killed try's retry finds it warm. Two tasks at once on a 2-core machine share
its CPUs. The ``raybatch_gpu`` pool (2 slots), the DAG's ``max_active_runs=2`` and
``max_active_tis_per_dag=2`` keep it at two.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_provider_raybatch.examples import digits
from airflow_provider_raybatch.pipeline.runtime.shared.head import stop_shared_heads
from tests.conftest import free_port
from tests.support.data import assert_output_sound
from tests.support.postgres import PostgresServer, postgres_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "daily_batch_inference"
TASK_ID = "predict_digits"
COMPONENTS = {
    "api-server": ["api-server", "--workers", "1"],
    "scheduler": ["scheduler"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer"],
}
WAIT_S = 480  # per run: generous, other test suites may share the machine's two cores
PARALLELISM = 4  # LocalExecutor's task processes at once (AIRFLOW__CORE__PARALLELISM)
#: The levels of the log lines that Airflow's UI shows as errors (its log viewer colours a line by its level).
ERROR_LEVELS = ("error", "critical")


class Airflow:
    """The running components and a REST client authenticated as admin (simple auth manager)."""

    def __init__(self, home: Path, data: Path, port: int, env: dict[str, str], database: PostgresServer):
        self.home, self.data, self.env, self.database = home, data, env, database
        self.api = httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v2", timeout=60)
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        for name, args in COMPONENTS.items():
            log = open(self.home / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "airflow", *args],
                env=self.env,
                cwd=self.home,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a whole
            )

    def stop(self) -> None:
        for process in self.processes.values():
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            _signal_group(process, signal.SIGKILL)
            process.wait()
        stop_shared_heads(self.env["RAYBATCH_LOCAL_RAY_DIR"])
        # Rays of tasks that were killed are no children of ours any more.
        subprocess.run(["pkill", "-9", "-f", self.env["RAY_TMPDIR"]], check=False)
        self.api.close()
        for folder in (self.env["RAY_TMPDIR"], self.home):
            shutil.rmtree(folder, ignore_errors=True)

    # --- REST helpers -----------------------------------------------------------------
    def call(self, method: str, path: str, expect: int | None = 200, **kwargs: Any) -> httpx.Response:
        response = self.api.request(method, path, **kwargs)
        if expect is not None:
            assert response.status_code == expect, f"{method} {path}: {response.status_code} {response.text}"
        return response

    def wait_for(self, what: str, check, timeout: float = WAIT_S, interval: float = 2.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                assert process.poll() is None, f"airflow {name} exited\n{self.logs()}"
            try:
                result = check()
            except httpx.TransportError:
                result = None
            if result:
                return result
            time.sleep(interval)
        pytest.fail(f"timed out waiting for {what}\n{self.logs()}")

    def wait_for_run(self, run_id: str, dag_id: str = DAG_ID) -> dict:
        def finished():
            run = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}").json()
            return run if run["state"] in ("success", "failed") else None

        return self.wait_for(f"run {run_id}", finished)

    def task_instance(self, run_id: str, task_id: str = TASK_ID) -> dict:
        return self.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}").json()

    def summary(self, run_id: str) -> dict:
        path = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}/xcomEntries/return_value"
        return self.call("GET", path, params={"deserialize": True}).json()["value"]

    def task_log(self, run_id: str, try_number: int) -> str:
        folder = self.home / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}" / f"task_id={TASK_ID}"
        return (folder / f"attempt={try_number}.log").read_text()

    def log_lines(self, run_id: str, try_number: int, dag_id: str = DAG_ID, task_id: str = TASK_ID) -> list[dict]:
        """A try's log as the UI reads it: the API's structured lines, each with its level (the UI's colour)."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        response = self.call("GET", path, params={"full_content": True}, headers={"Accept": "application/json"})
        return [line for line in response.json()["content"] if isinstance(line, dict)]

    def error_lines(self, run_id: str, try_number: int, **kwargs: str) -> list[str]:
        """The lines of a try's log that the UI shows as errors, with their exceptions as it shows them."""
        lines = self.log_lines(run_id, try_number, **kwargs)
        return [
            " ".join(
                [f"{line.get('logger')}: {line['event']}"]
                + [f"{e['exc_type']}: {e['exc_value']}" for e in line.get("error_detail", [])]
            )
            for line in lines
            if line.get("level") in ERROR_LEVELS
        ]

    def logs(self, lines: int = 40) -> str:
        """The tails of the components' logs and of the task logs, to see why a wait failed."""
        parts = []
        for path in [*sorted(self.home.glob("*.log")), *sorted((self.home / "logs").rglob("attempt=*.log"))]:
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"----- {path.relative_to(self.home)}\n" + "\n".join(tail))
        return "\n".join(parts)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


@pytest.fixture(scope="module")
def airflow() -> Iterator[Airflow]:
    with postgres_server() as database:
        yield from _airflow(database)


def _airflow(database: PostgresServer) -> Iterator[Airflow]:
    home = Path(tempfile.mkdtemp(prefix="rb5-e2e-"))
    data = home / "data"
    digits.train(data / "model" / "digits.safetensors", epochs=150)
    port = free_port()
    ray_tmp = tempfile.mkdtemp(prefix="rbe", dir="/tmp")  # short: Ray's socket paths are length-limited
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "RAY_ADDRESS"))},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database.url("psycopg2"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(PARALLELISM),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PYTHONPATH": str(REPO),  # this checkout's package and its provider entry point
        "RAYBATCH_DEMO_ROOT": str(data),
        "RAYBATCH_RETRY_DELAY_S": "2",
        "RAYBATCH_TEST_CRASH": "committed:1",
        "RAYBATCH_TEST_CRASH_ONCE": str(home / "crash-armed"),
        "RAYBATCH_RECORD_INTERVAL_S": "0",  # each range recorded alone: the crash follows exactly one
        "RAY_TMPDIR": ray_tmp,
        # The shared local Ray (the default mode), in this test's folder: stopped with this Airflow.
        "RAYBATCH_LOCAL_RAY": "shared",
        "RAYBATCH_LOCAL_RAY_DIR": ray_tmp,
    }
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], env=env, cwd=home, check=True, capture_output=True
    )
    # The schema is in PostgreSQL, and no SQLite database was made on the side.
    tables = {name for (name,) in database.query("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert tables >= {"dag_run", "task_instance", "backfill", "alembic_version"}
    assert not list(home.glob("*.db"))
    instance = Airflow(home, data, port, env, database)
    instance.start()
    try:
        instance.wait_for("the API server", lambda: instance.api.get("/monitor/health").status_code == 200)
        instance.wait_for(
            "the DAGs to be parsed",
            lambda: all(instance.api.get(f"/dags/{d}").status_code == 200 for d in (DAG_ID, "digits_accuracy_report")),
        )
        instance.call("POST", "/pools", json={"name": "raybatch_gpu", "slots": 2, "description": "e2e"}, expect=201)
        instance.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
        yield instance
    finally:
        instance.stop()


def test_a_killed_first_try_is_retried_by_airflow_and_resumes(airflow):
    rows = digits.write_input(airflow.data / "input" / "2026-11-02")  # 597 rows: 3 ranges of 200
    (airflow.home / "crash-armed").touch()  # the next task to commit a range is SIGKILLed after it
    airflow.call(
        "POST",
        f"/dags/{DAG_ID}/dagRuns",
        json={
            "dag_run_id": "e2e_retry",
            "logical_date": "2026-11-02T00:00:00Z",
            "conf": {"data_root": str(airflow.data)},
        },
    )
    run = airflow.wait_for_run("e2e_retry")
    assert run["state"] == "success", airflow.logs()
    assert not (airflow.home / "crash-armed").exists()  # the crash fired
    ti = airflow.task_instance("e2e_retry")
    assert ti["try_number"] == 2 and ti["pool"] == "raybatch_gpu"

    summary = airflow.summary("e2e_retry")  # the second try's
    assert summary["ranges_total"] == 3 and summary["ranges_skipped"] == 1 and summary["ranges_done"] == 2
    # The range committed by try 1 is whichever was written first: 200 rows, or the last one's 197.
    assert rows - summary["rows_processed"] in (200, rows - 400) and summary["rows_out"] == rows
    assert_output_sound(airflow.data / "output" / "2026-11-02", range(rows))

    first, second = airflow.task_log("e2e_retry", 1), airflow.task_log("e2e_retry", 2)
    # Try 1 was killed right after committing its first range, before logging it.
    assert "3 of 3 ranges to process (597 rows); 0 already committed" in first and "SIGKILL" in first
    assert f"2 of 3 ranges to process ({summary['rows_processed']} rows); 1 already committed" in second
    assert "Committed 3/3 ranges, 597/597 rows, " in second and "s left" in second
    assert "\u2588" not in second  # no progress bars in task logs
    # The successful try's log, as the UI shows it, has no error line: not Ray's core worker line
    # about the replicas' constructor arguments (pipeline/runtime/stderr_levels.py), nor any other.
    assert airflow.error_lines("e2e_retry", 2) == [], airflow.logs()
    # Both tries ran on the host's shared Ray: the first started it, the retry found it warm.
    assert "Starting the shared local Ray" in first and "Connected to the shared local Ray" in first
    assert "Connected to the shared local Ray" in second and "Starting the shared local Ray" not in second

    # The asset event of the successful try carries its summary.
    events = airflow.call("GET", "/assets/events", params={"source_dag_id": DAG_ID, "source_run_id": "e2e_retry"})
    assert [e["extra"] for e in events.json()["asset_events"]] == [summary]


def test_a_backfill_writes_each_date_once_in_its_own_folder(airflow):
    dates = {"2026-11-03": 150, "2026-11-04": 250, "2026-11-05": 350}
    for day, rows in dates.items():
        digits.write_input(airflow.data / "input" / day, rows=rows)
    backfill = airflow.call(
        "POST",
        "/backfills",
        json={
            "dag_id": DAG_ID,
            "from_date": "2026-11-03T00:00:00Z",
            "to_date": "2026-11-05T00:00:00Z",
            "max_active_runs": 2,
            "dag_run_conf": {"data_root": str(airflow.data)},
        },
    )

    def backfill_runs():
        runs = airflow.call("GET", f"/dags/{DAG_ID}/dagRuns", params={"run_type": "backfill"}).json()["dag_runs"]
        done = len(runs) == 3 and all(r["state"] in ("success", "failed") for r in runs)
        return runs if done else None

    runs = airflow.wait_for("the backfill", backfill_runs)
    assert sorted((r["logical_date"][:10], r["state"]) for r in runs) == [(d, "success") for d in dates], airflow.logs()
    for day, rows in dates.items():
        assert_output_sound(airflow.data / "output" / day, range(rows))

    # Side by side: two dates' tasks ran at the same time, and never all three (2 pool slots).
    spans = {}
    for run in runs:
        ti = airflow.task_instance(run["dag_run_id"])
        assert ti["try_number"] == 1 and ti["state"] == "success", ti
        spans[run["logical_date"][:10]] = (
            datetime.fromisoformat(ti["start_date"]),
            datetime.fromisoformat(ti["end_date"]),
        )
    overlapping = [
        (a, b)
        for a, b in itertools.combinations(sorted(spans), 2)
        if max(spans[a][0], spans[b][0]) < min(spans[a][1], spans[b][1])
    ]
    assert overlapping, f"no two dates' tasks overlapped: {spans}"
    assert max(start for start, _ in spans.values()) >= min(end for _, end in spans.values()), spans
    # The date started last, after another ended, found the warm worker that task left: the tasks'
    # environments are equal under Airflow's supervisor (only per-try variables differ).
    last = max(runs, key=lambda r: spans[r["logical_date"][:10]][0])
    assert "Using 1 warm worker(s) left by an earlier task" in airflow.task_log(last["dag_run_id"], 1), airflow.logs()
    # The scheduler closes the backfill once its runs are done (until then another is refused).
    airflow.wait_for(
        "the backfill to complete",
        lambda: airflow.call("GET", f"/backfills/{backfill.json()['id']}").json()["completed_at"],
    )
    for run in runs:
        day = run["logical_date"][:10]
        assert airflow.summary(run["dag_run_id"])["output_path"] == f"{airflow.data}/output/{day}/"

    # Clear one date (as in the UI): it reruns alone and finds its output complete.
    run_id = next(r["dag_run_id"] for r in runs if r["logical_date"].startswith("2026-11-04"))
    airflow.call(
        "POST",
        f"/dags/{DAG_ID}/clearTaskInstances",
        json={"dag_run_id": run_id, "task_ids": [TASK_ID], "dry_run": False, "only_failed": False},
    )
    airflow.wait_for("the cleared task to run again", lambda: airflow.task_instance(run_id)["try_number"] > 1)
    rerun = airflow.wait_for_run(run_id)
    assert rerun["state"] == "success", airflow.logs()
    summary = airflow.summary(run_id)
    assert summary["ranges_skipped"] == summary["ranges_total"] == 2 and summary["rows_processed"] == 0
    assert_output_sound(airflow.data / "output" / "2026-11-04", range(250))
    others = [r for r in runs if r["dag_run_id"] != run_id]
    assert all(airflow.task_instance(r["dag_run_id"])["try_number"] == 1 for r in others), airflow.logs()


@pytest.mark.parametrize(
    ("conf", "param"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"data_root": "relative/folder"}, "data_root"),
        ({"row_limit": "ten"}, "row_limit"),
    ],
)
def test_invalid_params_are_refused_at_trigger_time(airflow, conf, param):
    response = airflow.call("POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf}, expect=400)
    assert f"Invalid input for param {param}" in response.json()["detail"]
    backfill = airflow.call(
        "POST",
        "/backfills",
        json={
            "dag_id": DAG_ID,
            "from_date": "2026-11-06T00:00:00Z",
            "to_date": "2026-11-06T00:00:00Z",
            "dag_run_conf": conf,
        },
        expect=None,
    )
    assert backfill.status_code in (400, 422) and param in backfill.text


def test_a_missing_input_fails_the_task_at_once_without_retries(airflow):
    airflow.call(
        "POST",
        f"/dags/{DAG_ID}/dagRuns",
        json={
            "dag_run_id": "e2e_missing",
            "logical_date": "2026-11-07T00:00:00Z",
            "conf": {"data_root": str(airflow.data)},
        },
    )
    run = airflow.wait_for_run("e2e_missing")
    ti = airflow.task_instance("e2e_missing")
    assert run["state"] == "failed" and ti["state"] == "failed" and ti["try_number"] == 1  # retries=2, not used
    assert f"input path '{airflow.data}/input/2026-11-07/' does not exist" in airflow.task_log("e2e_missing", 1)
    # A real error still shows as one.
    errors = airflow.error_lines("e2e_missing", 1)
    assert any(f"input path '{airflow.data}/input/2026-11-07/' does not exist" in line for line in errors), errors
    assert not (airflow.data / "output" / "2026-11-07").exists()


def test_mapped_shards_on_the_scheduler_write_the_output_once(airflow):
    dag_id = "sharded_batch_inference"
    rows = digits.write_input(airflow.data / "input" / "2026-11-08")  # 597 rows: 6 ranges of 100
    airflow.call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
    airflow.call(
        "POST",
        f"/dags/{dag_id}/dagRuns",
        json={
            "dag_run_id": "e2e_mapped",
            "logical_date": "2026-11-08T00:00:00Z",
            "conf": {"data_root": str(airflow.data)},
        },
    )
    run = airflow.wait_for_run("e2e_mapped", dag_id=dag_id)
    assert run["state"] == "success", airflow.logs()
    mapped = airflow.call(
        "GET", f"/dags/{dag_id}/dagRuns/e2e_mapped/taskInstances", params={"task_id": "predict_shard"}
    )
    instances = sorted(mapped.json()["task_instances"], key=lambda ti: ti["map_index"])
    assert [(ti["map_index"], ti["rendered_map_index"], ti["state"]) for ti in instances] == [
        (i, f"shard {i}", "success") for i in range(3)
    ]
    output = airflow.data / "output-sharded" / "2026-11-08"
    assert_output_sound(output, range(rows))
    assert len(list(output.glob("part-*.parquet"))) == 6
    scored, accuracy = digits.accuracy(str(output))
    assert scored == rows and accuracy > 0.85
    # One asset event for the whole mapped run, from the task after the shards.
    events = airflow.call("GET", "/assets/events", params={"source_dag_id": dag_id}).json()["asset_events"]
    assert [(e["source_task_id"], e["extra"]["rows_out"], e["extra"]["shards"]) for e in events] == [
        ("publish", rows, 3)
    ]
