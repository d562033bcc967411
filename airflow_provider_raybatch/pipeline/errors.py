"""The provider's errors, all under :class:`RayBatchError`; each message names the path, column,
stage, connection or setting at fault.

Retryable unless a :class:`NotRetryableError`: the operator fails a task at once on one of those
(a retry would fail the same way) and lets Airflow retry any other.
"""

#: Exit status of a Ray Job that failed with a :class:`NotRetryableError`.
NOT_RETRYABLE_EXIT = 3
#: Prefix of the log line that carries a :class:`NotRetryableError`'s message out of a Ray Job.
ERROR_PREFIX = "raybatch error: "


class RayBatchError(Exception):
    """Base class of the provider's own errors."""


class NotRetryableError(RayBatchError):
    """Retrying cannot help: the same settings, input or committed output would fail the same way.

    The operator fails such a task without retries; a Ray Job exits with :data:`NOT_RETRYABLE_EXIT`.
    """


class ConfigError(NotRetryableError):
    """A setting is invalid (paths, predictor, resources); raised before any model loads."""


class InputError(NotRetryableError):
    """The input cannot be read as asked: missing path, unreadable file, missing column."""


class InputChangedError(InputError):
    """The input differs from the one the output's ranges were planned on."""


class StageError(RayBatchError):
    """A stage returned something that cannot be written (wrong type or row count)."""


class StoreUnavailableError(RayBatchError):
    """A store kept failing with errors that a later try may not meet (throttling, 5xx, timeouts,
    resets) past the retries within the try, or a write's outcome could not be resolved.

    Retryable: nothing whose outcome is unknown was deleted or counted, so a retry resumes safely.
    """


class ResourcesUnavailableError(RayBatchError):
    """The Ray cluster lacks, for now, resources it had or may get (a lost node, an autoscaler
    still adding one), and did not get them back within the wait.

    Retryable: a request that no node of the cluster could ever satisfy is a :class:`ConfigError`.
    """


class NoProgressError(RayBatchError):
    """The pipeline committed no range and delivered no batch for ``progress_timeout`` seconds (a hung predictor).

    Retryable: the committed ranges stay, Ray's processes of the run are stopped, and a retry
    resumes after the committed ranges.
    """


class TooManyErrorsError(NotRetryableError):
    """More rows failed in a model than ``max_error_fraction`` allows.

    The failed rows are committed to the rejects with their errors, so a retry of the same
    output would count the same errors and fail the same way: fix the cause, then rerun with
    ``mode="overwrite"``.
    """


class OutputSchemaError(StageError, NotRetryableError):
    """A range's output (or rejects) does not have the output's recorded schema; nothing of it is committed.

    The committed ranges fix the output's schema, so a retry of the same stages fails the same way:
    fix the stage, then rerun with ``mode="overwrite"``.
    """


class RowKeyError(StageError, NotRetryableError):
    """The ``id_column`` of a range is not a row key: null or duplicated ids, or a type a stage changed."""


class OutputBusyError(RayBatchError):
    """Another writer holds the output's lease; retrying later may pass once it has finished or died."""


class LeaseLostError(RayBatchError):
    """This writer's lease was taken over: it must publish and commit nothing more."""


class RayJobsError(RayBatchError):
    """A Ray cluster's Jobs API could not be reached or refused a request; the message says why."""


class JobDeadlineExceeded(RayJobsError):
    """The task's deadline passed while its Ray job was still running."""


class JobAlreadyExists(RayJobsError):
    """A job with this submission id exists already (another try submitted it)."""
