"""RunSummary: the XCom form, and combining the shards of a mapped run."""

from __future__ import annotations

import logging
import re

import pyarrow as pa

from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord, CommitWriter
from airflow_provider_raybatch.pipeline.planning.planner import Plan, RowRange
from airflow_provider_raybatch.pipeline.summary import PROGRESS_INTERVAL_ENV, Progress, RunSummary


def test_the_xcom_form_has_the_documented_keys_and_round_trips():
    summary = RunSummary(
        "/out", rows_in=10, rows_out=8, rows_rejected=2, engine_errors=1, rows_processed=10, seconds=2.0
    )
    data = summary.to_dict()
    assert set(data) == {
        "output_path",
        "rows_in",
        "rows_out",
        "rows_rejected",
        "engine_errors",
        "rows_processed",
        "rows_rejected_processed",
        "ranges_total",
        "ranges_done",
        "ranges_skipped",
        "rows_skipped",
        "seconds",
    }  # no rows_per_second (rows over the wall time): the rates are commit_rows_per_s and scoring_rows_per_s
    assert RunSummary.from_dict(data) == summary
    assert RunSummary.from_dict({**data, "ray_submission_id": "j-0"}).to_dict()["ray_submission_id"] == "j-0"


def test_combining_shards_adds_every_count_and_keeps_the_slowest_time():
    parts = [
        RunSummary(
            "/out",
            rows_in=5,
            rows_out=4,
            rows_rejected=1,
            engine_errors=1,
            rows_processed=5,
            ranges_total=1,
            ranges_done=1,
            seconds=3.0,
        ),
        {
            "output_path": "/out",
            "rows_in": 7,
            "rows_out": 5,
            "rows_rejected": 2,
            "engine_errors": 0,
            "rows_processed": 7,
            "ranges_total": 2,
            "ranges_done": 1,
            "ranges_skipped": 1,
            "seconds": 1.0,
            "rows_per_second": 7.0,  # in a summary of an earlier version: read, not kept
            "ray_submission_id": "j-1",
        },
    ]
    combined = RunSummary.combine(parts)
    assert combined == RunSummary(
        "/out",
        rows_in=12,
        rows_out=9,
        rows_rejected=3,
        engine_errors=1,
        rows_processed=12,
        ranges_total=3,
        ranges_done=2,
        ranges_skipped=1,
        seconds=3.0,
        shards=2,
    )
    assert "rows_per_second" not in combined.to_dict()
    # A combined summary of an earlier version (XCom, an asset event's extra) called them partitions.
    old = {k: v for k, v in combined.to_dict().items() if k != "shards"}
    assert RunSummary.from_dict({**old, "partitions": 2}) == combined


def test_combining_shards_adds_their_rates_and_who_wrote_the_skipped_ranges():
    by = "dag / run / score map 0, try 1"
    parts = [
        RunSummary("/out", ranges_skipped=2, rows_skipped=20, skipped_by=[{"writer": by, "ranges": 2, "rows": 20}]),
        RunSummary("/out", rows_processed=30, commit_rows_per_s=10.0, scoring_rows_per_s=12.5, seconds=3.0),
        RunSummary("/out", rows_processed=20, commit_rows_per_s=5.0, scoring_rows_per_s=5.0, seconds=4.0),
        RunSummary("/out", ranges_skipped=1, rows_skipped=5, skipped_by=[{"writer": by, "ranges": 1, "rows": 5}]),
    ]
    combined = RunSummary.combine(parts)
    assert (combined.commit_rows_per_s, combined.scoring_rows_per_s) == (15.0, 17.5)  # shards run side by side
    assert combined.skipped_by == [{"writer": by, "ranges": 3, "rows": 25}] and combined.rows_skipped == 25
    assert RunSummary.from_dict(combined.to_dict()) == combined


