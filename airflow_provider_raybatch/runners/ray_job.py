"""The pipeline as a Ray Job on a cluster, through the Jobs API (a ``ray`` connection with a host).

The job's submission id is derived from the task instance, so any try of the task finds the job
an earlier try submitted, even one that died right after submitting. A job writes its result
(the run's summary, or the planned shards) next to the output, where :meth:`RayJobRunner.result`
reads it once the job has ended.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.hooks.jobs_types import JobFailure, JobInfo
from airflow_provider_raybatch.runners.base import PipelineRunner

if TYPE_CHECKING:
    from airflow_provider_raybatch.hooks.ray import RayHook
    from airflow_provider_raybatch.hooks.ray_connection import RayClusterSettings
    from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
    from airflow_provider_raybatch.pipeline.shards import Shard
    from airflow_provider_raybatch.pipeline.summary import RunSummary


class RayJobRunner(PipelineRunner):
    """Submits the run (or the planning) as a Ray Job, or reattaches to the one already submitted.

    :param hook: the ``ray`` connection's hook.
    :param cluster: its cluster settings.
    :param submission_id_prefix: the same for every try of the task (:func:`submission_id_prefix`).
    :param metadata: the job's metadata, shown in the dashboard (no secrets).
    :param start_attempt: the attempt the task last recorded (see :meth:`.RayHook.submit_or_attach`).
    :param on_submit: called with the attempt number just before it is submitted, to record it.
    """

    def __init__(
        self,
        hook: RayHook,
        cluster: RayClusterSettings,
        submission_id_prefix: str,
        *,
        metadata: dict[str, str],
        start_attempt: int = 0,
        on_submit: Callable[[int], None] | None = None,
    ) -> None:
        self.hook = hook
        self.cluster = cluster
        self.submission_id_prefix = submission_id_prefix
        self.metadata = metadata
        self.start_attempt = start_attempt
        self.on_submit = on_submit

    def run(self, config: BatchInferenceConfig) -> JobInfo:
        return self._submit(config, None)

    def plan(self, config: BatchInferenceConfig, shards: int) -> JobInfo:
        return self._submit(config, shards)

    def _submit(self, config: BatchInferenceConfig, plan_shards: int | None) -> JobInfo:
        from airflow_provider_raybatch.pipeline.job import entrypoint

        spec = config.to_spec()
        return self.hook.submit_or_attach(
            self.submission_id_prefix,
            lambda submission_id: entrypoint(spec, submission_id, self.cluster.namespace, plan_shards=plan_shards),
            metadata=self.metadata,
            start_attempt=self.start_attempt,
            on_submit=self.on_submit,
        )

    def wait(self, info: JobInfo, *, poll_interval: float, log_line: Callable[[str], None]) -> JobInfo:
        return self.hook.wait_for_job(info.submission_id, poll_interval=poll_interval, log_line=log_line)

    def result(
        self, info: JobInfo, output_path: str, storage_options: dict[str, Any], *, planning: bool
    ) -> RunSummary | list[Shard] | JobFailure:
        from airflow_provider_raybatch.pipeline.job import read_job_shards, read_job_summary

        sid = info.submission_id
        if info.is_successful:
            read = read_job_shards if planning else read_job_summary
            result = read(output_path, storage_options, sid)
            if result is None:
                what = "shards" if planning else "summary"
                return JobFailure(f"Ray job {sid} succeeded but left no {what} in {output_path!r}", retryable=True)
            return result
        return info.failure or JobFailure(f"Ray job {sid} has not ended ({info.status.value})", retryable=True)


def submission_id_prefix(dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
    """Readable and unique per task instance: the same for every try of it."""
    digest = hashlib.sha256(json.dumps([dag_id, run_id, task_id, map_index]).encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_.]+", "-", f"{dag_id}.{task_id}")[:80]
    return f"raybatch-{readable}-{digest}"
