"""Table commits applied exactly once, the same contract for Delta and Iceberg: real delta-rs
tables and real pyiceberg tables (a SQL catalog on SQLite) on local disk, real concurrent processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline.errors import LeaseLostError, OutputSchemaError
from airflow_provider_raybatch.pipeline.tables.delta import DeltaTableWriter
from airflow_provider_raybatch.pipeline.tables.delta_storage import delta_storage_options
from airflow_provider_raybatch.pipeline.tables.iceberg import IcebergTableWriter
from airflow_provider_raybatch.pipeline.tables.writer_commits import RANGES_KEY, DataFile

SCHEMA = pa.schema([("id", pa.int64()), ("score", pa.float32()), ("ds", pa.string())])
REPO = Path(__file__).resolve().parents[3]
IDENTIFIER = "predictions.scores"


def write_file(root: Path | str, ds: str, ids: list[int], name: str, options: dict | None = None) -> DataFile:
    """A data file as the pipeline leaves it: under the table's root (a folder or an s3:// URL, with
    fsspec ``options``), the partition column in it."""
    fs, base = fsspec.core.url_to_fs(str(root), **(options or {}))
    path = f"ds={ds}/{name}.parquet"
    table = pa.table({"id": ids, "score": pa.array([i / 2 for i in ids], pa.float32()), "ds": [ds] * len(ids)})
    fs.makedirs(f"{base}/ds={ds}", exist_ok=True)
    with fs.open(f"{base}/{path}", "wb") as f:
        pq.write_table(table, f)
    return DataFile(path, fs.size(f"{base}/{path}"), len(ids))


def catalog(root: Path):
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("raybatch", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")


def writer(
    fmt: str,
    root: Path | str,
    writer_id: str,
    schema: pa.Schema = SCHEMA,
    options: dict | None = None,
    add_columns: bool = False,
):
    if fmt == "delta":
        pytest.importorskip("deltalake")
        storage = delta_storage_options(str(root), options or {})
        return DeltaTableWriter(str(root), schema, ["ds"], writer_id, storage, add_columns=add_columns)
    pytest.importorskip("pyiceberg")
    return IcebergTableWriter(
        catalog(root), IDENTIFIER, f"file://{root}", schema, ["ds"], writer_id, add_columns=add_columns
    )


def snapshot(fmt: str, root: Path | str, version: int | None = None, options: dict | None = None) -> pa.Table:
    """The table's rows as a reader of its snapshot sees them (through its log or metadata, not the folder)."""
    if fmt == "delta":
        from deltalake import DeltaTable

        storage = delta_storage_options(str(root), options or {}) or None
        return DeltaTable(str(root), version=version, storage_options=storage).to_pyarrow_table()
    return catalog(root).load_table(IDENTIFIER).scan(snapshot_id=version).to_arrow()


def current_version(fmt: str, root: Path) -> int:
    if fmt == "delta":
        from deltalake import DeltaTable

        return DeltaTable(str(root)).version()
    return catalog(root).load_table(IDENTIFIER).current_snapshot().snapshot_id


def commits_ranges(fmt: str, root: Path) -> list[list[str]]:
    """The ranges named by the writers' commits, newest first."""
    if fmt == "delta":
        from deltalake import DeltaTable

        return [json.loads(h[RANGES_KEY]) for h in DeltaTable(str(root)).history() if RANGES_KEY in h]
    snapshots = catalog(root).load_table(IDENTIFIER).snapshots()
    return [json.loads(s.summary[RANGES_KEY]) for s in reversed(snapshots) if s.summary and RANGES_KEY in s.summary]


def rows(fmt: str, root: Path | str, version: int | None = None, options: dict | None = None) -> dict[str, list[int]]:
    """The table's ids by date."""
    table = snapshot(fmt, root, version, options)
    out: dict[str, list[int]] = {}
    for ds, i in zip(table.column("ds").to_pylist(), table.column("id").to_pylist(), strict=True):
        out.setdefault(ds, []).append(i)
    return {ds: sorted(ids) for ds, ids in sorted(out.items())}


@pytest.fixture(params=["delta", "iceberg"])
def fmt(request) -> str:
    return request.param


