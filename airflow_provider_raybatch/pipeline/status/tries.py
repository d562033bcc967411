"""The tries that wrote an output, from its commit records' writers: what each committed, its
commit rate, and the output's average commit rate over the time its tries spent committing.

A try's commit rate is its input rows committed (written or rejected) over the time from its
stages' start to its last commit. The output's average counts the same rows over the time its
tries spent so (tries that ran side by side, a mapped run's shards, count once): the gap between a
killed try and its resume, or between a run and its rerun, is not counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord, by_writer


@dataclass(frozen=True)
class WritingTry:
    """A try that committed ranges of the output.

    :param writer: who (:meth:`.commit_record.CommitWriter.to_dict`); None for the records of an
        older release, which name no writer (counted together).
    :param ranges: ranges it committed; ``rows`` their input rows (written or rejected), of which
        ``rows_rejected`` rejected.
    :param started_at: when its stages started (for records without a writer: the first commit);
        ``last_commit_at`` its last commit.
    :param commit_rows_per_s: ``rows`` over ``last_commit_at - started_at`` (None: no time to measure).
    """

    writer: dict[str, Any] | None
    ranges: int
    rows: int
    rows_rejected: int
    started_at: float | None
    last_commit_at: float | None
    commit_rows_per_s: float | None

    @property
    def span(self) -> tuple[float, float] | None:
        if self.started_at is None or self.last_commit_at is None or self.last_commit_at <= self.started_at:
            return None
        return self.started_at, self.last_commit_at

    def is_task_try(self, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int | None) -> bool:
        """Whether the Airflow task instance's try ``try_number`` committed these."""
        w = self.writer or {}
        return (w.get("dag_id"), w.get("run_id"), w.get("task_id"), w.get("map_index"), w.get("try_number")) == (
            dag_id,
            run_id,
            task_id,
            map_index,
            try_number,
        )


def writing_tries(records: Iterable[CommitRecord]) -> list[WritingTry]:
    """The tries that committed ``records``, in the order of their last commit."""
    tries = []
    for key, group in by_writer(records).items():
        last = group[-1]  # its stages' start: a try's first records (of ranges without rows) may precede it
        times = [r.committed_at for r in group if r.committed_at is not None]
        started = last.writer.started_at if key is not None and last.writer.started_at is not None else None
        started = started if started is not None else min(times, default=None)
        ended = max(times, default=None)
        rows = sum(r.input_rows for r in group)
        measured = started is not None and ended is not None and ended > started
        tries.append(
            WritingTry(
                writer=None if key is None else last.writer.to_dict(),
                ranges=len(group),
                rows=rows,
                rows_rejected=sum(r.rejected for r in group),
                started_at=started,
                last_commit_at=ended,
                commit_rows_per_s=round(rows / (ended - started), 1) if measured else None,
            )
        )
    return sorted(tries, key=lambda t: t.last_commit_at or 0.0)


def average_commit_rate(tries: list[WritingTry]) -> float | None:
    """The tries' rows over the time they spent committing, their spans merged (None: no time to measure)."""
    spans = sorted(t.span for t in tries if t.span is not None)
    if not spans:
        return None
    total, (start, end) = 0.0, spans[0]
    for s, e in spans[1:]:
        if s > end:
            total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    total += end - start
    return round(sum(t.rows for t in tries if t.span is not None) / total, 1)
