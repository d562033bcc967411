"""What the provider and a Ray cluster's Jobs API say to each other: a job's status and outcome, how
waiting for it ended, and the errors of talking to it (the cluster's settings: :mod:`.ray_connection`).

Kept apart from the client (:mod:`.jobs_client`) so that everything importing these types (the
hook, the operators, the trigger, and so DAG files) stays free of aiohttp, which only the code
that talks to a cluster loads. No Airflow import here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from airflow_provider_raybatch.pipeline.errors import ERROR_PREFIX, NOT_RETRYABLE_EXIT, RayBatchError


class JobStatus(StrEnum):
    """A Ray job's status, as the Jobs API reports it (compares equal to its name)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def is_active(self) -> bool:
        return self in (JobStatus.PENDING, JobStatus.RUNNING)


class WaitOutcome(StrEnum):
    """How waiting for a job ended: the ``outcome`` of a :class:`~airflow_provider_raybatch.triggers.ray_job.RayJobTrigger` event."""

    #: The job ended; its :class:`JobStatus` is the event's ``status``.
    ENDED = "ended"
    #: The task's deadline passed first; the job was stopped.
    TIMED_OUT = "timeout"
    #: The Jobs API could not be followed; the event's ``message`` says why.
    UNREACHABLE = "error"


@dataclass(frozen=True)
class JobFailure:
    """Why a job did not succeed, and whether running it again could help."""

    message: str
    retryable: bool


@dataclass(frozen=True)
class JobInfo:
    """A Ray job's state as the Jobs API reports it (also the trigger's event payload)."""

    submission_id: str
    status: JobStatus
    message: str = ""
    driver_exit_code: int | None = None

    @property
    def is_active(self) -> bool:
        return self.status.is_active

    @property
    def is_terminal(self) -> bool:
        return not self.status.is_active

    @property
    def is_successful(self) -> bool:
        return self.status is JobStatus.SUCCEEDED

    @property
    def failure(self) -> JobFailure | None:
        """Why the job ended without success; None while it runs or once it succeeded.

        A pipeline job that exits with :data:`~airflow_provider_raybatch.pipeline.errors.NOT_RETRYABLE_EXIT`
        found bad settings or input, or too many engine errors: not retryable, and the message is
        the job's own (the last line it wrote after ``ERROR_PREFIX``). Anything else (a crash, a
        lost node, a stop) may pass on another try.
        """
        if not self.is_terminal or self.is_successful:
            return None
        if self.status is JobStatus.FAILED and self.driver_exit_code == NOT_RETRYABLE_EXIT:
            lines = self.message.splitlines()
            errors = [line.removeprefix(ERROR_PREFIX) for line in lines if line.startswith(ERROR_PREFIX)]
            return JobFailure(errors[-1] if errors else self.message, retryable=False)
        return JobFailure(f"Ray job {self.submission_id} ended {self.status.value}: {self.message}", retryable=True)


class RayJobsError(RayBatchError):
    """A Ray cluster's Jobs API could not be reached or refused a request; the message says why."""


class JobsApiUnavailable(RayJobsError):
    """The Jobs API did not answer, or answered that it cannot serve now: a refused or reset
    connection, a timeout, 502/503/504, or a 500 that says to try again later (a dashboard
    restarting, a head pod rescheduled, an ingress during a rollout). It may pass by itself."""


class JobDeadlineExceeded(RayJobsError):
    """The task's deadline passed while its Ray job was still running."""


class JobAlreadyExists(RayJobsError):
    """A job with this submission id exists already (another try submitted it)."""
