"""Check a finished output against its ledger: ``python -m airflow_provider_raybatch verify <output_path>``.

What a reader of the output relies on: every committed file is there, a range's files with the
rows its record names, every record was written under the output's plan (not by a writer of a plan since replaced), no part file is there without a record, every planned range is committed, and the row
key is unique over the output and its rejects (each input row written exactly once).

Files left under ``_raybatch/tmp/`` by no live writer (a data file whose PUT landed after its
writer had given up on it, a fenced writer's last files) are reported as a warning, not a fault:
no reader sees them, and the next run of the output removes them.
"""

from __future__ import annotations

import posixpath
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow.parquet as pq

from airflow_provider_raybatch.pipeline.commit.lease import Lease, LeaseHolder
from airflow_provider_raybatch.pipeline.commit.ledger import SHARD_LEASES_DIR, OutputLedger
from airflow_provider_raybatch.pipeline.config import DEFAULT_LEASE_TIMEOUT_S, ROW_ID_COLUMN

#: Faults listed per kind before the rest are counted.
SHOWN = 5


def verify_output(
    output_path: str,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    warnings: list[str] | None = None,
) -> list[str]:
    """The faults of a finished output (empty when it is complete and consistent).

    :param output_path: the output folder, local or a URL.
    :param storage_options: fsspec options for a remote path.
    :param progress: called with (files read, files to read) after each file: reading every file's
        row keys is what takes long on a large output (the command line draws a bar from it).
    :param warnings: given, what is worth knowing but no fault is appended to it (stray temporary files).
    """
    ledger = OutputLedger.open(output_path, storage_options)
    fs = ledger.fs
    fs.invalidate_cache()
    plan = ledger.load_plan()
    if plan is None:
        return [f"{output_path}: no {posixpath.relpath(ledger.plan_path, ledger.root)}: not an output of this provider"]
    committed = ledger.committed()
    faults: list[str] = []

    planned = plan.range_ids()
    missing = [r for r in planned if r not in committed]
    add_faults(faults, "planned range(s) not committed", missing)
    add_faults(faults, "commit record(s) of ranges not in the plan", sorted(set(committed) - set(planned)))
    plan_id = plan.plan_id()
    foreign = sorted(r for r, record in committed.items() if record.plan not in (None, plan_id))
    add_faults(faults, "range(s) committed under another plan than the output's (a mixed output)", foreign)

    # A range's output files hold its rows together, and its rejects files its rejected rows: a
    # range that reached the writers in several blocks has several of each.
    recorded_files: dict[str, int] = {}  # relative path -> its group's index in `groups`
    groups: list[tuple[list[str], int]] = []  # (files, rows their record names)
    for record in committed.values():
        for names, rows in ((record.data_files, record.rows), (record.reject_files, record.rejected)):
            if names:
                recorded_files.update(dict.fromkeys(names, len(groups)))
                groups.append((names, rows))
    present = {
        posixpath.relpath(p, ledger.root)
        for folder in (ledger.root, ledger.rejects_dir)
        if fs.isdir(folder)
        for p in fs.ls(folder, detail=False)
        if posixpath.basename(p).startswith("part-")
    }
    add_faults(faults, "committed file(s) missing", sorted(set(recorded_files) - present))
    add_faults(faults, "part file(s) without a commit record", sorted(present - set(recorded_files)))

    id_column = plan.job.get("id_column") or ROW_ID_COLUMN
    ids: list[Any] = []
    file_rows: dict[str, int] = {}
    to_read = sorted(set(recorded_files) & present)
    for done, name in enumerate(to_read, 1):
        with fs.open(f"{ledger.root}/{name}", "rb") as f:
            parquet = pq.ParquetFile(f)
            rows = file_rows[name] = parquet.metadata.num_rows
            if rows:
                ids.extend(parquet.read(columns=[id_column]).column(id_column).to_pylist())
        if progress is not None:
            progress(done, len(to_read))
    wrong_rows = []
    for names, recorded in groups:
        if all(n in file_rows for n in names):  # a missing file is a fault of its own (above)
            rows = sum(file_rows[n] for n in names)
            if rows != recorded:
                wrong_rows.append(f"{' + '.join(sorted(names))} ({rows} rows, recorded {recorded})")
    add_faults(faults, "file(s) whose rows differ from their record", wrong_rows)
    duplicated = sorted((i for i, n in Counter(ids).items() if n > 1), key=repr)
    add_faults(faults, f"{id_column} value(s) written more than once", [repr(i) for i in duplicated])
    if warnings is not None:
        add_faults(
            warnings,
            "stray temporary file(s) that no live writer is writing (their writer gave up on them: never "
            "read, removed by the next run of the output)",
            stray_temporary_files(ledger),
        )
    return faults


def stray_temporary_files(ledger: OutputLedger) -> list[str]:
    """The files under ``_raybatch/tmp/`` (relative to the output) whose writer's lease is not live.

    The whole output's writer writes there, a mapped shard's writer in its own subfolder
    (named as its lease folder): each folder's files are strays unless that lease is live.
    """
    fs, tmp = ledger.fs, ledger.tmp_folder()
    strays = []
    live: dict[str | None, bool] = {}  # by scope: None for the whole output's writer, else a shard's key
    for path in sorted(fs.find(tmp)):
        relpath = posixpath.relpath(path, tmp)
        scope = relpath.split("/", 1)[0] if "/" in relpath else None
        if scope not in live:
            folder = ledger.lease_folder() if scope is None else f"{ledger.meta}/{SHARD_LEASES_DIR}/{scope}"
            # A reader's Lease: it only reads the newest generation, never takes it (its timeout is unused).
            record = Lease(fs, folder, ledger.display_path, LeaseHolder(), DEFAULT_LEASE_TIMEOUT_S).current()
            live[scope] = record is not None and record.is_live(time.time())
        if not live[scope]:
            strays.append(posixpath.relpath(path, ledger.root))
    return strays


def add_faults(faults: list[str], what: str, items: list[str]) -> None:
    """Add a fault of ``items`` (none: no fault), listing the first :data:`SHOWN`."""
    if items:
        more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
        faults.append(f"{len(items)} {what}: {', '.join(items[:SHOWN])}{more}")
