"""What a run did: the :class:`RunSummary` returned to XCom, and the :class:`Progress` that counts it.

Its figures, defined once (the output's status and the UI name them the same):

- **scoring rate** (``scoring_rows_per_s``): rows the last stage scored per second since the try's
  stages started;
- **commit rate** (``commit_rows_per_s``): input rows committed (written or rejected) per second,
  from the try's stages' start to its last commit;
- **wall time** (``seconds``): the run's start to its end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any

from airflow_provider_raybatch.pipeline.columns import COUNT_KEYS, TOKEN_KEYS
from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord, by_writer
from airflow_provider_raybatch.pipeline.errors import TooManyErrorsError
from airflow_provider_raybatch.pipeline.planning.planner import Plan
from airflow_provider_raybatch.pipeline.store.retries import seconds_from_env

log = logging.getLogger(__name__)

#: Seconds between two progress lines while the stages run.
PROGRESS_INTERVAL_S = 10.0
#: Environment variable: another interval, in seconds (0: a line at the end only).
PROGRESS_INTERVAL_ENV = "RAYBATCH_PROGRESS_INTERVAL_S"


def progress_interval() -> float:
    """:data:`PROGRESS_INTERVAL_S`, or the value of :data:`PROGRESS_INTERVAL_ENV`."""
    return seconds_from_env(PROGRESS_INTERVAL_ENV, PROGRESS_INTERVAL_S)


@dataclass(frozen=True)
class RunSummary:
    """The counts of one run (or, combined, of the shards of a mapped run); JSON as a dict.

    :param rows_in: rows of the input (of the shard's ranges, for a shard).
    :param rows_out: rows in the output's committed part files.
    :param rows_rejected: rows in the rejects (invalid input and engine errors).
    :param engine_errors: rejected rows that failed in a model.
    :param rows_processed: rows this run committed (written or rejected; committed ranges skipped
        are not counted), of which ``rows_rejected_processed`` rejected.
    :param ranges_total: ranges of the plan (of the shard).
    :param ranges_done: ranges this run committed.
    :param ranges_skipped: ranges committed by an earlier run; ``rows_skipped`` their input rows.
    :param skipped_by: who committed them: ``{"writer": ..., "ranges": n, "rows": n}`` per earlier
        try (:meth:`.commit_record.CommitWriter.describe`; ``"unknown"`` for records of an older
        release), in the order of their commits.
    :param seconds: the run's wall time, its start to its end.
    :param commit_rows_per_s: this run's commit rate (see the module's docstring; None: it committed none).
    :param scoring_rows_per_s: this run's scoring rate (None: its stages did not run).
    :param shards: how many shard summaries were combined (None for one run).
    :param ray_submission_id: the Ray Job that ran it, on a cluster.
    :param table_version: a table output's version after the run: Delta's table version, or
        Iceberg's current snapshot id.
    :param tokens_in: prompt tokens of the output's committed rows (of every try that committed
        some), where a model counted them (LLM engines); None: none counted.
    :param tokens_out: generated tokens of the output's committed rows, likewise.
    :param tokens_out_processed: generated tokens of the ranges this run committed (the
        ``tokens_per_second`` of the run).
    :param truncated_rows: rows of the output's committed ranges whose text a model cut to its
        maximum length (embedding engines that count it); None: not counted.
    """

    output_path: str
    rows_in: int = 0
    rows_out: int = 0
    rows_rejected: int = 0
    engine_errors: int = 0
    rows_processed: int = 0
    rows_rejected_processed: int = 0
    ranges_total: int = 0
    ranges_done: int = 0
    ranges_skipped: int = 0
    rows_skipped: int = 0
    skipped_by: list[dict[str, Any]] | None = None
    seconds: float = 0.0
    commit_rows_per_s: float | None = None
    scoring_rows_per_s: float | None = None
    shards: int | None = None
    ray_submission_id: str | None = None
    table_version: int | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_out_processed: int | None = None
    truncated_rows: int | None = None

    @property
    def tokens_per_second(self) -> float | None:
        """Tokens generated per second by this run (None where no model counted tokens)."""
        if self.tokens_out_processed is None:
            return None
        return round(self.tokens_out_processed / self.seconds, 1) if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The XCom / asset-event form; optional fields appear only when set."""
        data = {k: v for k, v in asdict(self).items() if v is not None}
        data["seconds"] = round(self.seconds, 3)
        if self.tokens_per_second is not None:
            data["tokens_per_second"] = self.tokens_per_second
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSummary:
        names = {f.name for f in fields(cls)}
        # ``partitions``: the name of ``shards`` in summaries of earlier versions (XCom, asset events).
        data = {"shards" if k == "partitions" else k: v for k, v in data.items()}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def combine(cls, summaries: Iterable[RunSummary | Mapping[str, Any]]) -> RunSummary:
        """One summary for the shards of a mapped run (their XCom dicts or summaries).

        Counts add up; shards run side by side, so the slowest one is the run's duration, and the
        rates add up (each shard's over its own time).
        """
        parts = [s if isinstance(s, RunSummary) else cls.from_dict(s) for s in summaries]
        # Every count field, so that a count added later is combined too.
        counts = {f.name: sum(getattr(p, f.name) for p in parts) for f in fields(cls) if f.type == "int"}
        for name in COUNT_FIELDS:  # counted in some shards, or in none
            counted = [getattr(p, name) for p in parts if getattr(p, name) is not None]
            counts[name] = sum(counted) if counted else None
        skipped: dict[str, list[int]] = {}
        for part in parts:
            for entry in part.skipped_by or ():
                count = skipped.setdefault(entry["writer"], [0, 0])
                count[0] += entry["ranges"]
                count[1] += entry["rows"]
        rates = {
            name: round(sum(rated), 1) if (rated := [getattr(p, name) for p in parts if getattr(p, name)]) else None
            for name in ("commit_rows_per_s", "scoring_rows_per_s")
        }
        return cls(
            output_path=parts[0].output_path if parts else "",
            **counts,
            skipped_by=[{"writer": w, "ranges": r, "rows": n} for w, (r, n) in skipped.items()] or None,
            seconds=max((p.seconds for p in parts), default=0.0),
            **rates,
            shards=len(parts),
        )


