"""The commit protocol's ordering on a local filesystem, observed through the real system calls."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline.ledger import OutputLedger


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

    ledger.commit("r1", [data], 2, [rejects], 1, 0)

    out = tmp_path / "out"
    record = out / "_raybatch" / "commits" / "r1.json"
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
    assert first("fsync", out / "_raybatch") < first("rename", record)  # the new commits/ folder's entry
