"""Delta table commits applied exactly once: real delta-rs tables on local disk, real concurrent processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("deltalake")

from deltalake import DeltaTable  # noqa: E402

from airflow_provider_raybatch.pipeline.errors import OutputSchemaError  # noqa: E402
from airflow_provider_raybatch.pipeline.tables.delta import RANGES_KEY, DataFile, DeltaTableWriter  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("score", pa.float32()), ("ds", pa.string())])
REPO = Path(__file__).resolve().parents[3]


def write_file(root: Path, ds: str, ids: list[int], name: str) -> DataFile:
    """A data file as the pipeline leaves it: under the table's root, the partition column in it."""
    path = f"ds={ds}/{name}.parquet"
    table = pa.table({"id": ids, "score": pa.array([i / 2 for i in ids], pa.float32()), "ds": [ds] * len(ids)})
    (root / f"ds={ds}").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, root / path)
    return DataFile(path, (root / path).stat().st_size, len(ids))


def rows(root: Path, version: int | None = None) -> dict[str, list[int]]:
    """The table's rows by date, read through its log (a snapshot), not by listing the folder."""
    table = DeltaTable(str(root), version=version).to_pyarrow_table()
    out: dict[str, list[int]] = {}
    for ds, i in zip(table.column("ds").to_pylist(), table.column("id").to_pylist(), strict=True):
        out.setdefault(ds, []).append(i)
    return {ds: sorted(ids) for ds, ids in sorted(out.items())}


def writer(root: Path, writer_id: str) -> DeltaTableWriter:
    return DeltaTableWriter(str(root), SCHEMA, ["ds"], writer_id)


def test_the_first_commit_creates_the_table_and_each_commit_is_applied_once(tmp_path):
    w = writer(tmp_path, "out-24")
    assert w.applied() == -1
    first = write_file(tmp_path, "2026-11-24", [0, 1, 2], "part-r0")
    second = write_file(tmp_path, "2026-11-24", [3, 4], "part-r1")
    assert w.commit(0, [first], {"ds": "2026-11-24"}, ["r0"]) is True
    assert w.commit(1, [second], {"ds": "2026-11-24"}, ["r1"]) is True
    # A retried or resumed writer applies its commits again: the table keeps each once.
    assert w.commit(1, [second], {"ds": "2026-11-24"}, ["r1"]) is False
    assert w.commit(0, [first], {"ds": "2026-11-24"}, ["r0"]) is False
    assert rows(tmp_path) == {"2026-11-24": [0, 1, 2, 3, 4]}
    assert w.applied() == 1
    table = DeltaTable(str(tmp_path))
    assert table.metadata().partition_columns == ["ds"]
    assert [json.loads(h[RANGES_KEY]) for h in table.history() if RANGES_KEY in h] == [["r1"], ["r0"]]


def test_a_commit_whose_reply_was_lost_is_found_applied_and_not_repeated(tmp_path, monkeypatch):
    w = writer(tmp_path, "out-24")
    w.commit(0, [write_file(tmp_path, "2026-11-24", [0, 1], "part-r0")], {"ds": "2026-11-24"}, ["r0"])
    applied = DeltaTable.create_write_transaction
    failures = []

    def applied_then_lost(self, *args, **kwargs):
        applied(self, *args, **kwargs)
        failures.append(1)
        raise OSError("Connection reset by peer")  # the store applied the commit; its answer never came

    monkeypatch.setattr(DeltaTable, "create_write_transaction", applied_then_lost)
    second = write_file(tmp_path, "2026-11-24", [2, 3], "part-r1")
    assert w.commit(1, [second], {"ds": "2026-11-24"}, ["r1"]) is False  # read again: it had landed
    assert failures == [1]
    assert rows(tmp_path) == {"2026-11-24": [0, 1, 2, 3]}


def test_replacing_a_date_swaps_its_rows_in_one_commit_and_leaves_other_dates(tmp_path):
    old = writer(tmp_path, "run-1/2026-11-24")
    old.commit(0, [write_file(tmp_path, "2026-11-24", [0, 1, 2], "part-old")], {"ds": "2026-11-24"}, ["r0"])
    writer(tmp_path, "run-1/2026-11-23").commit(
        0, [write_file(tmp_path, "2026-11-23", [9], "part-other")], {"ds": "2026-11-23"}, ["r0"]
    )
    before = DeltaTable(str(tmp_path)).version()

    rerun = writer(tmp_path, "run-2/2026-11-24")
    new = write_file(tmp_path, "2026-11-24", [10, 11], "part-new")
    assert rerun.commit(0, [new], {"ds": "2026-11-24"}, ["r0"], replace_partition=True)
    assert rows(tmp_path) == {"2026-11-23": [9], "2026-11-24": [10, 11]}
    # One commit: the version before it holds the old rows, none of the new (readers never see a mix).
    assert DeltaTable(str(tmp_path)).version() == before + 1
    assert rows(tmp_path, before) == {"2026-11-23": [9], "2026-11-24": [0, 1, 2]}


def test_a_table_with_other_columns_is_refused_naming_them(tmp_path):
    writer(tmp_path, "a").commit(0, [write_file(tmp_path, "2026-11-24", [0], "part-a")], {"ds": "2026-11-24"}, ["r0"])
    other = pa.schema([("id", pa.int64()), ("score", pa.float64()), ("ds", pa.string())])
    w = DeltaTableWriter(str(tmp_path), other, ["ds"], "b")
    with pytest.raises(OutputSchemaError, match=r"score \(table: float, output: double\)"):
        w.commit(0, [], {"ds": "2026-11-25"}, ["r0"])


# A writer in a process of its own: commits 0..n-1 of one date, the first replacing the date.
WRITER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[4])
from tests.pipeline.tables.test_delta import writer, write_file
root, ds, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
w = writer(root, "writer-" + ds)
for seq in range(n):
    f = write_file(root, ds, [seq * 10 + i for i in range(3)], f"part-{seq}")
    w.commit(seq, [f], {"ds": ds}, [f"r{seq}"], replace_partition=seq == 0)
"""


def test_writers_of_different_dates_committing_at_once_all_land_once(tmp_path):
    """A backfill: one writer per date, at once. Replacing a date conflicts with every commit that
    read the table before it (delta-rs does not tell partitions apart): each loser reads again and
    commits after, and nothing is lost or doubled."""
    dates = ["2026-11-20", "2026-11-21", "2026-11-22"]
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), ds, "8", str(REPO)], stderr=subprocess.PIPE)
        for ds in dates
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    expected = sorted(seq * 10 + i for seq in range(8) for i in range(3))
    assert rows(tmp_path) == {ds: expected for ds in dates}
    assert all(writer(tmp_path, f"writer-{ds}").applied() == 7 for ds in dates)
