"""Status cost: how long ``raybatch status`` (:func:`read_status`) and the UI plugin's task instance
endpoint (its handler) take on an output of N ranges.

The bookkeeping of an output of ``--ranges`` ranges (1,000 input files of row groups cut into
100,000-row ranges; no data files: status never reads one) is written by the ledger's own code:
``plan.json`` by :meth:`OutputLedger.write_plan`, the commit records by :meth:`OutputLedger.record`
in batches as a run writes them (``--records-per-segment``, merged by the writer as it goes),
fenced by a real lease. Two states are timed:

- ``running``: the records of a run still writing (segments, the lease held, ranges left);
- ``done``: the same run finished (records folded into the manifest, the lease released).

Each is read ``--repeats`` times on a fresh reader (the median is reported), on the local
filesystem and on a moto S3 server on loopback.

    python -m benchmarks.status                       # 10,000 ranges, local and moto S3
    python -m benchmarks.status --ranges 1000 --no-s3
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from typing import Any

from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord
from airflow_provider_raybatch.pipeline.commit.lease import Lease, LeaseHolder
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.commit.plan_record import PlanRecord
from airflow_provider_raybatch.pipeline.planning.input_files import InputFile
from airflow_provider_raybatch.pipeline.planning.planner import Plan, plan_ranges
from airflow_provider_raybatch.pipeline.status import read_status
from benchmarks.support.cli import base_parser
from benchmarks.support.data import moto_s3
from benchmarks.support.results import Results

BUCKET = "raybatch-bench-status"
ROWS_PER_RANGE = 100_000


def plan_record(ranges: int) -> tuple[PlanRecord, list[str]]:
    """A plan of ``ranges`` ranges over up to 1,000 files, and its range ids in plan order."""
    files = min(1_000, ranges)
    per_file = -(-ranges // files)
    infos = [
        InputFile(
            f"/in/part-{i:06d}.parquet",
            f"part-{i:06d}.parquet",
            10**8,
            ROWS_PER_RANGE * per_file,
            (ROWS_PER_RANGE,) * per_file,
            f"{i:064x}",
        )
        for i in range(files)
    ]
    plan = Plan(infos, plan_ranges(infos, ROWS_PER_RANGE), None)
    job = {"rows_per_range": ROWS_PER_RANGE, "max_rows": ranges * ROWS_PER_RANGE}
    record = PlanRecord("/in", plan.describe(), job, "bench/run/score/-1")
    return record, [r.id for r in plan.ranges[:ranges]]


def write_output(
    url: str, options: dict[str, Any] | None, ranges: int, per_segment: int, done: int
) -> tuple[OutputLedger, Lease]:
    """The bookkeeping of a run that has committed ``done`` of ``ranges`` ranges: its writer, and its lease (held)."""
    ledger = OutputLedger.open(url, options)
    plan, ids = plan_record(ranges)
    ledger.write_plan(plan)
    lease = Lease(ledger.fs, ledger.lease_folder(), url, LeaseHolder(run_key="bench/run/score/-1"), timeout_s=3600)
    lease.acquire()
    ledger.fence = lease.check
    for start in range(0, done, per_segment):
        batch = ids[start : min(done, start + per_segment)]
        # A reject every 50 ranges, so that the rejects' figures are summed too.
        ledger.record(
            [
                CommitRecord(r, (f"part-{r}.parquet",), ROWS_PER_RANGE, plan=ledger.plan_id)
                if n % 50
                else CommitRecord(r, (f"part-{r}.parquet",), ROWS_PER_RANGE - 1, 1, 1, plan=ledger.plan_id)
                for n, r in enumerate(batch, start)
            ]
        )
    return ledger, lease


def finish(ledger: OutputLedger, lease: Lease, ranges: int, per_segment: int) -> None:
    """Commit the rest, fold the records into the manifest and release the lease, as a run's end does."""
    _, ids = plan_record(ranges)
    committed = ledger.committed()
    left = [r for r in ids if r not in committed]
    for start in range(0, len(left), per_segment):
        ledger.record(
            [CommitRecord(r, (f"part-{r}.parquet",), ROWS_PER_RANGE) for r in left[start : start + per_segment]]
        )
    ledger.finish()
    lease.release()


