"""Commits: an output's commit records as its ledger reads them, and the timeline they give (time
to the first committed range, the steady rate between the first and the last)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord

MIN_COMMITS_FOR_RATE = 5  # fewer commits arrive too close together to give a meaningful rate


def commit_records(output: Path) -> list[CommitRecord]:
    """The output's commit records, as its ledger reads them (also while a run writes them)."""
    from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger

    return list(OutputLedger.open(str(output)).committed().values())


def commit_timeline(output: Path, started_at: float) -> dict[str, Any]:
    """When ranges were committed, from the commit times their records hold.

    ``first_commit_s``: seconds from the run's start to its first committed range (the fixed
    cost a task pays before any result is safe); ``steady_rows_per_s``: the rate between the
    first and the last commit, i.e. the pipeline's speed once running.
    """
    records = [(r.committed_at, r.rows) for r in commit_records(output) if r.committed_at is not None]
    records = sorted(r for r in records if r[0] >= started_at)
    if not records:
        return {}
    first, last = records[0][0], records[-1][0]
    rows_after_first = sum(rows for _, rows in records[1:])
    timeline = {"first_commit_s": round(first - started_at, 2), "last_commit_s": round(last - started_at, 2)}
    if len(records) >= MIN_COMMITS_FOR_RATE and last > first:
        timeline["steady_rows_per_s"] = round(rows_after_first / (last - first), 1)
    return timeline
