"""The no-progress watchdog: fail a run whose pipeline has stopped moving.

A predictor that never returns from one batch holds the run until Airflow's
``execution_timeout``, or forever without one. While the stream runs, a thread watches for a
batch reaching the driver (:meth:`Watchdog.beat`) or a range being committed
(:attr:`Progress.last_commit`). After ``progress_timeout`` seconds with neither it names the
stage holding the unfinished batches and the last commit, stops Ray Data's executor (which
kills the stages' actors, the hung one included, and ends the stream), and the run fails with
the retryable :class:`~airflow_provider_raybatch.pipeline.errors.NoProgressError`. The committed
ranges stay; a retry resumes after them.

A driver stuck outside Ray Data (a storage call that never returns) is not freed by stopping the
executor: after :data:`GRACE_S` the error is raised in the consuming thread with
``PyThreadState_SetAsyncExc``, which takes effect when that thread next runs Python code. Not a
signal: it reaches whichever thread consumes the stream, and Airflow's task process leaves
SIGINT at its default action, where ``_thread.interrupt_main()`` does nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from airflow_provider_raybatch.pipeline import ray_compat
from airflow_provider_raybatch.pipeline.config import Stage, TransformStage
from airflow_provider_raybatch.pipeline.errors import NoProgressError
from airflow_provider_raybatch.pipeline.runtime.async_raise import raise_in
from airflow_provider_raybatch.pipeline.summary import Progress

log = logging.getLogger(__name__)

#: The longest pause between two checks (shorter for a short timeout).
CHECK_INTERVAL_S = 5.0
#: Seconds the consuming thread gets to leave the stream once the executor is stopped.
GRACE_S = 30.0
#: Seconds the watchdog's thread gets to finish stopping the executor when the stream is left.
JOIN_S = 60.0


class _Stalled(BaseException):
    """Raised asynchronously in a stuck consuming thread; converted to NoProgressError on the way out.

    A BaseException, as KeyboardInterrupt is, so that no ``except Exception`` on the way swallows it.
    """


class Watchdog:
    """Watches a streaming run: ``with Watchdog(...) as watchdog:`` around the loop consuming the stream.

    :param timeout: seconds without a batch or a commit before the run fails; None: never.
    :param progress: the run's progress, told of every commit.
    :param stages: the run's stages, to name the one that holds the unfinished batches.
    :param dataset: the Ray dataset being consumed, to report and stop its executor. Its own
        no-progress guard (``execution_no_progress_timeout_s``, 30 minutes by default) is turned
        off, so that ``timeout`` alone decides. None: no dataset (the error is raised in the
        consuming thread at once).
    """

    def __init__(self, timeout: float | None, progress: Progress, stages: list[Stage], dataset: Any = None):
        self.timeout, self.progress, self.stages, self.dataset = timeout, progress, stages, dataset
        self.stall: str | None = None  # what the watchdog saw when it stopped the run
        self._last_beat = time.monotonic()
        self._lock = threading.Lock()
        self._left = threading.Event()  # the consuming thread has left the watched block
        self._interrupted = False
        self._thread: threading.Thread | None = None
        self._consumer = threading.get_ident()
        if dataset is not None:
            dataset.context.execution_no_progress_timeout_s = -1

    def beat(self) -> None:
        """A batch reached the driver."""
        self._last_beat = time.monotonic()

    def __enter__(self) -> Watchdog:
        self._consumer = threading.get_ident()
        self._last_beat = time.monotonic()
        if self.timeout is not None:
            self._thread = threading.Thread(target=self._watch, name="raybatch-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._lock:
            self._left.set()
            if self._interrupted and exc_type is not _Stalled:
                raise_in(self._consumer, None)  # left the block before the raise took effect: withdraw it
        if self._thread is not None:
            self._thread.join(JOIN_S)
        if self.stall is None:
            return
        if exc_type is None and self.progress.skipped + self.progress.done == len(self.progress.plan.ranges):
            return  # the stream ended as the watchdog fired, with every range committed
        # Written now: ranges the driver had received in full are committed while the stream unwinds.
        error = NoProgressError(
            f"{self.stall}; {self._last_commit()}. Ray's processes of this run are stopped; a retry resumes after "
            "the committed ranges. If a batch can take this long, raise progress_timeout (None disables it)"
        )
        raise error from (None if exc_type is _Stalled else exc)

    def idle_seconds(self) -> float:
        """Seconds since the last batch reached the driver or the last range was committed."""
        last = self._last_beat
        if self.progress.last_commit is not None:
            last = max(last, self.progress.last_commit[1])
        return time.monotonic() - last

    def _watch(self) -> None:
        warned = False
        while not self._left.wait(min(self.timeout / 4, CHECK_INTERVAL_S)):
            idle = self.idle_seconds()
            if idle < self.timeout / 2:
                warned = False
            elif not warned and idle < self.timeout:
                warned = True
                log.warning(
                    "No range committed and no batch received for %.0fs: %s; the run fails as stalled "
                    "after progress_timeout=%gs",
                    idle,
                    self.describe(),
                    self.timeout,
                )
            elif idle >= self.timeout:
                self._fire(idle)
                return

    def _fire(self, idle: float) -> None:
        stall = (
            f"no range committed and no batch received for {idle:.0f}s (progress_timeout={self.timeout:g}s): "
            f"{self.describe()}"
        )
        with self._lock:
            if self._left.is_set():
                return
            log.error("Stopping the run: %s; %s", stall, self._last_commit())
            self.stall = stall
        try:
            executor = ray_compat.streaming_executor(self.dataset)
            if executor is not None:
                # What Ray Data's iterator does when its consumer stops early: with force, the
                # actors are killed (a hung call never returns) and the stream ends.
                executor.shutdown(force=True, exception=NoProgressError(stall))
        except Exception as e:  # noqa: BLE001 - the raise below still ends the run
            log.warning("Could not stop Ray Data's executor: %s", e)
            executor = None
        if executor is not None and self._left.wait(GRACE_S):
            return
        with self._lock:
            if not self._left.is_set():
                self._interrupted = True
                raise_in(self._consumer, _Stalled)

    def _last_commit(self) -> str:
        committed = self.progress.skipped + self.progress.done
        of = f"{committed} of {len(self.progress.plan.ranges)} ranges committed"
        if self.progress.last_commit is None:
            return f"this run has committed no range yet ({of})"
        range_id, at = self.progress.last_commit
        ago = time.monotonic() - at
        when = datetime.fromtimestamp(time.time() - ago, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"the last commit was range {range_id} at {when}, {ago:.0f}s ago ({of})"

    def describe(self) -> str:
        """Which stage holds the unfinished batches, from the state of Ray Data's executor."""
        names = ", ".join(repr(s.display_name) for s in self.stages)
        try:
            executor = ray_compat.streaming_executor(self.dataset)
            operators = None if executor is None else ray_compat.executor_operators(executor)
        except Exception as e:  # noqa: BLE001 - a report must not fail the watchdog: say what is known
            log.debug("Cannot read Ray Data's executor state", exc_info=e)
            operators = None
        if operators is None:
            return f"Ray Data's executor state is not available (stages: {names})"
        labels = _labels([op for op, _ in operators], self.stages)
        facts = []
        for (op, state), label in zip(operators, labels, strict=True):
            if op.has_completed():
                continue
            parts = []
            if op.num_active_tasks():
                parts.append(f"{op.num_active_tasks()} task(s) in flight that have not returned")
            pools = op.get_autoscaling_actor_pools() if hasattr(op, "get_autoscaling_actor_pools") else []
            if pending := sum(pool.num_pending_actors() for pool in pools):
                parts.append(f"{pending} replica(s) still starting (loading, or waiting for resources)")
            if queued := state.total_enqueued_input_blocks():
                parts.append(f"{queued} block(s) queued")
            if parts:
                facts.append(f"{label}: {', '.join(parts)}")
        return "; ".join(facts) or "no stage has work in flight (the driver itself is stuck, e.g. writing to storage)"


