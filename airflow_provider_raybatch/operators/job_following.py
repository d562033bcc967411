"""The part of :class:`~airflow_provider_raybatch.operators.ray_pipeline.RayPipelineOperator` that
follows its Ray job on a cluster: the job's link, waiting in the worker or deferring to the
triggerer, the ended job's result, and stopping the job when the task ends without it.

It sees the job only through the runner interface (:class:`~airflow_provider_raybatch.runners.base.PipelineRunner`)
and the ``ray`` connection's hook; what the result needs once the task resumes from a deferral
travels with the deferral, so the config is never built again.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow_provider_raybatch.hooks.jobs_types import JobFailure, JobInfo, RayJobsError
from airflow_provider_raybatch.links.ray import RAY_JOB_URL_KEY
from airflow_provider_raybatch.version_compat import (
    AIRFLOW_VERSION,
    TRIGGER_ON_KILL,
    AirflowException,
    AirflowFailException,
    note_once,
)

if TYPE_CHECKING:
    import logging

    from airflow.sdk import Context

    from airflow_provider_raybatch.hooks.ray import RayHook
    from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
    from airflow_provider_raybatch.pipeline.shards import Shard
    from airflow_provider_raybatch.pipeline.summary import RunSummary
    from airflow_provider_raybatch.runners.base import PipelineRunner


class RayJobFollowing:
    """Follows the task's Ray job; mixed into the operator, whose arguments it reads."""

    # The operator's, read here.
    hook: RayHook
    ray_conn_id: str | None
    deferrable: bool
    poll_interval: float
    plan_shards: int | None
    output_path: str
    retries: int | None
    execution_timeout: timedelta | None
    log: logging.Logger
    #: The task's Ray job, once it has one (for ``on_kill`` and a last try's stop).
    submission_id: str | None

    def _follow_job(
        self, context: Context, runner: PipelineRunner, info: JobInfo, config: BatchInferenceConfig
    ) -> JobInfo:
        """Link the task to its Ray job, then wait for the job to end here, or defer to the triggerer."""
        self.submission_id = info.submission_id
        if (cluster := self.hook.cluster) is not None:
            context["ti"].xcom_push(key=RAY_JOB_URL_KEY, value=cluster.job_url(info.submission_id))
        if not info.is_active:
            return info
        if self.deferrable:
            from airflow_provider_raybatch.triggers.ray_job import RayJobTrigger

            if not TRIGGER_ON_KILL:
                note_once(
                    "trigger_on_kill",
                    "Airflow %s does not tell a trigger that its task was killed (3.3+): a task marked failed "
                    "while deferred leaves its Ray job %s running until it ends or reaches its deadline",
                    AIRFLOW_VERSION,
                    info.submission_id,
                )

            self.defer(  # type: ignore[attr-defined]
                trigger=RayJobTrigger(
                    ray_conn_id=self.ray_conn_id,
                    submission_id=info.submission_id,
                    poll_interval=self.poll_interval,
                    deadline=self._deadline(context),
                ),
                method_name="execute_complete",
                # What the job's result needs once it ended (no secret): the config is not built again.
                kwargs={
                    "output_path": config.output_path,
                    "planning": self.plan_shards is not None,
                    "max_rows": config.max_rows,
                },
            )
        # In the worker, Airflow's own execution_timeout interrupts this wait and calls on_kill.
        return runner.wait(
            info, poll_interval=self.poll_interval, log_line=lambda line: self.log.info("[ray job] %s", line)
        )

    @staticmethod
    def _job_result(
        runner: PipelineRunner, info: JobInfo, output_path: str, options: dict[str, Any], planning: bool
    ) -> RunSummary | list[Shard]:
        """The ended job's result; a job that failed fails the try, without a retry where one cannot help."""
        result = runner.result(info, output_path, options, planning=planning)
        if isinstance(result, JobFailure):
            if not result.retryable:
                # Bad settings or input found by the job: a retry would fail the same way.
                raise AirflowFailException(result.message)
            raise AirflowException(result.message)
        return result

    def _unfollowed(self, context: Context, message: str) -> NoReturn:
        """Fail the try when the job could not be submitted or followed (the Jobs API refused, or
        stayed unavailable past the connection's ``outage_timeout``).

        The next try reattaches to the job. After the last try there is none: its job is stopped
        (as ``on_kill`` does), so that no writer goes on unseen while Airflow calls the task failed.
        """
        ti = context["ti"]
        last_try = not (self.retries and ti.try_number <= ti.max_tries)
        if last_try and self.submission_id is not None and self.hook.cluster is not None:
            try:
                stopped = self.hook.stop_job(self.submission_id)
                self.log.warning(
                    "This is the task's last try: %s",
                    f"stopped its Ray job {self.submission_id}"
                    if stopped
                    else f"its Ray job {self.submission_id} had already ended",
                )
            except RayJobsError as e:
                self.log.error(
                    "This is the task's last try, and its Ray job %s could not be stopped (%s): it may still be "
                    "running and writing %s; stop it from the Ray dashboard",
                    self.submission_id,
                    e,
                    self.output_path,
                )
        raise AirflowException(message)

    def on_kill(self) -> None:
        """The task was killed or marked failed: stop its Ray job (stop, not delete: its log stays)."""
        if self.submission_id and self.hook.cluster is not None:
            self.hook.stop_job(self.submission_id)

    def _deadline(self, context: Context) -> float | None:
        """The try's absolute deadline (Unix time), from ``execution_timeout``.

        For the trigger: Airflow 3.3 does not apply ``execution_timeout`` to a deferred task.
        """
        if self.execution_timeout is None:
            return None
        started = context["ti"].start_date
        return (started.timestamp() if started else time.time()) + self.execution_timeout.total_seconds()
