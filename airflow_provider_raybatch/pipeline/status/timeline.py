"""An output's commits over time: a timeline of rows done, and the current rate, from the commit
records' times (:class:`.output_status.OutputStatus` carries both)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord

#: Seconds of commits the current rate is measured over.
RATE_WINDOW_S = 120.0
#: Points of the timeline at most (a long run's are thinned evenly: a chart needs no more).
TIMELINE_POINTS = 500


@dataclass(frozen=True)
class TimelinePoint:
    """Cumulative figures at one commit time (seconds since the epoch): ranges, and input rows
    done (written or rejected)."""

    time: float
    ranges: int
    rows: int


def cumulative(committed: dict[str, CommitRecord]) -> list[TimelinePoint]:
    """Cumulative ranges and rows per commit time (records without one, of layout 1, are left out)."""
    by_time: dict[float, list[int]] = {}
    for record in committed.values():
        if (at := record.committed_at) is not None:
            point = by_time.setdefault(at, [0, 0])
            point[0] += 1
            point[1] += record.input_rows
    points, ranges, rows = [], 0, 0
    for at in sorted(by_time):
        ranges += by_time[at][0]
        rows += by_time[at][1]
        points.append(TimelinePoint(at, ranges, rows))
    return points


def current_rate(timeline: list[TimelinePoint], now: float | None, taken_at: float | None) -> float | None:
    """Rows per second over the last :data:`RATE_WINDOW_S` seconds: up to ``now`` while running
    (a stalled run's rate falls), else up to the last commit; never before the current writer took
    its lease (the gap after a killed try is not the rate). None without commits in the window."""
    if not timeline:
        return None
    end = timeline[-1].time if now is None else max(now, timeline[-1].time)
    start = end - RATE_WINDOW_S
    if taken_at is not None:
        start = max(start, taken_at)
    times = [p.time for p in timeline]
    before = bisect.bisect_right(times, start)  # points at or before the window's start
    if before == len(timeline):
        return 0.0 if now is not None else None
    if before == 0 and taken_at is None:
        # The window holds the first commits: measure from the first, whose rows were made before it.
        start = timeline[0].time
        base = timeline[0].rows
    else:
        base = timeline[before - 1].rows if before else 0
    if end <= start:
        return None
    return (timeline[-1].rows - base) / (end - start)


def thin(points: list[TimelinePoint], most: int) -> list[TimelinePoint]:
    """At most ``most`` points, evenly spaced by position, the last always kept."""
    if len(points) <= most:
        return points
    step = len(points) / (most - 1)
    return [points[int(i * step)] for i in range(most - 1)] + [points[-1]]
