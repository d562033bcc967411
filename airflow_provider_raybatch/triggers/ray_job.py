"""Waits for a Ray Job in the triggerer, streaming its log into the task log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_raybatch.hooks.jobs_types import JobDeadlineExceeded, RayJobsError
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
        """One event: the job's :class:`JobInfo` fields, or status ``TIMEOUT`` / ``ERROR`` and a message."""
        event: dict[str, Any] = {"submission_id": self.submission_id}
        try:
            info = await self.hook.await_for_job(
                self.submission_id,
                poll_interval=self.poll_interval,
                deadline=self.deadline,
                log_line=lambda line: self.log.info("[ray job] %s", line),
            )
            event.update(asdict(info))
        except JobDeadlineExceeded as e:
            try:
                await self.hook.astop_job(self.submission_id)
                event.update(status="TIMEOUT", message=f"{e}; the job was stopped")
            except RayJobsError as stop_error:
                event.update(status="TIMEOUT", message=f"{e}; stopping the job failed: {stop_error}")
        except RayJobsError as e:
            event.update(status="ERROR", message=str(e))
        yield TriggerEvent(event)

    async def on_kill(self) -> None:
        """The task was marked failed, cleared or killed while deferred: stop the job.

        (``cleanup()`` is left alone on purpose: it also runs when a trigger moves to another
        triggerer, and the job must survive that.)
        """
        await self.hook.astop_job(self.submission_id)