def test_the_first_commit_creates_the_table_and_each_commit_is_applied_once(fmt, tmp_path):
    w = writer(fmt, tmp_path, "out-24")
    assert w.applied() == -1
    first = write_file(tmp_path, "2026-11-24", [0, 1, 2], "part-r0")
    second = write_file(tmp_path, "2026-11-24", [3, 4], "part-r1")
    assert w.commit(0, [first], {"ds": "2026-11-24"}, ["r0"]) is True
    assert w.commit(1, [second], {"ds": "2026-11-24"}, ["r1"]) is True
    # A retried or resumed writer applies its commits again: the table keeps each once.
    assert w.commit(1, [second], {"ds": "2026-11-24"}, ["r1"]) is False
    assert w.commit(0, [first], {"ds": "2026-11-24"}, ["r0"]) is False
    assert rows(fmt, tmp_path) == {"2026-11-24": [0, 1, 2, 3, 4]}
    assert w.applied() == 1
    assert commits_ranges(fmt, tmp_path) == [["r1"], ["r0"]]


def test_a_writer_whose_lease_was_taken_over_commits_nothing(fmt, tmp_path):
    w = writer(fmt, tmp_path, "out-24")
    w.commit(0, [write_file(tmp_path, "2026-11-24", [0, 1], "part-r0")], {"ds": "2026-11-24"}, ["r0"])

    def lost() -> None:
        raise LeaseLostError("the lease was taken over")

    w.fence = lost  # what the pipeline passes: the output's lease check, before each attempt
    with pytest.raises(LeaseLostError):
        w.commit(1, [write_file(tmp_path, "2026-11-24", [2], "part-r1")], {"ds": "2026-11-24"}, ["r1"])
    assert rows(fmt, tmp_path) == {"2026-11-24": [0, 1]} and w.applied() == 0


def history(fmt: str, root: Path) -> list[int]:
    """Every version (Delta) or snapshot id (Iceberg) in the table's log, oldest first."""
    if fmt == "delta":
        return list(range(current_version(fmt, root) + 1))
    return [s.snapshot_id for s in catalog(root).load_table(IDENTIFIER).snapshots()]


def lose_the_reply(fmt: str, monkeypatch) -> list[int]:
    """Make each table commit land and then fail as if its reply were lost; returns the failures."""
    if fmt == "delta":
        from deltalake import DeltaTable as committing
    else:
        from pyiceberg.table import Transaction as committing
    method = "create_write_transaction" if fmt == "delta" else "commit_transaction"
    applied = getattr(committing, method)
    failures = []

    def applied_then_lost(self, *args, **kwargs):
        applied(self, *args, **kwargs)
        failures.append(1)
        raise OSError("Connection reset by peer")  # the store applied the commit; its answer never came

    monkeypatch.setattr(committing, method, applied_then_lost)
    return failures


def test_a_commit_whose_reply_was_lost_is_found_applied_and_not_repeated(fmt, tmp_path, monkeypatch):
    w = writer(fmt, tmp_path, "out-24")
    w.commit(0, [write_file(tmp_path, "2026-11-24", [0, 1], "part-r0")], {"ds": "2026-11-24"}, ["r0"])
    failures = lose_the_reply(fmt, monkeypatch)
    second = write_file(tmp_path, "2026-11-24", [2, 3], "part-r1")
    assert w.commit(1, [second], {"ds": "2026-11-24"}, ["r1"]) is False  # read again: it had landed
    assert failures == [1]
    assert rows(fmt, tmp_path) == {"2026-11-24": [0, 1, 2, 3]}


def test_replacing_a_date_swaps_its_rows_in_one_commit_and_leaves_other_dates(fmt, tmp_path, monkeypatch):
    old = writer(fmt, tmp_path, "run-1/2026-11-24")
    old.commit(0, [write_file(tmp_path, "2026-11-24", [0, 1, 2], "part-old")], {"ds": "2026-11-24"}, ["r0"])
    old.commit(1, [write_file(tmp_path, "2026-11-24", [3], "part-old-2")], {"ds": "2026-11-24"}, ["r1"])
    writer(fmt, tmp_path, "run-1/2026-11-23").commit(
        0, [write_file(tmp_path, "2026-11-23", [9], "part-other")], {"ds": "2026-11-23"}, ["r0"]
    )
    before = history(fmt, tmp_path)

    rerun = writer(fmt, tmp_path, "run-2/2026-11-24")
    new = [write_file(tmp_path, "2026-11-24", [10, 11], "part-new"), write_file(tmp_path, "2026-11-24", [12], "p")]
    failures = lose_the_reply(fmt, monkeypatch)  # the replacement lands, its reply is lost: the retry finds it
    assert rerun.commit(0, new, {"ds": "2026-11-24"}, ["r0", "r1"], replace_partition=True) is False
    assert failures == [1]
    assert rows(fmt, tmp_path) == {"2026-11-23": [9], "2026-11-24": [10, 11, 12]}
    # One version or snapshot replaced the date, and every one in the table's log (what time travel,
    # incremental and change readers see) holds the date's old rows or its new ones: never none, never a mix.
    after = history(fmt, tmp_path)
    assert after[: len(before)] == before and len(after) == len(before) + 1
    seen = [rows(fmt, tmp_path, version).get("2026-11-24") for version in after]
    assert seen == [[0, 1, 2]] + [[0, 1, 2, 3]] * (len(before) - 1) + [[10, 11, 12]]
    if fmt == "iceberg":
        assert rerun.snapshots_of(0) == ["overwrite"]


