"""What a Ray Job left, read as the task's result: its summary or shards, or why it failed."""

from __future__ import annotations

import pytest

from airflow_provider_raybatch.hooks.jobs_types import JobFailure, JobInfo, JobStatus
from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.errors import ERROR_PREFIX, NOT_RETRYABLE_EXIT
from airflow_provider_raybatch.pipeline.job import write_job_result
from airflow_provider_raybatch.pipeline.shards import Shard
from airflow_provider_raybatch.pipeline.summary import RunSummary
from airflow_provider_raybatch.runners.ray_job import RayJobRunner, submission_id_prefix


@pytest.fixture
def config(tmp_path) -> BatchInferenceConfig:
    cfg = BatchInferenceConfig(
        input_path=str(tmp_path / "in"),
        output_path=str(tmp_path / "out"),
        stages=[Stage(predictor="tests.support.predictors:score")],
    )
    OutputLedger.open(cfg.output_path).fs.makedirs(str(tmp_path / "out" / "_raybatch"), exist_ok=True)
    return cfg


def job_result(config: BatchInferenceConfig, info: JobInfo, *, planning: bool):
    """What the operator reads once the job ended: the runner, the job and where its output is, no config."""
    runner = RayJobRunner(RayHook(None), None, "raybatch-x", metadata={})
    return runner.result(info, config.output_path, config.storage_options, planning=planning)


def test_a_succeeded_job_s_summary_carries_its_submission_id(config):
    write_job_result(config, "job-0", {"output_path": config.output_path, "rows_out": 7, "ranges_total": 1})
    result = job_result(config, JobInfo("job-0", JobStatus.SUCCEEDED), planning=False)
    assert isinstance(result, RunSummary) and (result.rows_out, result.ray_submission_id) == (7, "job-0")


def test_a_planning_job_s_shards_are_read_back(config):
    shard = Shard(index=0, count=1, range_ids=["a-0-10", "a-10-20"], rows=20)
    write_job_result(config, "plan-0", {"partitions": [shard.to_dict()]})
    assert job_result(config, JobInfo("plan-0", JobStatus.SUCCEEDED), planning=True) == [shard]


@pytest.mark.parametrize("planning", [False, True])
def test_a_succeeded_job_that_left_nothing_fails_the_try_retryably_naming_the_output(config, planning):
    result = job_result(config, JobInfo("job-1", JobStatus.SUCCEEDED), planning=planning)
    what = "shards" if planning else "summary"
    assert result == JobFailure(f"Ray job job-1 succeeded but left no {what} in {config.output_path!r}", retryable=True)


def test_a_job_failed_on_bad_settings_is_not_retryable_and_says_why(config):
    message = f"Traceback...\n{ERROR_PREFIX}stage 'score': cannot import predictor 'x:y'\n"
    info = JobInfo("job-2", JobStatus.FAILED, message, driver_exit_code=NOT_RETRYABLE_EXIT)
    assert job_result(config, info, planning=False) == JobFailure(
        "stage 'score': cannot import predictor 'x:y'", retryable=False
    )


@pytest.mark.parametrize("status", [JobStatus.FAILED, JobStatus.STOPPED])
def test_a_crashed_or_stopped_job_is_retryable(config, status):
    result = job_result(config, JobInfo("job-3", status, "node lost", driver_exit_code=1), planning=False)
    assert result == JobFailure(f"Ray job job-3 ended {status.value}: node lost", retryable=True)


def test_the_submission_id_prefix_is_the_same_for_every_try_and_unique_per_task_instance():
    first = submission_id_prefix("daily scores", "scheduled__2026-11-24", "score", -1)
    assert first == submission_id_prefix("daily scores", "scheduled__2026-11-24", "score", -1)
    assert first.startswith("raybatch-daily-scores.score-")
    others = {
        submission_id_prefix("daily scores", "scheduled__2026-11-25", "score", -1),
        submission_id_prefix("daily scores", "scheduled__2026-11-24", "score", 0),
        submission_id_prefix("daily scores", "scheduled__2026-11-24", "other", -1),
    }
    assert first not in others and len(others) == 3
