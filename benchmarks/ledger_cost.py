"""Ledger cost: what a resume reads before its first new range, and what recording costs, by layout.

Layout 1 (before): one record object per committed range, ``_raybatch/commits/<range id>.json``,
and a plan listing every range. Layout 2 (after): records batched into segments, merged by their
writer as it goes and folded into ``_raybatch/manifest.json`` at the end of a run; a plan listing
files and row groups only. For each number of committed ranges this measures, on a fresh ledger
(nothing cached), the seconds :meth:`OutputLedger.committed` takes (what a resume reads before
its first new range; planning the input is the same in both layouts) and the objects it opens:

- ``layout 1``: N record files;
- ``layout 2, folded``: the manifest of a finished or cleanly failed run;
- ``layout 2, killed``: the segments a killed run leaves, written by the real writer in batches
  of ``--records-per-segment`` (a second's ranges).

Then the recording side: seconds per range to make records durable, one object per range vs one
segment per batch (fsync and fencing as a run does them), and the plan's size both ways.

    python -m benchmarks.ledger_cost                                   # local filesystem
    python -m benchmarks.ledger_cost --s3 --ranges 1000 10000          # moto S3 server (moto[server])
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airflow_provider_raybatch.pipeline.commit.commit_log import _encode
from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord
from airflow_provider_raybatch.pipeline.commit.lease import Lease, LeaseHolder
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.commit.plan_record import PlanRecord
from airflow_provider_raybatch.pipeline.planning.input_files import InputFile
from airflow_provider_raybatch.pipeline.planning.planner import Plan, plan_ranges
from benchmarks.support.cli import base_parser
from benchmarks.support.data import moto_s3
from benchmarks.support.results import Results

BUCKET = "raybatch-bench"


def record(range_id: str) -> CommitRecord:
    return CommitRecord(range_id, (f"part-{range_id}.parquet",), 100_000)


def range_ids(n: int) -> list[str]:
    # Shaped like real ids: 12 hex digits of the file, then the row bounds.
    return [f"{i // 10:012x}-{(i % 10) * 100_000}-{(i % 10 + 1) * 100_000}" for i in range(n)]


def fresh_ledger(url: str, options: dict[str, Any] | None) -> OutputLedger:
    ledger = OutputLedger.open(url, options)
    ledger.fs.invalidate_cache()
    return ledger


def write_layout_1(url: str, options: dict[str, Any] | None, ids: list[str]) -> None:
    """Setup, not measured: N record files, written in parallel without fsync."""
    ledger = fresh_ledger(url, options)
    ledger.fs.makedirs(ledger.commits_dir, exist_ok=True)
    payloads = {f"{ledger.commits_dir}/{i}.json": json.dumps(record(i).to_json()).encode() for i in ids}
    if hasattr(ledger.fs, "pipe") and ledger.fs.protocol != "file" and "file" not in ledger.fs.protocol:
        ledger.fs.pipe(payloads)  # s3fs uploads them concurrently
        return
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda item: Path(item[0]).write_bytes(item[1]), payloads.items()))


def write_manifest(url: str, options: dict[str, Any] | None, ids: list[str]) -> None:
    ledger = fresh_ledger(url, options)
    ledger.fs.makedirs(ledger.meta, exist_ok=True)
    ledger.fs.pipe_file(ledger.manifest_path, json.dumps(_encode(record(i) for i in ids)).encode())


def write_segments(url: str, options: dict[str, Any] | None, ids: list[str], per_segment: int) -> float:
    """As a killed run leaves them: the real writer, fenced by a held lease; seconds per range."""
    ledger = fresh_ledger(url, options)
    lease = Lease(ledger.fs, ledger.lease_folder(), url, LeaseHolder(), timeout_s=600)
    lease.acquire()
    ledger.fence = lease.check
    started = time.perf_counter()
    try:
        for start in range(0, len(ids), per_segment):
            ledger.record([record(i) for i in ids[start : start + per_segment]])
    finally:
        lease.release()
    return (time.perf_counter() - started) / len(ids)


def read_committed(url: str, options: dict[str, Any] | None, expected: int) -> tuple[float, dict[str, int]]:
    ledger = fresh_ledger(url, options)
    started = time.perf_counter()
    committed = ledger.committed()
    seconds = time.perf_counter() - started
    assert len(committed) == expected, (len(committed), expected)
    return seconds, ledger.last_read


def record_each(url: str, options: dict[str, Any] | None, n: int, layout: int) -> float:
    """Seconds per range to record ``n`` ranges one at a time (layout 1: a file each; 2: a segment each)."""
    ledger = fresh_ledger(url, options)
    ledger.version = layout
    lease = Lease(ledger.fs, ledger.lease_folder(), url, LeaseHolder(), timeout_s=600)
    lease.acquire()
    ledger.fence = lease.check
    started = time.perf_counter()
    try:
        for i in range_ids(n):
            ledger.record([record(i)])
    finally:
        lease.release()
    return (time.perf_counter() - started) / n


def plan_sizes(files: int, ranges_per_file: int) -> tuple[int, int]:
    """Bytes of plan.json's input, listing every range (layout 1) and not (layout 2)."""
    rows = 100_000
    infos = [
        InputFile(
            f"/in/part-{i:06d}.parquet",
            f"part-{i:06d}.parquet",
            10**8,
            rows * ranges_per_file,
            (rows,) * ranges_per_file,
            f"{i:064x}",
            mtime="2026-11-23T10:00:00+00:00",
        )
        for i in range(files)
    ]
    plan = Plan(infos, plan_ranges(infos, rows), None)
    layout_2 = plan.describe()
    layout_1 = {"files": layout_2["files"], "ranges": [r.__dict__ for r in plan.ranges]}
    # As each layout writes it: layout 1 indented, layout 2 compact.
    before = json.dumps(PlanRecord("in", layout_1, {}, None, version=1).__dict__, indent=1, sort_keys=True)
    after = json.dumps(PlanRecord("in", layout_2, {}, None).__dict__, separators=(",", ":"), sort_keys=True)
    return len(before), len(after)


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[])
    parser.add_argument("--ranges", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    parser.add_argument("--s3", action="store_true", help="on a moto S3 server instead of the local filesystem")
    parser.add_argument("--records-per-segment", type=int, default=30, help="ranges recorded per batch (a second's)")
    parser.add_argument("--killed-max", type=int, default=100_000, help="largest N written by the real writer")
    parser.add_argument("--record-each", type=int, default=500, help="ranges recorded one at a time, per layout")
    args = parser.parse_args(argv)
    name = "ledger_cost_s3" if args.s3 else "ledger_cost"
    results = Results(name, f"Ledger cost ({'moto S3' if args.s3 else 'local filesystem'}): resume reads", args)
    options, server = moto_s3(BUCKET) if args.s3 else (None, None)
    try:
        for n in args.ranges:
            ids = range_ids(n)
            base = f"s3://{BUCKET}/n{n}" if args.s3 else str(args.work_dir / f"ledger-cost-{n}")
            if not args.s3:
                os.system(f"rm -rf {base}")  # noqa: S605 - a folder of this benchmark's own
            cases = [("layout 1", write_layout_1), ("layout 2, folded", write_manifest)]
            if n <= args.killed_max:
                cases.append(("layout 2, killed", lambda u, o, i: write_segments(u, o, i, args.records_per_segment)))
            for layout, write in cases:
                url = f"{base}/{layout.replace(' ', '').replace(',', '-')}"
                write(url, options, ids)
                seconds, read = read_committed(url, options, n)
                results.add(
                    ranges=n,
                    layout=layout,
                    objects_read=sum(read.values()),
                    resume_read_s=round(seconds, 3),
                    us_per_range=round(seconds / n * 1e6, 2),
                )
            if not args.s3:
                os.system(f"rm -rf {base}")  # noqa: S605
        base = f"s3://{BUCKET}/each" if args.s3 else str(args.work_dir / "ledger-cost-each")
        each = {layout: record_each(f"{base}/{layout}", options, args.record_each, layout) for layout in (1, 2)}
        batched = write_segments(f"{base}/batched", options, range_ids(args.record_each * 4), args.records_per_segment)
        results.check(
            "recording, ms per range: a record object per range (layout 1)", round(each[1] * 1e3, 3), "-", None
        )
        results.check(
            "recording, ms per range: a segment per range (layout 2, interval 0)", round(each[2] * 1e3, 3), "-", None
        )
        results.check(
            f"recording, ms per range: a segment per {args.records_per_segment} ranges (layout 2)",
            round(batched * 1e3, 3),
            "-",
            None,
        )
        big, small = plan_sizes(100_000, 10)
        results.check(
            "plan.json MB, 100,000 files x 10 ranges: ranges listed (layout 1)", round(big / 1e6, 1), "-", None
        )
        results.check(
            "plan.json MB, 100,000 files x 10 ranges: files and row groups (layout 2)", round(small / 1e6, 1), "-", None
        )
    finally:
        if server is not None:
            server.stop()
    results.note(
        "resume_read_s: OutputLedger.committed() on a fresh ledger, as prepare() calls it before the first new "
        "range; the rest of a resume (planning the input, listing the output folder) is the same in both layouts. "
        "Setup writes (not measured) skip fsync. 'layout 2, killed': segments as the real writer leaves them "
        f"({args.records_per_segment} records a segment, merged 16 to 1 per level). Recording: fenced by a held lease "
        "and fsynced (locally), without range files (commit_cost.py measures publishing)."
    )
    results.write()
    return results


if __name__ == "__main__":
    main()
