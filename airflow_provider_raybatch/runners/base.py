"""The interface every runner has: run a config or plan its shards, wait for a job, take its result."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_raybatch.hooks.jobs_types import JobFailure, JobInfo
    from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
    from airflow_provider_raybatch.pipeline.shards import Shard
    from airflow_provider_raybatch.pipeline.summary import RunSummary


class PipelineRunner(ABC):
    """Runs a validated config, or plans its shards for a mapped run, and follows it to its result.

    ``run`` and ``plan`` return the result, or the :class:`~airflow_provider_raybatch.hooks.jobs_types.JobInfo`
    of a Ray Job that has not ended yet (only a cluster's runner does): the operator then waits
    for it here (``wait``) or defers, and turns the ended job into its result (``result``), which
    needs only the job, the output's path and whether it planned: no config is built again.
    Errors are the pipeline's (:mod:`airflow_provider_raybatch.pipeline.errors`) or the Jobs API's
    (:class:`~airflow_provider_raybatch.hooks.jobs_types.RayJobsError`), never Airflow's.
    """

    @abstractmethod
    def run(self, config: BatchInferenceConfig) -> RunSummary | JobInfo:
        """Process the config's ranges that are not committed yet."""

    @abstractmethod
    def plan(self, config: BatchInferenceConfig, shards: int) -> list[Shard] | JobInfo:
        """Prepare the output once and cut its ranges into at most ``shards`` shards."""

    @abstractmethod
    def wait(self, info: JobInfo, *, poll_interval: float, log_line: Callable[[str], None]) -> JobInfo:
        """Wait in this process until the job ends, passing its log lines on; return the ended job.

        :param info: a job ``run`` or ``plan`` returned.
        :param poll_interval: seconds between status checks.
        :param log_line: called with each line of the job's log.
        """

    @abstractmethod
    def result(
        self, info: JobInfo, output_path: str, storage_options: dict[str, Any], *, planning: bool
    ) -> RunSummary | list[Shard] | JobFailure:
        """What an ended job left: its summary, or its shards when ``planning``; or why it failed.

        :param info: the ended job.
        :param output_path: the output it wrote, where its result is.
        :param storage_options: fsspec options (credentials) to read the output with.
        :param planning: the job planned shards (``plan``) rather than ran (``run``).
        """