def test_a_table_with_other_columns_is_refused_naming_them(fmt, tmp_path):
    writer(fmt, tmp_path, "a").commit(
        0, [write_file(tmp_path, "2026-11-24", [0], "part-a")], {"ds": "2026-11-24"}, ["r0"]
    )
    other = pa.schema([("id", pa.int64()), ("score", pa.float64()), ("ds", pa.string())])
    w = writer(fmt, tmp_path, "b", other)
    with pytest.raises(OutputSchemaError, match=r"score \(table: float, output: double\)"):
        w.commit(0, [], {"ds": "2026-11-25"}, ["r0"])


# A writer in a process of its own: commits 0..n-1 of one date, the first replacing the date.
WRITER = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[5])
from tests.pipeline.tables.test_table_writers import writer, write_file
fmt, root, ds, n, options = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[6])
root = root if "://" in root else Path(root)
w = writer(fmt, root, "writer-" + ds, options=options)
for seq in range(n):
    f = write_file(root, ds, [seq * 10 + i for i in range(3)], f"part-{seq}", options)
    w.commit(seq, [f], {"ds": ds}, [f"r{seq}"], replace_partition=seq == 0)
"""


def race(fmt: str, root: Path | str, options: dict | None = None) -> None:
    """Three writers, one per date, at once, the first table commit creating the table."""
    dates = ["2026-11-20", "2026-11-21", "2026-11-22"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, fmt, str(root), ds, "8", str(REPO), json.dumps(options or {})],
            stderr=subprocess.PIPE,
        )
        for ds in dates
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    expected = sorted(seq * 10 + i for seq in range(8) for i in range(3))
    assert rows(fmt, root, options=options) == {ds: expected for ds in dates}
    assert all(writer(fmt, root, f"writer-{ds}", options=options).applied() == 7 for ds in dates)


def test_writers_of_different_dates_committing_at_once_all_land_once(fmt, tmp_path):
    """A backfill. Commits race (delta-rs fails every commit that read the table before another's
    replacement, whatever the partition; an Iceberg catalog swaps one metadata file at a time):
    each loser reads again and commits after, and nothing is lost or doubled."""
    writer(fmt, tmp_path, "probe")  # skips the test without the format's library
    race(fmt, tmp_path)


def test_a_delta_table_on_s3_commits_once_and_racing_writers_all_land(s3_server):
    """On an object store, through the options built from the provider's store settings: delta-rs
    creates each log version with a conditional PUT, so two writers never both win one."""
    root = f"s3://raybatch-test/tables-{uuid.uuid4().hex[:8]}"
    w = writer("delta", f"{root}/scores", "out-24", options=s3_server)
    first = write_file(f"{root}/scores", "2026-11-24", [0, 1, 2], "part-r0", s3_server)
    assert w.commit(0, [first], {"ds": "2026-11-24"}, ["r0"]) is True
    assert w.commit(0, [first], {"ds": "2026-11-24"}, ["r0"]) is False
    assert rows("delta", f"{root}/scores", options=s3_server) == {"2026-11-24": [0, 1, 2]}
    race("delta", f"{root}/raced", s3_server)


#: SCHEMA with four more columns, two of them between its own (a table adds new columns last).
WIDE = pa.schema(
    [
        ("id", pa.int64()),
        ("label", pa.string()),
        ("score", pa.float32()),
        ("rank", pa.int16()),
        ("vec", pa.list_(pa.float32(), 2)),
        ("meta", pa.struct([("a", pa.int8()), ("b", pa.string())])),
        ("ds", pa.string()),
    ]
)
NEW_COLUMNS = ["label", "rank", "vec", "meta"]


def write_wide_file(root: Path, ds: str, ids: list[int], name: str) -> DataFile:
    """A data file with :data:`WIDE`'s columns."""
    values = {
        "id": ids,
        "label": [f"l{i}" for i in ids],
        "score": [i / 2 for i in ids],
        "rank": ids,
        "vec": [[i, -i] for i in ids],
        "meta": [{"a": i, "b": str(i)} for i in ids],
        "ds": [ds] * len(ids),
    }
    path = root / f"ds={ds}" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(values, schema=WIDE), path)
    return DataFile(f"ds={ds}/{name}.parquet", path.stat().st_size, len(ids))