def test_tokens_appear_only_where_counted_and_shards_add_them_up():
    counted = RunSummary("/out", rows_processed=4, seconds=2.0, tokens_in=400, tokens_out=90, tokens_out_processed=60)
    data = counted.to_dict()
    assert (data["tokens_in"], data["tokens_out"], data["tokens_per_second"]) == (400, 90, 30.0)
    assert RunSummary.from_dict(data) == counted
    plain = RunSummary("/out", rows_processed=4, seconds=2.0)
    assert not {"tokens_in", "tokens_out", "tokens_per_second"} & set(plain.to_dict())
    combined = RunSummary.combine([counted, plain, counted.to_dict()])
    assert (combined.tokens_in, combined.tokens_out, combined.tokens_out_processed) == (800, 180, 120)
    assert RunSummary.combine([plain, plain]).tokens_in is None


def test_truncated_rows_appear_only_where_counted_and_shards_add_them_up():
    counted = RunSummary("/out", rows_processed=4, tokens_in=40, tokens_out=0, tokens_out_processed=0, truncated_rows=3)
    none_cut = RunSummary(
        "/out", rows_processed=4, tokens_in=40, tokens_out=0, tokens_out_processed=0, truncated_rows=0
    )
    plain = RunSummary("/out", rows_processed=4)
    assert counted.to_dict()["truncated_rows"] == 3 and none_cut.to_dict()["truncated_rows"] == 0
    assert "truncated_rows" not in plain.to_dict() and RunSummary.from_dict(counted.to_dict()) == counted
    assert RunSummary.combine([counted, plain, none_cut.to_dict()]).truncated_rows == 3
    assert RunSummary.combine([plain, plain]).truncated_rows is None


def test_the_progress_line_and_summary_count_truncated_rows_of_earlier_and_own_commits(caplog, monkeypatch):
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "0")
    ranges = [RowRange(f"r-{i}", 0, 10 * i, 10 * (i + 1)) for i in range(3)]
    earlier = {"r-0": CommitRecord("r-0", (), 10, tokens_in=50, truncated_rows=2)}
    progress = Progress(Plan([], ranges, pa.schema([])), earlier)
    with caplog.at_level(logging.INFO, logger="airflow_provider_raybatch"), progress.clock():
        progress.committed(1, CommitRecord("r-1", (), 10, tokens_in=40, truncated_rows=0))
        progress.committed(2, CommitRecord("r-2", (), 10, tokens_in=60, truncated_rows=1))
    assert ", tokens 150 in, 0 out (0 generated/s), 3 rows truncated, " in caplog.records[-1].getMessage()
    summary = progress.summary("/out", 1.0)
    assert (summary.truncated_rows, summary.tokens_in, summary.tokens_out, summary.tokens_out_processed) == (
        3,
        150,
        0,
        0,
    )
    plain = Progress(Plan([], ranges, pa.schema([])), {})
    plain.committed(0)
    assert plain.summary("/out", 1.0).truncated_rows is None


def test_a_resumed_runs_progress_lines_never_show_fewer_scored_than_committed(caplog, monkeypatch):
    """Rows scored count the earlier tries' committed rows too: a line shows them only while ahead."""
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "0")
    ranges = [RowRange(f"r-{i}", 0, 100 * i, 100 * (i + 1)) for i in range(5)]
    earlier = {r.id: CommitRecord(r.id, (), 100, writer=CommitWriter("d/r/score/-1", 1)) for r in ranges[:3]}
    progress = Progress(Plan([], ranges, pa.schema([])), earlier)
    assert progress.skipped_by == [{"writer": "d / r / score, try 1", "ranges": 3, "rows": 300}]
    scored = [40]
    with caplog.at_level(logging.INFO, logger="airflow_provider_raybatch"), progress.clock(lambda: scored[0]):
        progress.log_line()  # 40 scored by this try, none committed yet
        scored[0] = 100
        progress.committed(3)  # its first range: as many committed as scored
        progress.log_line()
    first, second = (r.getMessage() for r in caplog.records)
    assert first.startswith("Committed 3/5 ranges, 300/500 rows, 340 scored, scoring rate ")
    assert "commit rate" not in first and "about" in first
    assert second.startswith("Committed 4/5 ranges, 400/500 rows, scoring rate ") and "scored," not in second
    assert re.search(r", commit rate \d+ rows/s, ", second), second
    summary = progress.summary("/out", 1.0)
    assert (summary.ranges_skipped, summary.rows_skipped, summary.rows_processed) == (3, 300, 100)
    assert summary.commit_rows_per_s > 0 and summary.scoring_rows_per_s > 0
