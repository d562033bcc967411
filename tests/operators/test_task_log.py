"""What a task's log shows, on a real Airflow (`dag.test()`) and a real local Ray.

`dag.test()` runs the task in this process, so its log is what this process writes: the records
of Python's logging (Airflow's structlog prints them on stdout with their level) and whatever
reaches file descriptor 2. A task run by a worker has its stderr forwarded by Airflow's
supervisor as ERROR lines (``task.stderr``), so any byte on fd 2 counts as an ERROR line here.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta

import pytest
from airflow.sdk import DAG

from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator
from airflow_provider_raybatch.pipeline.summary import PROGRESS_INTERVAL_ENV
from tests.conftest import run_dag
from tests.support.data import write_input

pytestmark = pytest.mark.usefixtures("ray_local", "airflow_db")
LOGICAL_DATE = datetime(2026, 11, 20, tzinfo=UTC)
#: A line Airflow's structlog console renders at ERROR or CRITICAL level.
ERROR_LEVEL = re.compile(r"\[(error|critical)\s*\]")
#: The GCS's error lines, which Ray forwards to every driver of the cluster: a line there may come
#: from another task on the shared Ray (CI once: "Failed to kill actor ..., Socket closed", an
#: actor whose process had already ended). See pipeline/runtime/stderr_levels.py.
RAY_GCS_LINE = re.compile(r"\(pid=gcs_server\)")


def error_lines(caplog: pytest.LogCaptureFixture, out: str, err: str) -> list[str]:
    """Every line that a worker's task log would show at ERROR level or above (but the GCS's: see above)."""
    lines = [f"stderr: {line}" for line in err.splitlines() if line.strip() and not RAY_GCS_LINE.search(line)]
    lines += [line for line in out.splitlines() if ERROR_LEVEL.search(line)]
    lines += [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]
    return lines


def score_dag(tmp_path, dag_id: str, predictor: str, **kwargs) -> DAG:
    """One task scoring ``<tmp>/in`` into ``<tmp>/out`` with ``predictor``."""
    with DAG(dag_id, schedule=None, start_date=LOGICAL_DATE) as dag:
        RayBatchInferenceOperator(
            task_id="score",
            predictor=predictor,
            input_path=str(tmp_path / "in"),
            output_path=str(tmp_path / "out"),
            id_column="id",
            **kwargs,
        )
    return dag


def test_a_successful_run_logs_no_error_and_ray_data_at_its_own_level(tmp_path, caplog, capfd):
    write_input(tmp_path / "in", [300, 200])
    dag = score_dag(tmp_path, "quiet_log", "tests.support.predictors:score", rows_per_range=100)
    capfd.readouterr()  # what came before the run
    with caplog.at_level(logging.INFO):
        run = run_dag(dag, LOGICAL_DATE)
    out, err = capfd.readouterr()
    assert run.get_task_instance("score").state == "success"
    # No red line: no stderr (Ray Data's console, the core worker's line about the replicas'
    # constructor arguments, which goes to stdout), no ERROR record
    # (Airflow's "XCom not found" for the job link of a run without a Ray job).
    assert error_lines(caplog, out, err) == []
    assert "XCom not found" not in out
    # Ray Data's messages are in the log at their own level, naming where its full log is.
    ray_data = [r for r in caplog.records if r.name.startswith("ray.data")]
    assert any("Full logs are in" in r.getMessage() and r.levelno == logging.INFO for r in ray_data), ray_data
    assert not any("Progress bars disabled" in r.getMessage() for r in ray_data)
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Committed ")]
    assert progress and progress[-1].startswith("Committed 5/5 ranges, 500/500 rows, ")


def test_a_predictor_returning_the_wrong_row_count_fails_once_without_retry_its_message_first(tmp_path, caplog, capfd):
    write_input(tmp_path / "in", [100])
    sentence = "stage 'drop_one_row' returned column 'score' with 99 rows for a batch of 100 rows"
    # retry_delay 0: a retry would come at once
    dag = score_dag(
        tmp_path, "wrong_rows", "tests.support.predictors:drop_one_row", retries=2, retry_delay=timedelta(0)
    )
    capfd.readouterr()
    with caplog.at_level(logging.INFO):
        run = run_dag(dag, LOGICAL_DATE)
    out, err = capfd.readouterr()
    ti = run.get_task_instance("score")
    assert (ti.state, ti.try_number) == ("failed", 1)  # not retried: the same predictor fails the same way
    everything = "\n".join([out, err, *(r.getMessage() for r in caplog.records)])
    assert everything.count(sentence) == 1, out[-5000:]
    assert "RayTaskError" not in everything and "Failed to apply UDF" not in everything
    # The first (and only) line at ERROR level is the task's failure, whose exception is the sentence.
    errors = error_lines(caplog, out, err)
    assert len(errors) == 1 and "Task failed with exception" in errors[0], errors
    failure = out.split(errors[0], 1)[1].split("\n20", 1)[0]  # its traceback, up to the next record
    assert failure.rstrip().endswith(f"AirflowFailException: {sentence}; a stage must return one row per input row")


def test_progress_is_logged_on_a_clock_with_rows_scored_before_the_first_commit(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "1")
    write_input(tmp_path / "in", [240])
    # One range of 240 rows, scored 20 at a time, 0.5 s a batch: the range commits after ~6 s.
    slow = {"predictor_kwargs": {"delay_s": 0.5}, "batch_size": 20}
    dag = score_dag(tmp_path, "progress_clock", "tests.support.predictors:SlowScore", **slow)
    with caplog.at_level(logging.INFO, logger="airflow_provider_raybatch"):
        run = run_dag(dag, LOGICAL_DATE)
    assert run.get_task_instance("score").state == "success"
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Committed ")]
    before_commit = [line for line in progress if line.startswith("Committed 0/1 ranges")]
    assert len(before_commit) >= 2, progress
    # Rows scored so far, before any range committed.
    assert any(re.search(r"0/240 rows, \d+ scored, scoring rate \d+ rows/s", line) for line in before_commit), progress
    assert progress[-1].startswith("Committed 1/1 ranges, 240/240 rows, "), progress
