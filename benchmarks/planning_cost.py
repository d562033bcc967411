"""Planning cost: the planner over many input files vs reading their footers with plain pyarrow.

The planner lists the input, reads every file's footer (row groups, Arrow schema, id column
statistics, store fingerprint), checks that every file gives each column the same type, and cuts
the ranges. The baseline does the least any planner must: list the files and read each footer
with ``pyarrow.parquet.read_metadata``, with the same 16 threads. Both run in one process on the
same files, interleaved; the page cache is warm for both after a discarded first pass.

    python -m benchmarks.planning_cost                  # 10,000 files of 100 rows, 3 repeats
    python -m benchmarks.planning_cost --files 2000
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_raybatch.pipeline.planning.planner import plan_input
from airflow_provider_raybatch.pipeline.store.files import resolve
from benchmarks.support.cli import base_parser
from benchmarks.support.results import Results
from benchmarks.support.stats import median


def make_files(folder: Path, files: int, rows: int) -> None:
    if folder.is_dir() and len(list(folder.glob("*.parquet"))) == files:
        return
    folder.mkdir(parents=True, exist_ok=True)
    features = np.random.default_rng(0).random((rows, 32), dtype=np.float32)
    for i in range(files):
        table = pa.table(
            {
                "id": np.arange(i * rows, (i + 1) * rows, dtype=np.int64),
                "features": pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), 32),
            }
        )
        pq.write_table(table, folder / f"part-{i:06d}.parquet")


def plain_footers(folder: Path) -> int:
    paths = sorted(str(p) for p in folder.glob("*.parquet"))
    with ThreadPoolExecutor(max_workers=16) as pool:
        return sum(m.num_rows for m in pool.map(pq.read_metadata, paths))


def planner(folder: Path) -> int:
    fs, path = resolve(str(folder))
    fs.invalidate_cache()
    return plan_input(fs, path, str(folder), None, 100_000, id_column="id").total_rows


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[100])
    parser.add_argument("--files", type=int, default=10_000, help="input files (each of --rows rows)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (median kept)")
    args = parser.parse_args(argv)
    results = Results("planning_cost", "Planning cost: the planner vs plain footer reads", args)
    folder = args.work_dir / f"planning-{args.files}x{args.rows[0]}"
    make_files(folder, args.files, args.rows[0])
    variants = {"plain pyarrow footers": plain_footers, "planner (schemas, id stats, fingerprint)": planner}
    for fn in variants.values():
        fn(folder)  # warm the page cache and the listing
    walls: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            started = time.perf_counter()
            rows = fn(folder)
            walls[name].append(time.perf_counter() - started)
            assert rows == args.files * args.rows[0], (name, rows)
    for name in variants:
        wall = median(walls[name])
        results.add(
            variant=name, files=args.files, wall_s=round(wall, 2), ms_per_file=round(wall / args.files * 1000, 3)
        )
    value = median(walls["planner (schemas, id stats, fingerprint)"]) / median(walls["plain pyarrow footers"])
    results.check(f"{args.files:,} files: planner time / plain footer reads", round(value, 2), "(report)", None)
    results.note("Local files on the work dir's disk, warm cache; on S3 both pay one request per footer.")
    results.write()
    return results


if __name__ == "__main__":
    main()
