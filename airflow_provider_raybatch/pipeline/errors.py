"""The provider's errors, all under :class:`RayBatchError`; each message names the path, column,
stage, connection or setting at fault.

Retryable unless a :class:`NotRetryableError`: the operator fails a task at once on one of those
(a retry would fail the same way) and lets Airflow retry any other.
"""

from __future__ import annotations

import re

#: Exit status of a Ray Job that failed with a :class:`NotRetryableError`.
NOT_RETRYABLE_EXIT = 3
#: Prefix of the log line that carries a :class:`NotRetryableError`'s message out of a Ray Job.
ERROR_PREFIX = "raybatch error: "


class RayBatchError(Exception):
    """Base class of the provider's own errors."""

    def __init__(self, *args: object):
        super().__init__(*args)
        #: The message as raised (kept across pickling, as the instance's attributes are): Ray Data
        #: appends its retry advice to the ``args`` of an error raised in its tasks.
        self.message = str(args[0]) if args else ""

    def as_raised(self) -> RayBatchError:
        """This error with its message as raised, without what Ray appended to it on the way."""
        if self.message and self.args and self.args[0] != self.message:
            self.args = (self.message, *self.args[1:])
        return self


class OutputNotFoundError(RayBatchError):
    """What a reader names holds no output of this provider: nothing planned at a path, no writer
    of a table's partition, or (the UI plugin, which answers it as HTTP 404) no such DAG, run or
    task, or a task that writes no output."""


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


class StageError(NotRetryableError):
    """A stage broke its contract: it returned something that cannot be written (wrong type or row
    count, a missing or reserved column).

    Not retryable: the same predictor on the same rows returns the same thing. Raised on a Ray
    worker; the driver raises it again as it was, not wrapped in Ray's task error.
    """


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


class LocalRayDiedError(RayBatchError):
    """The host's shared local Ray died under the run (its head was killed, e.g. by the out-of-memory killer, or
    crashed); the message names the head, how it exited and its log.

    Retryable: the committed ranges stay, and the retry starts a new head and resumes after them.
    """


class OutputBusyError(RayBatchError):
    """Another writer holds the output's lease; retrying later may pass once it has finished or died."""


class LeaseLostError(RayBatchError):
    """This writer's lease was taken over: it must publish and commit nothing more."""


def provider_error_in(error: BaseException) -> RayBatchError | None:
    """The provider's own error that ``error`` is or wraps, or None.

    Ray raises a worker's exception on the driver as a ``RayTaskError`` whose ``cause`` is the
    original, and whose text repeats the original's message inside the worker's traceback; Ray
    Data may chain it behind its own ``UserCodeException``. The original's message alone says what
    is wrong, and its class whether a retry can help.
    """
    seen: set[int] = set()
    pending = [error]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        cause = getattr(current, "cause", None)  # a RayTaskError: the worker's exception
        if isinstance(cause, BaseException) and cause is not current:
            if (found := provider_error_in(cause)) is None:
                # A Ray task's error wrapped in Ray Data's UserCodeException arrives without its
                # cause (pickling drops ``__cause__``): only the worker's traceback text names it.
                found = _from_traceback_text(str(current))
            if found is not None:
                return found
            continue
        if isinstance(current, RayBatchError):
            return current
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
    return None


def _from_traceback_text(text: str) -> RayBatchError | None:
    """The last of the provider's errors that a worker's traceback text shows, made again; or None."""
    found = None
    for match in re.finditer(rf"^{re.escape(__name__)}\.(\w+): (.+?)(?=\n\n|\Z)", text, re.MULTILINE | re.DOTALL):
        cls = globals().get(match.group(1))
        if isinstance(cls, type) and issubclass(cls, RayBatchError):
            found = cls(match.group(2).strip())
    return found