#: The summary's counts of what a model counted (tokens, truncated rows): None where none counted them.
COUNT_FIELDS = (*COUNT_KEYS, "tokens_out_processed")


class Progress:
    """Counts committed ranges and rows scored; logs a progress line on a clock (:meth:`clock`) and at the end.

    A line every :func:`progress_interval` seconds from the moment the stages start, whether or not
    a range committed since, and one when the last range commits; never one per commit, so a burst
    of commits does not fill the log.
    """

    def __init__(self, plan: Plan, committed: Mapping[str, CommitRecord]):
        self.plan = plan
        self.started = time.monotonic()
        self.last_log = self.started
        self.skipped = len(committed)
        self.rows_skipped = sum(r.input_rows for r in committed.values())
        self.skipped_by = skipped_by(committed.values())
        self.rows_out = sum(r.rows for r in committed.values())
        self.rows_rejected = sum(r.rejected for r in committed.values())
        self.rows_rejected_skipped = self.rows_rejected
        self.engine_errors = sum(r.engine_errors for r in committed.values())
        #: What a model counted in the committed ranges, by key (None: none counted), and the
        #: generated tokens of this run's commits.
        self.counts = count_totals(committed.values())
        self.tokens_out_processed: int | None = None
        self.done = 0
        self.rows_processed = 0
        #: Rows of this run in files the write steps reported (committed or not yet).
        self.rows_written = 0
        #: (range id, time.monotonic()) of this run's latest commit, for the no-progress watchdog;
        #: its commit record's time (wall clock), for the commit rate.
        self.last_commit: tuple[str, float] | None = None
        self.last_committed_at: float | None = None
        #: Rows the last stage has scored in this run, as its replicas report them (see :meth:`clock`).
        self._scored: Callable[[], int] = lambda: 0
        #: When the stages started and ended (time.monotonic()), and the wall time they started at.
        self.stages_started: float | None = None
        self.stages_ended: float | None = None
        self.stages_started_at: float | None = None
        self._lock = threading.Lock()  # the driver's thread, the flushing thread and the clock's

    @property
    def rows_reached(self) -> int:
        """Rows that reached a model: written, or rejected with an engine error."""
        return self.rows_out + self.engine_errors

    @property
    def rows_scored(self) -> int:
        """Rows of this run through the last stage: as its replicas report them, or written, or committed."""
        return max(self._scored(), self.rows_written, self.rows_processed)

    def commit_rate(self) -> float | None:
        """This run's commit rate: rows committed from its stages' start to its last commit, by the
        commit records' own times (as the output's status measures it)."""
        start, end = self.stages_started_at, self.last_committed_at
        if start is None or end is None or end <= start:
            return None
        return self.rows_processed / (end - start)

    def scoring_rate(self) -> float | None:
        """This run's scoring rate: rows scored since its stages started (to their end, once ended)."""
        if self.stages_started is None:
            return None
        end = self.stages_ended if self.stages_ended is not None else time.monotonic()
        return self.rows_scored / max(end - self.stages_started, 1e-9)

    def committed(self, index: int, record: CommitRecord | None = None) -> None:
        """Count the range ``index`` of the plan as committed, by its commit record (None: all its rows out)."""
        row_range = self.plan.ranges[index]
        record = record or CommitRecord(row_range.id, (), row_range.rows)
        self.last_commit = (row_range.id, time.monotonic())
        self.last_committed_at = record.committed_at if record.committed_at is not None else time.time()
        self.done += 1
        self.rows_processed += record.input_rows
        self.rows_out += record.rows
        self.rows_rejected += record.rejected
        self.engine_errors += record.engine_errors
        self.counts = count_totals([record], self.counts)
        if record.tokens != (None, None):
            self.tokens_out_processed = (self.tokens_out_processed or 0) + (record.tokens_out or 0)
        if self.skipped + self.done == len(self.plan.ranges):
            self.log_line()

    @contextmanager
    def clock(self, scored: Callable[[], int] | None = None) -> Iterator[None]:
        """Log a progress line every :func:`progress_interval` seconds meanwhile (the stages are running).

        :param scored: the rows the last stage has scored so far in this run (read on the clock's
            thread; it must not raise); None: rows written and committed only.
        """
        interval = progress_interval()
        if scored is not None:
            self._scored = scored
        self.stages_started = self.last_log = time.monotonic()
        self.stages_started_at = time.time()
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(max(0.0, self.last_log + interval - time.monotonic())):
                if time.monotonic() - self.last_log >= interval:
                    self.log_line()

        thread = threading.Thread(target=tick, name="raybatch-progress", daemon=True) if interval > 0 else None
        if thread is not None:
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join()
            self.stages_ended = time.monotonic()

    def log_line(self) -> None:
        """Log where the run stands: committed ranges and rows, rows scored (when ahead), the
        scoring and commit rates, time left."""
        with self._lock:
            now = time.monotonic()
            self.last_log = now
            done_rows = self.rows_out + self.rows_rejected
            # Scored rows of the whole output: the earlier tries' committed ones, and this run's.
            scored = self.rows_skipped + self.rows_scored
            scoring = self.scoring_rate()
            commit = self.commit_rate()
            left = max(self.plan.total_rows - scored, 0)
            rejected = f" ({self.rows_rejected} rejected)" if self.rows_rejected else ""
            ahead = f", {scored} scored" if scored > done_rows else ""
            rates = f", scoring rate {scoring:.0f} rows/s" if scoring is not None else ""
            rates += f", commit rate {commit:.0f} rows/s" if commit is not None else ""
            # Before the first rows are scored (a model still loading) there is no rate to go by.
            eta = f"about {left / scoring:.0f}s left" if scoring else "time left not known yet"
            eta = eta if left else "about 0s left"
            counted = ""
            tokens_in, tokens_out = self.counts["tokens_in"], self.counts["tokens_out"]
            if tokens_in is not None and self.stages_started is not None:
                # Of committed ranges only, as the output holds them; the rate is this run's.
                generated = (self.tokens_out_processed or 0) / max(now - self.stages_started, 1e-9)
                counted = f", tokens {tokens_in} in, {tokens_out} out ({generated:.0f} generated/s)"
            if self.counts["truncated_rows"] is not None:
                counted += f", {self.counts['truncated_rows']} rows truncated"
            log.info(
                "Committed %d/%d ranges, %d/%d rows%s%s%s%s, %s",
                self.skipped + self.done,
                len(self.plan.ranges),
                done_rows,
                self.plan.total_rows,
                rejected,
                ahead,
                rates,
                counted,
                eta,
            )

    def check_errors(self, max_error_fraction: float, output_path: str, *, final: bool) -> None:
        """Fail when more rows failed in a model than ``max_error_fraction`` allows, over the whole output.

        Before the end (``final=False``) it fails only once the errors alone exceed the fraction of
        every planned row: past that, the remaining rows cannot bring the share back under it.
        """
        reached = self.rows_reached
        bound = reached if final else self.plan.total_rows
        if self.engine_errors and self.engine_errors > max_error_fraction * bound:
            raise TooManyErrorsError(
                f"{self.engine_errors} of {reached} rows that reached a model failed "
                f"({self.engine_errors / max(reached, 1):.1%}), more than max_error_fraction={max_error_fraction:g}; "
                f"the errors are in {output_path.rstrip('/')}/_rejects/. A retry would count the same committed "
                "errors: fix the cause and rerun with mode='overwrite'."
            )

    def summary(self, output_path: str, seconds: float, table_version: int | None = None) -> RunSummary:
        commit, scoring = self.commit_rate(), self.scoring_rate()
        return RunSummary(
            output_path=output_path,
            rows_in=self.plan.total_rows,
            rows_out=self.rows_out,
            rows_rejected=self.rows_rejected,
            engine_errors=self.engine_errors,
            rows_processed=self.rows_processed,
            rows_rejected_processed=self.rows_rejected - self.rows_rejected_skipped,
            ranges_total=len(self.plan.ranges),
            ranges_done=self.done,
            ranges_skipped=self.skipped,
            rows_skipped=self.rows_skipped,
            skipped_by=self.skipped_by or None,
            seconds=seconds,
            commit_rows_per_s=None if commit is None else round(commit, 1),
            scoring_rows_per_s=None if scoring is None else round(scoring, 1),
            table_version=table_version,
            **self.counts,
            # A rerun that had nothing left to do generated none.
            tokens_out_processed=(self.tokens_out_processed or 0) if self.counts["tokens_in"] is not None else None,
        )


def skipped_by(records: Iterable[CommitRecord]) -> list[dict[str, Any]]:
    """Who committed ``records`` (ranges a run skips): per try, in the order of their commits."""
    return [
        {
            "writer": "unknown" if key is None else group[-1].writer.describe(),
            "ranges": len(group),
            "rows": sum(r.input_rows for r in group),
        }
        for key, group in by_writer(records).items()
    ]


def count_totals(
    records: Iterable[CommitRecord], start: Mapping[str, int | None] | None = None
) -> dict[str, int | None]:
    """What a model counted in commit records, summed by key, added to ``start`` (None where
    neither ``start`` nor any record counted it)."""
    totals = dict(start) if start is not None else dict.fromkeys(COUNT_KEYS)
    for record in records:
        for key, count in record.counts.items():
            if count is not None:
                totals[key] = (totals[key] or 0) + count
    if any(totals[key] is not None for key in TOKEN_KEYS):  # both, where one is (an embedding generates 0)
        totals.update({key: totals[key] or 0 for key in TOKEN_KEYS})
    return totals
