"""The pipeline in the task's own process, on an embedded local Ray (no ``ray`` connection host)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_raybatch.runners.base import PipelineRunner

if TYPE_CHECKING:
    from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
    from airflow_provider_raybatch.pipeline.partitions import Partition
    from airflow_provider_raybatch.pipeline.summary import RunSummary


class EmbeddedRunner(PipelineRunner):
    """Runs and plans in this process; Ray is imported only when it runs."""

    def run(self, config: BatchInferenceConfig) -> RunSummary:
        from airflow_provider_raybatch.pipeline.runner import run_batch_inference

        return run_batch_inference(config)

    def plan(self, config: BatchInferenceConfig, partitions: int) -> list[Partition]:
        from airflow_provider_raybatch.pipeline.partitions import plan_partitions

        return plan_partitions(config, partitions)
