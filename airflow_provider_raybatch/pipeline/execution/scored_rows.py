"""Rows scored so far, told by the last stage's replicas to the driver for its progress lines.

A replica hands on its rows a run of whole ranges at a time (see :class:`.stages.StageWorker`):
with large ranges or a slow model, minutes pass before the driver hears of a written row. Each
replica of the last stage therefore stores its running count in Ray's key-value store (at most
every :data:`REPORT_INTERVAL_S`), under a prefix of the run's own; the driver sums them when it
logs a line. A count is a report, never a commitment: a replaced replica's rows may be counted
twice, and what is committed is counted by the commits alone.
"""

from __future__ import annotations

import time
from uuid import uuid4

from airflow_provider_raybatch.pipeline import ray_compat

#: Seconds between two reports of one replica: a key-value write per replica per second at most.
REPORT_INTERVAL_S = 1.0


class ScoredRowsReporter:
    """On a replica: counts the rows it scored and stores the count under a key of its own.

    :param prefix: the run's prefix (:attr:`ScoredRows.prefix`).
    """

    def __init__(self, prefix: str):
        self.key = f"{prefix}{uuid4().hex}"
        self.rows = 0
        self._reported_at: float | None = None

    def add(self, rows: int) -> None:
        """``rows`` more were scored; stored now if the last report is :data:`REPORT_INTERVAL_S` old."""
        self.rows += rows
        now = time.monotonic()
        if self._reported_at is None or now - self._reported_at >= REPORT_INTERVAL_S:
            self._reported_at = now
            ray_compat.put_count(self.key, self.rows)


class ScoredRows:
    """On the driver: the run's prefix for its replicas' counts, and their sum."""

    def __init__(self) -> None:
        self.prefix = f"scored/{uuid4().hex}/"

    def __call__(self) -> int:
        """Rows the replicas have reported so far."""
        return ray_compat.sum_counts(self.prefix)

    def clear(self) -> None:
        """Remove the run's counts from the key-value store."""
        ray_compat.delete_counts(self.prefix)
