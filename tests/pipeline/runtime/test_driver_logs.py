"""Ray Data's records on the driver, handed on to the task log (no Ray started: its loggers alone)."""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Iterator
from logging.handlers import BufferingHandler

import pytest

from airflow_provider_raybatch.pipeline.errors import StageError
from airflow_provider_raybatch.pipeline.runtime.driver_logs import route_ray_data_logs


@pytest.fixture
def handlers() -> Iterator[tuple[list[logging.LogRecord], list[logging.LogRecord]]]:
    """What a handler that keeps records keeps: one on Ray Data's logger, ahead of the provider's;
    one on the root logger (the task log's), which gets what the provider's hands on."""
    import ray.data  # noqa: F401  (its import sets its logger up, to which the routing applies)

    route_ray_data_logs()
    ahead, task_log = BufferingHandler(capacity=100), BufferingHandler(capacity=100)
    ray_data, root = logging.getLogger("ray.data"), logging.getLogger()
    ray_data.handlers.insert(0, ahead)
    root.addHandler(task_log)
    yield ahead.buffer, task_log.buffer
    ray_data.removeHandler(ahead)
    root.removeHandler(task_log)


class Executor:
    """Stands for Ray Data's executor, which holds the run's replicas."""


def log_failure(error: type[Exception], executor: Executor) -> None:
    """Log a failure as Ray Data does, from a frame that holds ``executor`` as Ray Data's hold its own."""
    try:
        raise error("the task failed")
    except Exception:
        logging.getLogger("ray.data.exceptions").exception("Full stack trace:")


def failures(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """The records of :func:`log_failure` (Ray Data's background threads in this process log too)."""
    return [r for r in records if r.name == "ray.data.exceptions"]


@pytest.mark.parametrize("error", [RuntimeError, StageError])
def test_a_record_with_a_traceback_keeps_no_frame_in_any_handler(handlers, error):
    """Ray Data logs some failures with the exception: its frames hold the executor, and with it
    the failed run's replicas. A handler that keeps records must not keep them, whether it got the
    record before the provider's handler or after (the task log's), and whether the record goes on
    to the task log or not (an error of the provider's own: the driver raises it itself)."""
    ahead, task_log = handlers
    executor = Executor()
    alive = weakref.ref(executor)
    log_failure(error, executor)
    del executor
    gc.collect()

    (record,) = failures(ahead)
    assert record.levelno == logging.ERROR and record.exc_info is None
    message = record.getMessage()
    assert message.startswith("Full stack trace:\nTraceback (most recent call last):")
    assert "in log_failure" in message and message.endswith(f"{error.__name__}: the task failed")
    assert alive() is None, "a kept record kept the failed frames, and what they hold"
    assert failures(task_log) == ([] if error is StageError else [record])


@pytest.mark.parametrize("args", [(), ("dataset_1",)])
def test_a_record_without_a_traceback_is_handed_on_as_it_is(handlers, args):
    _, task_log = handlers
    logging.getLogger("ray.data._internal.execution.streaming_executor").info(
        "Starting %s" if args else "Started", *args
    )
    (record,) = [r for r in task_log if r.name == "ray.data._internal.execution.streaming_executor"]
    assert record.getMessage() == ("Starting dataset_1" if args else "Started") and record.args == args
