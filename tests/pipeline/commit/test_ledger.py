"""The commit protocol's ordering on a local filesystem, observed through the real system calls."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline.commit.commit_log import PLAN_VERSION, SEGMENT_FANOUT
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger, PlanRecord, shard_key
from airflow_provider_raybatch.pipeline.errors import LeaseLostError
from airflow_provider_raybatch.pipeline.store.files import resolve
from tests.support.data import OpenRecordingFileSystem


@pytest.fixture
def syscalls(monkeypatch):
    """Every fsync (by path) and rename, in order, as they really happen."""
    events: list[tuple[str, ...]] = []
    fsync, rename = os.fsync, os.rename

    def traced_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def traced_rename(src, dst, *args, **kwargs):
        events.append(("rename", str(src), str(dst)))
        return rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", traced_fsync)
    monkeypatch.setattr(os, "rename", traced_rename)
    return events


def test_a_commit_record_is_durable_only_after_the_files_it_names(tmp_path, syscalls):
    ledger = OutputLedger.open(str(tmp_path / "out"))
    data, rejects = ledger.tmp_file("r1"), ledger.tmp_file("rejects-r1")
    pq.write_table(pa.table({"id": [1, 2]}), data)
    pq.write_table(pa.table({"id": [3], "reason": ["bad"], "kind": ["invalid_input"]}), rejects)
    syscalls.clear()

    ledger.record([ledger.publish("r1", [data], 2, [rejects], 1, 0)])

    out = tmp_path / "out"
    (record,) = (out / "_raybatch" / "segments").iterdir()  # a segment holding the one record
    renames = [e for e in syscalls if e[0] == "rename"]
    assert [Path(e[2]) for e in renames] == [out / "part-r1.parquet", out / "_rejects" / "part-r1.parquet", record]
    position = {e: i for i, e in enumerate(syscalls)}

    def first(kind, path):
        return min(i for i, e in enumerate(syscalls) if e[0] == kind and Path(e[-1]) == Path(path))

    # Each file's content before its new name, each name (its folder) before the record, the record last.
    for (_, src, dst), folder in zip(renames[:2], [out, out / "_rejects"], strict=True):
        assert first("fsync", src) < position[("rename", src, dst)] < first("fsync", folder)
        assert first("fsync", folder) < first("rename", record)
    record_tmp = renames[2][1]
    assert first("fsync", record_tmp) < first("rename", record) < first("fsync", record.parent)
    assert first("fsync", out / "_raybatch") < first("rename", record)  # the new segments/ folder's entry


def commit_empty_ranges(ledger: OutputLedger, ids: list[str], per_segment: int) -> None:
    """Commit ranges without files, ``per_segment`` records a batch (no file to move: only records written)."""
    for start in range(0, len(ids), per_segment):
        ledger.record([ledger.publish(range_id, [], 0) for range_id in ids[start : start + per_segment]])


def opened_by_a_resume(tmp_path: Path) -> tuple[int, dict[str, dict]]:
    """Objects a fresh ledger opens to learn what is committed (as a run's start does), and what it learns."""
    fs = OpenRecordingFileSystem(str(tmp_path / "opens.log"))
    fs.opened()
    committed = OutputLedger(fs, str(tmp_path / "out"), "out").committed()
    return len(fs.opened()), committed


@pytest.mark.parametrize("ranges", [300, 1200])
def test_a_resume_reads_a_bounded_number_of_objects_however_many_ranges_were_committed(tmp_path, ranges):
    ledger = OutputLedger.open(str(tmp_path / "out"))
    ids = [f"r{i:05d}" for i in range(ranges)]
    commit_empty_ranges(ledger, ids, per_segment=2)  # 150 or 600 batches, as a killed run leaves them

    opened, committed = opened_by_a_resume(tmp_path)
    assert sorted(committed) == ids
    # Merged as they were written: at most SEGMENT_FANOUT - 1 per level, levels growing as the log.
    assert opened == len(list((tmp_path / "out" / "_raybatch" / "segments").iterdir()))
    assert opened <= (SEGMENT_FANOUT - 1) * 3

    ledger.finish()  # the end of a whole-output run: one manifest
    opened, committed = opened_by_a_resume(tmp_path)
    assert opened == 1 and sorted(committed) == ids
    assert not list((tmp_path / "out" / "_raybatch" / "segments").iterdir())


def test_a_layout_1_output_is_read_record_by_record_and_keeps_that_layout_until_upgraded(tmp_path):
    ledger = OutputLedger.open(str(tmp_path / "out"))
    ledger.write_plan(PlanRecord("in", {"files": [], "ranges": []}, {"rows_per_range": 10}, None, version=1))
    commit_empty_ranges(ledger, ["a", "b", "c"], per_segment=3)
    commits = tmp_path / "out" / "_raybatch" / "commits"
    assert sorted(p.name for p in commits.iterdir()) == ["a.json", "b.json", "c.json"]  # as version 1 wrote them
    ledger.finish()  # nothing to fold: a provider of version 1 must still find them where it looks
    assert sorted(p.name for p in commits.iterdir()) == ["a.json", "b.json", "c.json"]
    opened, committed = opened_by_a_resume(tmp_path)
    assert opened == 3 and sorted(committed) == ["a", "b", "c"]

    resumed = OutputLedger.open(str(tmp_path / "out"))
    assert resumed.load_plan().version == 1
    resumed.upgrade(PlanRecord("in", {"files": []}, {"rows_per_range": 10}, None))
    assert resumed.load_plan().version == PLAN_VERSION and not commits.exists()
    commit_empty_ranges(resumed, ["d"], per_segment=1)
    opened, committed = opened_by_a_resume(tmp_path)
    assert opened == 2 and sorted(committed) == ["a", "b", "c", "d"]  # the manifest and one segment


def test_shards_write_their_own_segments_side_by_side_and_the_whole_output_writer_folds_them(tmp_path):
    writers = []
    for part in (["p0-a", "p0-b", "p0-c"], ["p1-a", "p1-b", "p1-c"]):
        writer = OutputLedger(*resolve(str(tmp_path / "out")), "out", range_ids=part)
        writers.append((writer, part))
    for step in range(3):  # interleaved, as two tasks commit at the same time
        for writer, part in writers:
            commit_empty_ranges(writer, [part[step]], per_segment=1)
    for writer, _ in writers:
        writer.finish()  # a shard merges only its own segments
    segments = sorted(p.name.split(".")[0] for p in (tmp_path / "out" / "_raybatch" / "segments").iterdir())
    assert segments == sorted(w.scope for w, _ in writers) and segments[0] != segments[1]
    assert not (tmp_path / "out" / "_raybatch" / "manifest.json").exists()
    opened, committed = opened_by_a_resume(tmp_path)
    assert opened == 2 and len(committed) == 6

    # A killed try of the first shard leaves segments; its retry folds them with its own.
    killed, retry = (OutputLedger(*resolve(str(tmp_path / "out")), "out", range_ids=writers[0][1]) for _ in "kr")
    commit_empty_ranges(killed, ["p0-d", "p0-e"], per_segment=1)
    commit_empty_ranges(retry, ["p0-f"], per_segment=1)
    retry.finish()
    segments = sorted(p.name.split(".")[0] for p in (tmp_path / "out" / "_raybatch" / "segments").iterdir())
    assert segments == sorted(w.scope for w, _ in writers)
    opened, committed = opened_by_a_resume(tmp_path)
    assert opened == 2 and len(committed) == 9

    whole = OutputLedger.open(str(tmp_path / "out"))
    whole.committed()
    whole.finish()
    opened, committed = opened_by_a_resume(tmp_path)
    assert opened == 1 and len(committed) == 9


def test_a_writer_that_lost_its_lease_writes_no_record_and_folds_nothing(tmp_path):
    ledger = OutputLedger.open(str(tmp_path / "out"))
    commit_empty_ranges(ledger, ["r1"], per_segment=1)
    record = ledger.publish("r2", [], 0)

    def lost():
        raise LeaseLostError("taken over")

    ledger.fence = lost
    segments = tmp_path / "out" / "_raybatch" / "segments"
    before = sorted(segments.iterdir())
    with pytest.raises(LeaseLostError):
        ledger.record([record])
    with pytest.raises(LeaseLostError):
        ledger.finish()
    assert sorted(segments.iterdir()) == before and not (tmp_path / "out" / "_raybatch" / "manifest.json").exists()
    assert sorted(OutputLedger.open(str(tmp_path / "out")).committed()) == ["r1"]
    # Nor does it remove the temporary folder it shares with the new holder, whose files are in it now.
    theirs = ledger.tmp_file("r3")
    with open(theirs, "wb"):
        pass
    ledger.clear_tmp()
    assert os.path.exists(theirs)


def test_a_reader_never_misses_a_record_while_the_writer_merges_and_folds(tmp_path):
    """What the verifier or a test sees while a run writes: every read holds all an earlier read held."""
    writer = OutputLedger.open(str(tmp_path / "out"))
    ids = [f"r{i:04d}" for i in range(400)]
    done = threading.Event()

    def write():
        try:
            for start in range(0, len(ids), 50):
                commit_empty_ranges(writer, ids[start : start + 50], per_segment=1)  # merges as it goes
                writer.compact()  # and folds, as a run's end or start does
        finally:
            done.set()

    thread = threading.Thread(target=write)
    thread.start()
    seen: set[str] = set()
    reads = 0
    try:
        while not done.is_set():
            now = set(OutputLedger.open(str(tmp_path / "out")).committed())
            assert seen <= now, sorted(seen - now)[:5]
            seen, reads = now, reads + 1
    finally:
        thread.join()
    assert reads > 5 and set(OutputLedger.open(str(tmp_path / "out")).committed()) == set(ids)


def test_a_ledger_writes_under_the_plan_scope_and_fence_it_was_made_with(tmp_path):
    fs, root = resolve(str(tmp_path / "out"))
    recorded = PlanRecord("in", {"files": []}, {"rows_per_range": 10}, None)
    OutputLedger(fs, root, "out").write_plan(recorded)
    fenced = []
    part = ["r1", "r2"]
    writer = OutputLedger(fs, root, "out", plan=recorded, range_ids=part, fence=lambda: fenced.append(True))
    assert writer.tmp_dir == writer.tmp_folder(part) and writer.scope == shard_key(part)

    # The plan recorded since (another writer's overwrite) is read, and this writer's stays the one it was made with.
    OutputLedger(fs, root, "out").write_plan(dataclasses.replace(recorded, input_path="other"))
    assert writer.load_plan().input_path == "other"
    record = writer.publish("r1", [], 0)
    writer.record([record])
    assert record.plan == recorded.plan_id() and fenced
    segments = [p.name for p in (tmp_path / "out" / "_raybatch" / "segments").iterdir()]
    assert [name.split(".")[0] for name in segments] == [shard_key(part)]
