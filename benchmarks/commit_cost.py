"""Commit cost: what durability (fsync) and the writer lease's fencing add to each committed range.

The ledger commits the same range files three ways, interleaved in one process on one filesystem:
as the provider does (fenced by a held lease, fsynced), with fsync turned off, and with neither
(the protocol before the lease and fsync existed). Each range file holds ``--rows-per-range`` rows
of the benchmarks' input (int64 id + 32 float32 features, as the model reads them), written the
way the range writers write it, so the per-commit overhead can be set against writing the range.

    python -m benchmarks.commit_cost                      # 200 ranges of 100k rows... see --help
    python -m benchmarks.commit_cost --ranges 500 --rows-per-range 25000
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_raybatch.pipeline.commit.lease import Lease, LeaseHolder
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from benchmarks.support.cli import base_parser
from benchmarks.support.results import Results
from benchmarks.support.stats import median


def range_table(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    features = rng.random((rows, 32), dtype=np.float32)
    return pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), 32),
        }
    )


def commit_ranges(root: Path, table: pa.Table, ranges: int, mode: str) -> tuple[float, float]:
    """Seconds spent writing the range files, and committing them (publish + record)."""
    ledger = OutputLedger.open(str(root))
    lease = None
    if mode != "neither":
        lease = Lease(ledger.fs, ledger.lease_folder(), str(root), LeaseHolder(), timeout_s=120)
        lease.acquire()
        ledger.fence = lease.check
    real_fsync = os.fsync
    if mode != "durable and fenced":
        os.fsync = lambda fd: None  # every fsync of the protocol goes through os.fsync
    writing = committing = 0.0
    try:
        for i in range(ranges):
            started = time.perf_counter()
            tmp = ledger.tmp_file(f"r{i}")
            with ledger.fs.open(tmp, "wb") as f:
                pq.write_table(table, f)
            written = time.perf_counter()
            ledger.record([ledger.publish(f"r{i}", [tmp], table.num_rows)])
            writing += written - started
            committing += time.perf_counter() - written
    finally:
        os.fsync = real_fsync
        if lease is not None:
            lease.release()
    return writing, committing


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[])
    parser.add_argument("--ranges", type=int, default=200, help="ranges committed per setting and repeat")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting (median kept)")
    args = parser.parse_args(argv)
    results = Results("commit_cost", "Commit cost: fsync and lease fencing per committed range", args)
    table = range_table(args.rows_per_range)
    modes = ["durable and fenced", "fenced, no fsync", "neither"]
    timings: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for repeat in range(args.repeats):
        for mode in modes:
            root = args.work_dir / f"commit-cost-{repeat}-{mode.replace(' ', '-').replace(',', '')}"
            timings[mode].append(commit_ranges(root, table, args.ranges, mode))
    base_write = median(w for m in modes for w, _ in timings[m]) / args.ranges
    for mode in modes:
        commit = median(c for _, c in timings[mode]) / args.ranges
        results.add(
            setting=mode,
            ranges=args.ranges,
            rows_per_range=args.rows_per_range,
            write_ms_per_range=round(base_write * 1000, 2),
            commit_ms_per_range=round(commit * 1000, 2),
            commit_vs_write=round(commit / base_write, 3),
        )
    durable = median(c for _, c in timings["durable and fenced"])
    neither = median(c for _, c in timings["neither"])
    extra = (durable - neither) / args.ranges / base_write
    # For information: the end-to-end target (checkpointing < 5 % slower) is checkpoint_cost.py's.
    results.check("extra time per range (fsync + fencing) vs writing the range's file", round(extra, 3), "-", None)
    results.note(
        "Local filesystem of the work dir; commits interleaved by setting and repeated; medians. "
        "write_ms_per_range: writing one range's Parquet file (the same in every setting). "
        "The fsync cost depends on the disk: measure on the disk your outputs live on."
    )
    results.write()
    return results


if __name__ == "__main__":
    main()