def _labels(operators: list[Any], stages: list[Stage]) -> list[str]:
    """How to name each operator: by the stages (or the reading) it runs, with Ray's name when not plain.

    Ray Data fuses steps into one operator (a transform's task step into the next stage's
    actors); a transform stage's own steps carry no stage of ours, and lie between the stages
    around them.
    """
    steps = []  # (operator position, logical operator, index of its stage or None), in pipeline order
    for position, op in enumerate(operators):
        for logical in getattr(op, "_logical_operators", None) or []:
            stage = (getattr(logical, "fn_constructor_kwargs", None) or {}).get("stage")
            steps.append(
                (position, logical, stages.index(stage) if isinstance(stage, Stage) and stage in stages else None)
            )
    names: list[list[str]] = [[] for _ in operators]
    for k, (position, logical, index) in enumerate(steps):
        if index is not None:
            name = f"stage {stages[index].display_name!r}"
        elif "Read" in getattr(logical, "name", ""):
            name = "reading the input"
        elif "write_block" in getattr(logical, "name", ""):
            name = "writing the range files"
        else:
            before = max((i for _, _, i in steps[:k] if i is not None), default=-1)
            after = min((i for _, _, i in steps[k + 1 :] if i is not None), default=len(stages))
            around = [repr(s.display_name) for s in stages[before + 1 : after] if isinstance(s, TransformStage)]
            name = f"stage {' or '.join(around)}" if around else ""
        if name and name not in names[position]:
            names[position].append(name)
    labels = []
    for op, own in zip(operators, names, strict=True):
        if not own:
            labels.append(f"Ray Data's {op.name}")
        elif len(own) == 1 and len(getattr(op, "_logical_operators", None) or []) == 1:
            labels.append(own[0])
        else:
            labels.append(f"{' and '.join(own)} (Ray Data's {op.name})")
    return labels
