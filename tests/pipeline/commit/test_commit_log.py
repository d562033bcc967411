"""The commit records on their own: their encoding, which of two records wins, segments merged
as a writer goes, and what a failed record write leaves (by whether it is known not written)."""

from __future__ import annotations

import dataclasses
import json

import fsspec
import pytest

from airflow_provider_raybatch.pipeline.commit import commit_log
from airflow_provider_raybatch.pipeline.commit.commit_log import (
    SEGMENT_FANOUT,
    CommitLog,
    _add_records,
    _decode,
    _encode,
)
from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord, CommitWriter
from airflow_provider_raybatch.pipeline.errors import RayBatchError


def record(range_id: str, rows: int = 10, **extra) -> CommitRecord:
    return CommitRecord(range_id, (f"part-{range_id}.parquet",), rows, **extra)


def test_records_round_trip_through_their_short_rows_with_plans_run_length_encoded():
    records = [
        record("a-0-10", committed_at=1.5, plan="p1"),
        record("a-10-20", rejected=2, engine_errors=1, committed_at=1.5, plan="p1"),
        dataclasses.replace(
            record("a-20-30", plan="p2"), files=("part-a-20-30.parquet", "_rejects/part-a-20-30.parquet")
        ),
        record("a-30-40"),  # written by a version that named no plan
    ]
    encoded = _encode(records)
    assert encoded["plans"] == [["p1", 2], ["p2", 1], [None, 1]]
    assert encoded["records"][0] == ["a-0-10", 10, 0, 0, None, 1.5]  # the usual one file: null
    assert _decode(json.loads(json.dumps(encoded))) == {r.range_id: r for r in records}


def test_records_without_any_plan_keep_the_shape_earlier_versions_read():
    encoded = _encode([record("a-0-10"), record("a-10-20")])
    assert set(encoded) == {"version", "records"}
    assert all(len(row) == 6 for row in encoded["records"])


def test_token_counts_ride_beside_the_rows_only_where_a_model_counted_them():
    records = [
        record("a-0-10", tokens_in=120, tokens_out=30),
        record("a-10-20", rejected=1, engine_errors=1, tokens_in=0, tokens_out=0),  # counted: none spent
        record("a-20-30"),  # rows no model counted (a stage without tokens)
    ]
    encoded = _encode(records)
    assert encoded["tokens"] == [[120, 30], [0, 0], None]
    assert all(len(row) == 6 for row in encoded["records"])  # the shape earlier versions read
    assert _decode(json.loads(json.dumps(encoded))) == {r.range_id: r for r in records}
    assert "tokens" not in _encode([record("a-0-10")])


def test_truncated_rows_ride_beside_the_rows_where_counted_and_a_record_without_them_reads_none():
    records = [
        record("a-0-10", tokens_in=120, tokens_out=0, truncated_rows=3),
        record("a-10-20", tokens_in=80, tokens_out=0, truncated_rows=0),  # counted: none cut
        record("a-20-30"),  # rows no model counted
    ]
    encoded = _encode(records)
    # Tokens keep the pairs earlier versions read; the other counts are a key those versions skip.
    assert encoded["tokens"] == [[120, 0], [80, 0], None]
    assert encoded["counts"] == {"truncated_rows": [3, 0, None]}
    assert all(len(row) == 6 for row in encoded["records"])
    decoded = _decode(json.loads(json.dumps(encoded)))
    assert decoded == {r.range_id: r for r in records}
    assert [r.truncated_rows for r in decoded.values()] == [3, 0, None]
    # Records of an earlier version (no "counts"), and counts of a later one, read as not counted.
    older = _decode({k: v for k, v in encoded.items() if k != "counts"})
    assert [r.truncated_rows for r in older.values()] == [None, None, None]
    newer = _decode({**encoded, "counts": {**encoded["counts"], "later_count": [1, 2, 3]}})
    assert newer == decoded
    assert "counts" not in _encode([record("a-0-10", tokens_in=5, tokens_out=0)])
    # A per-range record (layout 1): a key where counted, which an older reader ignores.
    layout_1 = records[0].to_json()
    assert layout_1["truncated_rows"] == 3 and CommitRecord.from_json(layout_1) == records[0]
    assert "truncated_rows" not in record("a-0-10").to_json()
    assert CommitRecord.from_json({k: v for k, v in layout_1.items() if k != "truncated_rows"}).truncated_rows is None
    assert CommitRecord.from_json({**layout_1, "later_count": 7}) == records[0]