def time_status(url: str, options: dict[str, Any] | None, repeats: int, state: str, ranges: int) -> dict[str, Any]:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        status = read_status(url, options)
        seconds.append(time.perf_counter() - started)
        assert status.state == state and status.ranges_planned == ranges, (status.state, status.ranges_planned)
    return {
        "state": state,
        "ranges_committed": status.ranges_committed,
        "objects_read": sum(status.objects_read.values()),
        "timeline_points": len(status.timeline),
        "median_s": round(statistics.median(seconds), 4),
        "max_s": round(max(seconds), 4),
    }


def time_ui_handler(url: str, options: dict[str, Any] | None, repeats: int, state: str, ranges: int) -> dict[str, Any]:
    """The UI plugin's task instance endpoint's handler (:func:`.plugins.figures.output_figures`):
    the status with the input plan per file and the committed ranges' picture, a rejects sample,
    and its JSON encoding (what the endpoint answers)."""
    from airflow_provider_raybatch.plugins.figures import output_figures
    from airflow_provider_raybatch.plugins.outputs import ResolvedOutput, TaskRef

    output = ResolvedOutput(TaskRef("bench", "run", "score"), url, "parquet", None, None, "rendered", state, 1, False)
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        document = output_figures(output, options=options or {})
        body = json.dumps(document, default=str)
        seconds.append(time.perf_counter() - started)
        [status] = document["outputs"]
        assert status["state"] == state and len(status["committed_mask"]) == ranges, status["state"]
    return {
        "state": state,
        "ranges_committed": status["ranges_committed"],
        "objects_read": sum(status["objects_read"].values()),
        "timeline_points": len(status["timeline"]),
        "median_s": round(statistics.median(seconds), 4),
        "max_s": round(max(seconds), 4),
        "response_kb": round(len(body) / 1024, 1),
    }


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[])
    parser.add_argument("--ranges", type=int, nargs="+", default=[10_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--records-per-segment", type=int, default=30, help="ranges recorded per batch (a second's)")
    parser.add_argument("--no-s3", action="store_true", help="the local filesystem only")
    parser.add_argument("--no-ui", action="store_true", help="read_status() only, not the UI plugin's handler")
    args = parser.parse_args(argv)
    results = Results("status", "Status cost: read_status() on an output's bookkeeping", args)
    stores = ["local"] + ([] if args.no_s3 else ["moto S3"])
    for store in stores:
        options, server = moto_s3(BUCKET) if store == "moto S3" else (None, None)
        try:
            for n in args.ranges:
                if server is not None:
                    url = f"s3://{BUCKET}/n{n}"
                else:
                    folder = args.work_dir / f"status-{n}"
                    shutil.rmtree(folder, ignore_errors=True)
                    url = str(folder)
                writer = write_output(url, options, n, args.records_per_segment, done=(n * 3) // 5)
                for state in ("running", "done"):
                    if state == "done":
                        finish(*writer, n, args.records_per_segment)
                    results.add(
                        store=store, ranges=n, reader="read_status", **time_status(url, options, args.repeats, state, n)
                    )
                    if not args.no_ui:
                        results.add(
                            store=store,
                            ranges=n,
                            reader="UI endpoint",
                            **time_ui_handler(url, options, args.repeats, state, n),
                        )
                if server is None:
                    shutil.rmtree(url, ignore_errors=True)
        finally:
            if server is not None:
                server.stop()
    for row in results.rows:
        if row["ranges"] == 10_000:
            results.check(
                f"{row['reader']} of 10,000 ranges, {row['store']}, {row['state']}: median s",
                row["median_s"],
                "< 1 s",
                row["median_s"] < 1,
            )
    results.note(
        "median_s: read_status() from a fresh reader, median of the repeats (the first included): plan.json, the "
        "commit records (segments while running, the manifest once done), the leases. 'running': 60 % committed, "
        f"{args.records_per_segment} records a segment as a run's one-second batches write them, merged 16 to 1 "
        "by the writer; no data file is read or exists. 'UI endpoint': the UI plugin's task instance handler "
        "(plugins/figures.py output_figures: the status with the input plan per file and a character per range, "
        "a rejects sample, JSON-encoded), after the task instance is resolved (a few indexed DB queries)."
    )
    results.write()
    return results


if __name__ == "__main__":
    main()