def table_columns(fmt: str, root: Path) -> list[str]:
    """The columns of the table's current schema, in its order."""
    if fmt == "delta":
        from deltalake import DeltaTable

        return [f.name for f in DeltaTable(str(root)).schema().fields]
    return [f.name for f in catalog(root).load_table(IDENTIFIER).schema().fields]


def schema_changes(fmt: str, root: Path) -> int:
    """How many times the table's schema was changed after its creation."""
    if fmt == "delta":
        from deltalake import DeltaTable

        return sum(h.get("operation") == "ADD COLUMN" for h in DeltaTable(str(root)).history())
    return len(catalog(root).load_table(IDENTIFIER).schemas()) - 1


def by_id(fmt: str, root: Path) -> dict[int, dict]:
    """The table's rows by id, as its own reader sees them (Iceberg: through the name mapping)."""
    return {row["id"]: row for row in snapshot(fmt, root).to_pylist()}


D1, D2, D3 = "2026-11-24", "2026-11-25", "2026-11-26"


def test_new_columns_are_refused_without_add_columns_naming_them_and_the_option(fmt, tmp_path):
    writer(fmt, tmp_path, "a").commit(0, [write_file(tmp_path, D1, [0, 1], "part-a")], {"ds": D1}, ["r0"])
    w = writer(fmt, tmp_path, "b", WIDE)
    with pytest.raises(OutputSchemaError, match=r"label \(table: missing, output: string\).*table_add_columns=True"):
        w.commit(0, [write_wide_file(tmp_path, D2, [5], "part-b")], {"ds": D2}, ["r0"])
    assert table_columns(fmt, tmp_path) == ["id", "score", "ds"]
    assert rows(fmt, tmp_path) == {D1: [0, 1]}


def test_add_columns_adds_new_columns_once_and_a_retry_after_the_change_commits_the_files(fmt, tmp_path, monkeypatch):
    first = writer(fmt, tmp_path, "a")
    first.commit(0, [write_file(tmp_path, D1, [0, 1], "part-a")], {"ds": D1}, ["r0"])
    files = [write_wide_file(tmp_path, D2, [5, 6], "part-b")]
    # The first try dies between the schema change and its files' commit.
    if fmt == "delta":
        from deltalake import DeltaTable as committing

        method = "create_write_transaction"
    else:
        from pyiceberg.table import Transaction as committing

        method = "add_files"

    def killed(*args, **kwargs):
        raise RuntimeError("killed before its files' commit")

    monkeypatch.setattr(committing, method, killed)
    with pytest.raises(RuntimeError, match="killed"):
        writer(fmt, tmp_path, "b", WIDE, add_columns=True).commit(0, files, {"ds": D2}, ["r0"])
    assert table_columns(fmt, tmp_path) == ["id", "score", "ds", *NEW_COLUMNS]
    assert rows(fmt, tmp_path) == {D1: [0, 1]}
    monkeypatch.undo()

    # The next try finds the columns added: it changes nothing more and commits its files.
    w = writer(fmt, tmp_path, "b", WIDE, add_columns=True)
    assert w.commit(0, files, {"ds": D2}, ["r0"]) is True
    assert w.commit(0, files, {"ds": D2}, ["r0"]) is False
    assert table_columns(fmt, tmp_path) == ["id", "score", "ds", *NEW_COLUMNS] and schema_changes(fmt, tmp_path) == 1
    got = by_id(fmt, tmp_path)
    assert all(got[i][c] is None for i in (0, 1) for c in NEW_COLUMNS)  # rows from before read null
    assert got[6]["label"] == "l6" and got[6]["rank"] == 6 and got[6]["vec"] == [6.0, -6.0]
    assert got[6]["meta"] == {"a": 6, "b": "6"}
    if fmt == "iceberg":
        # The files carry no field ids: pyiceberg reads them by the name mapping, which has the new columns.
        mapping = catalog(tmp_path).load_table(IDENTIFIER).metadata.name_mapping()
        assert {name for field in mapping for name in field.names} >= set(NEW_COLUMNS)
    # The table's types as the format keeps them (Iceberg: int32 for int16, a list for a fixed-size
    # list) compare equal to the output's: its later commits go on without a change.
    assert w.commit(1, [write_wide_file(tmp_path, D2, [7], "part-b2")], {"ds": D2}, ["r1"]) is True
    assert rows(fmt, tmp_path) == {D1: [0, 1], D2: [5, 6, 7]} and schema_changes(fmt, tmp_path) == 1

    # Only additions: a run that no longer writes the table's columns is refused, with the option or without.
    for add_columns in (False, True):
        with pytest.raises(OutputSchemaError, match=r"label \(table: \S+, output: missing\)"):
            writer(fmt, tmp_path, "a", add_columns=add_columns).commit(
                1, [write_file(tmp_path, D1, [2], "part-a2")], {"ds": D1}, ["r1"]
            )


