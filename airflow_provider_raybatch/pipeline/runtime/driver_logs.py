"""What Ray itself writes in the driver's log (the Airflow task's, or a Ray Job's): readable, at its level.

An Airflow task's stderr reaches its log as ERROR lines, whatever was written there. Ray Data's
log records ("Starting execution", "Execution plan", "execution finished") go to stderr: its
``ray.data`` logger has a console handler there and does not propagate. Here they go through
Python's logging instead, at their own level (INFO and above: what the console handler showed),
so the task log shows them as what they are. Ray Data's own file handler stays: the full log,
DEBUG included, is in the Ray session's ``logs/ray-data/`` folder, whose path the "Starting
execution" line names.

What Ray writes to the driver's file descriptor 2 itself (its C++ core worker's ERROR lines, the
GCS's ``(pid=gcs_server)`` lines that Ray forwards to every driver) is sorted by level in
:mod:`.stderr_levels`: there, the core worker's line about the replicas' constructor arguments
(ray-project/ray#53727) is the one known to be harmless; every other line stays an error (on a
shared Ray, a GCS line may come from another task).
"""

from __future__ import annotations

import logging
import os
import sys

from airflow_provider_raybatch.pipeline.errors import provider_error_in

#: The least level of Ray Data's records that reach the task log (its console handler's).
RAY_DATA_TASK_LOG_LEVEL = logging.INFO
#: Ray Data's variable naming a logging configuration of the user's, which is then left as it is.
RAY_DATA_LOGGING_CONFIG_ENV = "RAY_DATA_LOGGING_CONFIG"
#: Ray Data's "log once" key of its warning that progress bars are off (they are, on purpose).
PROGRESS_BARS_OFF_KEY = "ray_data_progress_manager_disabled"
#: Formats a traceback as the standard library's handlers would.
_TRACEBACK = logging.Formatter()


class _ToTaskLog(logging.Handler):
    """Hands Ray Data's records to the root logger's handlers (the task log's), at their own level.

    Left out, as from Ray Data's console: records it marks hidden (the full stack traces, which
    its log file keeps), and its records about an exception that wraps one of the provider's own
    errors: the driver raises that error itself, so that its message comes first and once.

    Every record it sees leaves with its traceback as text (:func:`_traceback_as_text`).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        # Ray Data logs a task's failure with the exception, or while it handles it.
        errors = (record.exc_info[1] if record.exc_info else None, sys.exc_info()[1])
        _traceback_as_text(record)
        if getattr(record, "hide", False):
            return False
        return not any(error is not None and provider_error_in(error) is not None for error in errors)

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger().handle(record)


def _traceback_as_text(record: logging.LogRecord) -> None:
    """Put ``record``'s traceback into its message, as text, and drop the exception.

    Ray Data logs some failures with the exception, whose frames hold its executor, and so the
    failed run's replicas and the CPUs they reserve. A handler that keeps records (a test's log
    capture, a buffering handler) would keep those replicas alive as long as it keeps the record:
    changed in place, the record holds no frame, also for a handler that got it before this one.
    """
    if record.exc_info:
        record.msg = f"{record.getMessage()}\n{_TRACEBACK.formatException(record.exc_info)}"
        record.args, record.exc_info, record.exc_text = None, None, None


def route_ray_data_logs() -> None:
    """Ray Data's records on this driver go through Python's logging at their level, not to stderr.

    Call it after ``ray.data`` is imported (its import sets its logger up). The console handlers
    (stream handlers on stderr) are replaced by one that hands INFO and above to the root logger;
    the file handlers, which write the full log to the Ray session's ``logs/ray-data/``, stay.
    A configuration of the user's (``RAY_DATA_LOGGING_CONFIG``) is left as it is.
    Ray Data's warning that progress bars are off is spent ahead: this pipeline turns them off and
    logs its own progress.
    """
    from ray.util.debug import log_once

    log_once(PROGRESS_BARS_OFF_KEY)
    if os.environ.get(RAY_DATA_LOGGING_CONFIG_ENV):
        return  # the user's own configuration of Ray Data's logging
    logger = logging.getLogger("ray.data")
    for handler in list(logger.handlers):
        if isinstance(handler, (logging.StreamHandler, _ToTaskLog)) and not isinstance(handler, logging.FileHandler):
            logger.removeHandler(handler)
    forward = _ToTaskLog(RAY_DATA_TASK_LOG_LEVEL)
    logger.addHandler(forward)
