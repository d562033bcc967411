"""The pipeline in the task's own process, on an embedded local Ray (no ``ray`` connection host)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from airflow_provider_raybatch.runners.base import PipelineRunner

if TYPE_CHECKING:
    from airflow_provider_raybatch.hooks.jobs_types import JobInfo
    from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
    from airflow_provider_raybatch.pipeline.shards import Shard
    from airflow_provider_raybatch.pipeline.summary import RunSummary


class EmbeddedRunner(PipelineRunner):
    """Runs and plans in this process; Ray is imported only when it runs. Its results come back
    from ``run`` and ``plan`` themselves: there is never a job to wait for."""

    def run(self, config: BatchInferenceConfig) -> RunSummary:
        from airflow_provider_raybatch.pipeline.runner import run_batch_inference

        return run_batch_inference(config)

    def plan(self, config: BatchInferenceConfig, shards: int) -> list[Shard]:
        from airflow_provider_raybatch.pipeline.shards import plan_shards

        return plan_shards(config, shards)

    def wait(self, info: JobInfo, *, poll_interval: float, log_line: Callable[[str], None]) -> NoReturn:
        raise _no_job(info)

    def result(self, info: JobInfo, output_path: str, storage_options: dict[str, Any], *, planning: bool) -> NoReturn:
        raise _no_job(info)


def _no_job(info: JobInfo) -> TypeError:
    return TypeError(f"an embedded run submits no Ray job, so it has none to follow ({info.submission_id})")