def test_each_record_names_its_writing_try_beside_the_rows_and_older_readers_skip_it(tmp_path):
    first = CommitWriter("dag/manual__1/score/-1", 1, None, "h", 11, 100.0)
    second = CommitWriter("dag/manual__1/score/-1", 2, None, "h", 12, 200.0)
    records = [
        record("a-0-10", committed_at=101.0, writer=first),
        record("a-10-20", committed_at=102.0, writer=first),
        record("a-20-30", committed_at=201.0, writer=second),
        record("a-30-40", committed_at=50.0),  # of an older release: writer unknown
    ]
    encoded = _encode(records)
    assert encoded["writers"] == [[first.to_json(), 2], [second.to_json(), 1], [None, 1]]
    assert all(len(row) == 6 for row in encoded["records"])  # the shape earlier versions read
    assert _decode(json.loads(json.dumps(encoded))) == {r.range_id: r for r in records}
    assert "writers" not in _encode([record("a-0-10")])
    # A per-range record (layout 1) keeps it as a key, which an older reader ignores.
    layout_1 = record("a-0-10", writer=first).to_json()
    assert CommitRecord.from_json(layout_1).writer == first
    assert CommitRecord.from_json({k: v for k, v in layout_1.items() if k != "writer"}).writer is None
    # The ledger names its writer in every record it writes.
    log = CommitLog(fsspec.filesystem("file"), str(tmp_path), str(tmp_path), str(tmp_path / "_raybatch"))
    log.writer = second
    log.record([record("b-0-10")])
    assert [r.writer for r in log.committed().values()] == [second]
    assert second.describe() == "dag / manual__1 / score, try 2"
    assert CommitWriter("dag/r/score/3", 1).to_dict()["map_index"] == 3


def test_of_two_records_of_a_range_the_later_committed_wins():
    records = {"a-0-10": record("a-0-10", rows=10, committed_at=2.0)}
    _add_records(records, {"a-0-10": record("a-0-10", rows=99, committed_at=1.0)})
    assert records["a-0-10"].rows == 10
    _add_records(records, {"a-0-10": record("a-0-10", rows=7, committed_at=3.0)})
    assert records["a-0-10"].rows == 7


@pytest.fixture
def log(tmp_path) -> CommitLog:
    fs = fsspec.filesystem("file")
    root = str(tmp_path / "out")
    fs.makedirs(f"{root}/_raybatch", exist_ok=True)
    return CommitLog(fs, root, root, f"{root}/_raybatch")


def segments(log: CommitLog) -> list[str]:
    return sorted(p.rsplit("/", 1)[-1] for p in log.fs.ls(log.segments_dir, detail=False))


def test_a_writer_merges_each_full_level_of_its_segments_and_folds_them_at_the_end(log):
    for i in range(SEGMENT_FANOUT + 1):
        log.record([record(f"a-{i}")])
    # Sixteen level-0 segments became one of level 1; the seventeenth waits at level 0.
    assert [name.split(".")[2] for name in segments(log)] == ["0", "1"]
    assert sorted(log.committed()) == sorted(f"a-{i}" for i in range(SEGMENT_FANOUT + 1))
    log.finish()
    assert segments(log) == [] and len(log.committed()) == SEGMENT_FANOUT + 1
    assert log.last_read == {"manifest": 1, "segments": 0, "records": 0}


@pytest.mark.parametrize(("applied", "kept"), [(False, False), (True, True)])
def test_a_failed_record_write_unpublishes_the_files_only_when_known_not_written(log, monkeypatch, applied, kept):
    part = f"{log.root}/part-a-0-10.parquet"
    log.fs.pipe(part, b"rows")
    write = commit_log.write_json

    def failing(fs, path, payload, **kwargs):
        if applied:  # a store that applies a PUT and answers 500
            write(fs, path, payload, **kwargs)
        raise OSError("500 Internal Server Error")

    monkeypatch.setattr(commit_log, "write_json", failing)
    with pytest.raises(RayBatchError, match=r"cannot commit range a-0-10 of output .*: OSError: 500 Internal"):
        log.record([record("a-0-10")])
    assert log.fs.exists(part) is kept
    monkeypatch.setattr(commit_log, "write_json", write)
    assert sorted(log.committed()) == (["a-0-10"] if applied else [])
