"""Waits for a Ray Job in the triggerer, streaming its log into the task log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_raybatch.hooks.jobs_types import JobDeadlineExceeded, RayJobsError, WaitOutcome
from airflow_provider_raybatch.hooks.ray import RayHook


class RayJobTrigger(BaseTrigger):
    """Fires once the Ray job ends, with its status; never blocks the triggerer's event loop.

    :param ray_conn_id: the ``ray`` connection of the cluster (read again in the triggerer, so
        no secret is stored with the trigger).
    :param submission_id: the job to wait for.
    :param poll_interval: seconds between status checks.
    :param deadline: Unix time at which the job is stopped and the task times out (the task's
        ``execution_timeout`` counted from the start of its try). Absolute, so a trigger moved to
        another triggerer keeps the same deadline.
    """

    def __init__(
        self,
        *,
        ray_conn_id: str,
        submission_id: str,
        poll_interval: float = 5.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        self.ray_conn_id = ray_conn_id
        self.submission_id = submission_id
        self.poll_interval = poll_interval
        self.deadline = deadline
        # The hook reads the connection when first used (aget_connection): no secret is kept here.
        self.hook = RayHook(ray_conn_id)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "ray_conn_id": self.ray_conn_id,
                "submission_id": self.submission_id,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """One event: ``submission_id``, ``outcome`` (a :class:`~airflow_provider_raybatch.hooks.jobs_types.WaitOutcome`), ``message``, and once
        the job ended its ``status`` (a :class:`~airflow_provider_raybatch.hooks.jobs_types.JobStatus`) and ``driver_exit_code``."""
        event: dict[str, Any] = {"submission_id": self.submission_id, "status": None, "driver_exit_code": None}
        try:
            info = await self.hook.await_for_job(
                self.submission_id,
                poll_interval=self.poll_interval,
                deadline=self.deadline,
                log_line=lambda line: self.log.info("[ray job] %s", line),
            )
            event.update(
                outcome=WaitOutcome.ENDED.value,
                status=info.status.value,
                message=info.message,
                driver_exit_code=info.driver_exit_code,
            )
        except JobDeadlineExceeded as e:
            try:
                await self.hook.astop_job(self.submission_id)
                event.update(outcome=WaitOutcome.TIMED_OUT.value, message=f"{e}; the job was stopped")
            except RayJobsError as stop_error:
                event.update(outcome=WaitOutcome.TIMED_OUT.value, message=f"{e}; stopping the job failed: {stop_error}")
        except RayJobsError as e:
            event.update(outcome=WaitOutcome.UNREACHABLE.value, message=str(e))
        yield TriggerEvent(event)

    async def on_kill(self) -> None:
        """The task was marked failed, cleared or killed while deferred: stop the job.

        (``cleanup()`` is left alone on purpose: it also runs when a trigger moves to another
        triggerer, and the job must survive that.)
        """
        await self.hook.astop_job(self.submission_id)
