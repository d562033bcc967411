"""The interface every runner has: run a config, or plan its partitions."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_provider_raybatch.hooks.jobs_types import JobInfo
    from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
    from airflow_provider_raybatch.pipeline.partitions import Partition
    from airflow_provider_raybatch.pipeline.summary import RunSummary


class PipelineRunner(ABC):
    """Runs a validated config, or plans its partitions for a mapped run.

    Each returns the result, or the :class:`~airflow_provider_raybatch.hooks.jobs_types.JobInfo`
    of a Ray Job that has not ended yet (only a cluster's runner does): the operator then waits
    for it or defers, and turns the ended job into its result with the runner's ``result``.
    Errors are the pipeline's (:mod:`airflow_provider_raybatch.pipeline.errors`), never Airflow's.
    """

    @abstractmethod
    def run(self, config: BatchInferenceConfig) -> RunSummary | JobInfo:
        """Process the config's ranges that are not committed yet."""

    @abstractmethod
    def plan(self, config: BatchInferenceConfig, partitions: int) -> list[Partition] | JobInfo:
        """Prepare the output once and cut its ranges into at most ``partitions`` partitions."""
