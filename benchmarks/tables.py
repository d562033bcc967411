"""Tables: a run into a Delta or Iceberg table against the same run into a Parquet folder, the
commits two writers of different dates make per minute, and the table's metadata over a run of
many ranges.

1. Throughput: the operator (``variants.operator_series``: one embedded Ray for every run, so
   that its start is not in the comparison) scores the same input into a folder, a Delta table
   and an Iceberg table (its SQL catalog on SQLite), in alternating order, ``--repeats`` times;
   rows/s of each table over the folder's. The light model by default: a heavy one would hide
   the commit path.
2. Commits per minute: two processes, each a writer of its own date, commit one small file per
   table commit as fast as they can for ``--seconds`` (the commit protocol of
   ``pipeline/tables``: read the table, check the writer's number, commit; conflicts retried).
3. Metadata growth: runs of ``--ranges`` ranges (10 rows each) at the default commit interval
   and at 1 s; the table's commits, the size of its log / metadata, and the time to open it.

    python -m benchmarks.tables                      # 4M rows, 10,000 ranges, 30 s of commits
    python -m benchmarks.tables --rows 200000 --ranges 500 --seconds 5 --repeats 1
"""

from __future__ import annotations

import multiprocessing
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.support.cli import base_parser, common_params
from benchmarks.support.data import make_input
from benchmarks.support.results import Results
from benchmarks.support.runs import run_variant
from benchmarks.support.stats import ratio

FORMATS = ("delta", "iceberg")
PARTS = ("throughput", "commits", "metadata")
TARGET_RATIO = 0.9
IDENTIFIER = "bench.predictions"


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[4_000_000])
    parser.add_argument("--model", default="light", help="benchmarks/model.py's shape (default: light)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each output in the throughput comparison")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the two writers commit")
    parser.add_argument("--ranges", type=int, default=10_000, help="ranges of the metadata-growth runs")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure")
    args = parser.parse_args(argv)
    results = Results("tables", "Tables: Delta / Iceberg outputs against a Parquet folder", args)
    if "throughput" in args.parts:
        for rows in args.rows:
            _throughput(args, results, rows)
    for fmt in FORMATS:
        if "commits" in args.parts:
            _commits_per_minute(args, results, fmt)
        if "metadata" in args.parts:
            _metadata_growth(args, results, fmt)
    results.write()
    return results


def _throughput(args: Any, results: Results, rows: int) -> None:
    input_path = make_input(args.work_dir, rows)
    base = common_params(args, input_path, args.work_dir / "out-tables", model=args.model)
    names = ("parquet", *FORMATS)
    order = [name for n in range(args.repeats) for name in (names if n % 2 == 0 else names[::-1])]
    # Each run writes a fresh folder or table of its own (Iceberg: its own name in the catalog).
    runs = []
    for n, name in enumerate(order):
        run = {"output": str(args.work_dir / f"out-tables-{name}-{n}")}
        if name != "parquet":
            run.update(output_format=name, table=f"bench.predictions_{n}" if name == "iceberg" else None)
        shutil.rmtree(run["output"], ignore_errors=True)
        runs.append(run)
    home = args.work_dir / "airflow-home-tables"  # the embedded Iceberg catalog, fresh
    shutil.rmtree(home, ignore_errors=True)
    # A first run warms the Ray workers and the page cache for all the measured ones; not counted.
    warmup = {"output": str(args.work_dir / "out-tables-warmup")}
    shutil.rmtree(warmup["output"], ignore_errors=True)
    result = run_variant("operator_series", {**base, "runs": [warmup, *runs]}, env={"AIRFLOW_HOME": str(home)})
    result["runs"] = result["runs"][1:]
    shutil.rmtree(warmup["output"], ignore_errors=True)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for name, run, measured in zip(order, runs, result["runs"], strict=True):
        summary = measured["summary"]
        assert summary["rows_out"] == rows, summary
        rate = rows / measured["wall_s"]
        rates[name].append(rate)
        results.add(
            part="throughput",
            output=name,
            rows=rows,
            wall_s=measured["wall_s"],
            rows_per_s=round(rate),
        )
        shutil.rmtree(run["output"], ignore_errors=True)
    folder = statistics.median(rates["parquet"])
    for fmt in FORMATS:
        value = ratio(statistics.median(rates[fmt]), folder)
        results.check(
            f"{rows:,} rows: {fmt} table / Parquet folder, rows/s", value, f">= {TARGET_RATIO}", value >= TARGET_RATIO
        )