def test_add_columns_changes_no_type_and_adds_no_non_nullable_column(fmt, tmp_path):
    writer(fmt, tmp_path, "a").commit(0, [write_file(tmp_path, D1, [0], "part-a")], {"ds": D1}, ["r0"])
    retyped = pa.schema([("id", pa.int64()), ("score", pa.float64()), ("ds", pa.string()), ("label", pa.string())])
    with pytest.raises(OutputSchemaError, match=r"score \(table: float, output: double\).*only adds new columns"):
        writer(fmt, tmp_path, "b", retyped, add_columns=True).commit(0, [], {"ds": D2}, ["r0"])
    not_null = SCHEMA.append(pa.field("label", pa.string(), nullable=False))
    with pytest.raises(OutputSchemaError, match=r"\['label'\] are not nullable"):
        writer(fmt, tmp_path, "b", not_null, add_columns=True).commit(0, [], {"ds": D2}, ["r0"])
    if fmt == "iceberg":
        # Types Iceberg would keep as others (a column no run could write then), or has not.
        for kind, refused in (
            (pa.uint64(), r"as it would keep them.*x \(table: int64, output: uint64\)"),
            (pa.timestamp("ns"), r"\['x'\] cannot be added to the Iceberg table"),
        ):
            with pytest.raises(OutputSchemaError, match=refused):
                writer(fmt, tmp_path, "b", SCHEMA.append(pa.field("x", kind)), add_columns=True).commit(
                    0, [], {"ds": D2}, ["r0"]
                )
    assert table_columns(fmt, tmp_path) == ["id", "score", "ds"] and schema_changes(fmt, tmp_path) == 0


def test_two_writers_adding_the_same_columns_at_once_add_them_once(fmt, tmp_path):
    writer(fmt, tmp_path, "a").commit(0, [write_file(tmp_path, D1, [0, 1], "part-a")], {"ds": D1}, ["r0"])
    dates = {D2: [10, 11], D3: [20, 21]}
    writers = {ds: writer(fmt, tmp_path, f"writer-{ds}", WIDE, add_columns=True) for ds in dates}
    files = {ds: [write_wide_file(tmp_path, ds, ids, "part-0")] for ds, ids in dates.items()}
    # Each writer has read the table without the columns when both change its schema: one change
    # lands, the other conflicts, and its writer reads the table again and finds the columns there.
    both_read = threading.Barrier(2, timeout=60)
    changes: list[str] = []
    conflicts: list[str] = []
    for ds, w in writers.items():

        def at_once(table, fields, ds=ds, change=w._add_columns) -> None:
            changes.append(ds)
            both_read.wait()
            try:
                change(table, fields)
            except Exception:
                conflicts.append(ds)
                raise

        w._add_columns = at_once
    with ThreadPoolExecutor(2) as pool:
        done = pool.map(lambda ds: writers[ds].commit(0, files[ds], {"ds": ds}, ["r0"]), dates)
        assert list(done) == [True, True]
    # Each tried once, one of them lost; the loser found the columns on its next read.
    assert sorted(changes) == [D2, D3] and len(conflicts) == 1
    assert table_columns(fmt, tmp_path) == ["id", "score", "ds", *NEW_COLUMNS] and schema_changes(fmt, tmp_path) == 1
    assert rows(fmt, tmp_path) == {D1: [0, 1], D2: [10, 11], D3: [20, 21]}
    assert by_id(fmt, tmp_path)[21]["label"] == "l21" and by_id(fmt, tmp_path)[0]["label"] is None