def _commits_per_minute(args: Any, results: Results, fmt: str) -> None:
    root = args.work_dir / f"commits-{fmt}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        counts = pool.starmap(_commit_for, [(fmt, str(root), ds, args.seconds) for ds in ("2026-11-23", "2026-11-24")])
    total = 0.0
    for ds, (commits, seconds, gave_up) in zip(("2026-11-23", "2026-11-24"), counts, strict=True):
        per_minute = commits * 60 / seconds
        total += per_minute
        results.add(
            part="commits",
            output=fmt,
            writer=ds,
            commits=commits,
            gave_up=gave_up,
            seconds=round(seconds, 1),
            per_minute=round(per_minute),
        )
    results.check(f"{fmt}: table commits per minute, 2 writers of different dates", round(total), "(information)", None)
    # What that many one-file commits leave: the log or metadata a reader opens.
    started = time.perf_counter()
    _writer(fmt, str(root), None, "reader").partition_files({"ds": "2026-11-24"})
    metadata = root / "_delta_log" if fmt == "delta" else root / "metadata"
    results.add(
        part="metadata",
        output=fmt,
        table_commits=sum(c for c, _, _ in counts),
        metadata_kib=round(sum(p.stat().st_size for p in metadata.rglob("*") if p.is_file()) / 1024),
        metadata_files=sum(1 for p in metadata.rglob("*") if p.is_file()),
        open_ms=round((time.perf_counter() - started) * 1000),
    )


def _commit_for(fmt: str, root: str, ds: str, seconds: float) -> tuple[int, float, int]:
    """One writer committing a one-row file per commit to date ``ds`` for ``seconds``: its commits,
    the seconds, and how many commits gave up (lost every attempt to the other writer; a task
    would fail retryably and commit on its next try)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_raybatch.pipeline.errors import StoreUnavailableError
    from airflow_provider_raybatch.pipeline.tables.writer_commits import DataFile

    schema = pa.schema([("id", pa.int64()), ("ds", pa.string())])
    folder = Path(root) / f"ds={ds}" / "w"
    folder.mkdir(parents=True, exist_ok=True)
    writer = _writer(fmt, root, schema, f"writer-{ds}")
    started, seq, gave_up = time.perf_counter(), 0, 0
    while time.perf_counter() - started < seconds:
        path = folder / f"part-{seq}.parquet"
        pq.write_table(pa.table({"id": [seq], "ds": [ds]}, schema=schema), path)
        try:
            writer.commit(seq, [DataFile(f"ds={ds}/w/{path.name}", path.stat().st_size, 1)], {"ds": ds}, [str(seq)])
        except StoreUnavailableError:
            gave_up += 1
            continue  # the same number again, as the next try would
        seq += 1
    return seq, time.perf_counter() - started, gave_up


def _writer(fmt: str, root: str, schema: Any, writer_id: str, catalog_folder: str | None = None) -> Any:
    """A writer of the table at ``root`` (Iceberg: its SQL catalog on SQLite in ``catalog_folder``, default ``root``)."""
    if fmt == "delta":
        from airflow_provider_raybatch.pipeline.tables.delta import DeltaTableWriter

        return DeltaTableWriter(root, schema, ["ds"], writer_id)
    from airflow_provider_raybatch.pipeline.tables.iceberg import IcebergTableWriter, load_catalog

    folder = catalog_folder or root
    catalog = load_catalog({"type": "sql", "uri": f"sqlite:///{folder}/catalog.db", "warehouse": f"file://{folder}"})
    return IcebergTableWriter(catalog, IDENTIFIER, f"file://{root}", schema, ["ds"], writer_id)


def _metadata_growth(args: Any, results: Results, fmt: str) -> None:
    rows_per_range = 10
    input_path = make_input(args.work_dir, args.ranges * rows_per_range, rows_per_file=args.ranges * rows_per_range)
    for interval in (60.0, 1.0):
        output = args.work_dir / f"out-tables-growth-{fmt}"
        home = args.work_dir / f"airflow-home-growth-{fmt}"
        for folder in (output, home):
            shutil.rmtree(folder, ignore_errors=True)
        params = {
            **common_params(args, input_path, output, model=args.model),
            "rows_per_range": rows_per_range,
            "output_format": fmt,
            "table": IDENTIFIER if fmt == "iceberg" else None,
            "table_commit_interval": interval,
        }
        result = run_variant("operator", params, env={"AIRFLOW_HOME": str(home)})
        summary = result["summary"]
        assert summary["rows_out"] == args.ranges * rows_per_range, summary
        metadata = output / "_delta_log" if fmt == "delta" else output / "metadata"
        commits = len(list((output / "ds=2026-11-24").glob("*/g0/_raybatch/table/*.json")))
        started = time.perf_counter()
        # Open the table and plan a read of its current version, as a reader would (Iceberg's
        # catalog: the embedded one the run used, under its Airflow home).
        _writer(fmt, str(output), None, "reader", str(home / "raybatch" / "iceberg")).partition_files(
            {"ds": "2026-11-24"}
        )
        results.add(
            part="metadata",
            output=fmt,
            ranges=summary["ranges_total"],
            commit_interval_s=interval,
            table_commits=commits,
            run_s=round(summary["seconds"], 1),
            metadata_kib=round(sum(p.stat().st_size for p in metadata.rglob("*") if p.is_file()) / 1024),
            metadata_files=sum(1 for p in metadata.rglob("*") if p.is_file()),
            open_ms=round((time.perf_counter() - started) * 1000),
        )


if __name__ == "__main__":
    main()
