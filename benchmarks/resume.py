"""Resume: SIGKILL a run at about 50 % of its ranges, rerun it, compare with a full run.

A full run first, then a fresh run in a child process that is killed (SIGKILL, as an OOM kill
or a lost worker would) once about half the ranges have commit records, then a rerun on the
same output. The rerun's summary says how many rows it processed and how long it took.

    python -m benchmarks.resume                # 4M rows
    python -m benchmarks.resume --rows 1000000
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from benchmarks.support.cli import base_parser, common_params
from benchmarks.support.commits import commit_records, commit_timeline
from benchmarks.support.data import make_input
from benchmarks.support.results import Results
from benchmarks.support.runs import VariantRun, run_variant
from benchmarks.support.stats import ratio

TARGET_ROWS = 0.55
TARGET_TIME = 0.6


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[4_000_000])
    parser.add_argument("--kill-at", type=float, default=0.5, help="fraction of ranges committed when killed")
    args = parser.parse_args(argv)
    results = Results("resume", "Resume: rerun after a SIGKILL at about 50 % of ranges", args)

    for rows in args.rows:
        input_path = make_input(args.work_dir, rows)
        output = args.work_dir / "out-resume"
        shutil.rmtree(output, ignore_errors=True)  # the commits polled below must be this run's
        params = common_params(args, input_path, output)

        full_output = args.work_dir / "out-resume-full"
        full_result = run_variant("operator", common_params(args, input_path, full_output))
        full = full_result["summary"]
        results.add(run="full run", rows=rows, **_summary_columns(full), **_first_commit(full_output, full_result))

        killed_at_start = time.monotonic()
        killed = VariantRun("operator", {**params, "fresh_output": False})
        kill_at = max(1, round(full["ranges_total"] * args.kill_at))
        while len(commit_records(output)) < kill_at and killed.process.poll() is None:
            time.sleep(0.05)
        killed.kill()
        killed_seconds = time.monotonic() - killed_at_start
        killed_result = killed.finish()
        committed = len(commit_records(output))
        results.add(
            run=f"killed (SIGKILL) after {committed}/{full['ranges_total']} ranges",
            rows=rows,
            seconds=round(killed_seconds, 2),  # from the process's start: it never printed its own
            returncode=killed_result["returncode"],
        )

        rerun_result = run_variant("operator", {**params, "fresh_output": False})
        rerun = rerun_result["summary"]
        results.add(run="rerun", rows=rows, **_summary_columns(rerun), **_first_commit(output, rerun_result))
        assert rerun["ranges_skipped"] == committed and rerun["rows_out"] == rows, rerun

        rows_fraction = ratio(rerun["rows_processed"], full["rows_processed"])
        time_fraction = ratio(rerun["seconds"], full["seconds"])
        results.check(
            f"{rows:,} rows: rerun rows / full run rows",
            rows_fraction,
            f"<= {TARGET_ROWS}",
            rows_fraction <= TARGET_ROWS,
        )
        results.check(
            f"{rows:,} rows: rerun time / full run time",
            time_fraction,
            f"<= {TARGET_TIME}",
            time_fraction <= TARGET_TIME,
        )
        results.note(
            f"{rows:,} rows: killed once {committed} of {full['ranges_total']} ranges were committed "
            f"({committed / full['ranges_total']:.0%}); the rerun skipped them and processed "
            f"{rerun['rows_processed']:,} rows."
        )
    results.note("seconds: the summary's `seconds` (planning, Ray start and shutdown included).")
    results.write()
    return results


def _first_commit(output: Path, result: dict) -> dict:
    """Seconds from the run's start to its first commit: the fixed cost it paid."""
    return {"first_commit_s": commit_timeline(output, result["started_at"]).get("first_commit_s", "")}


def _summary_columns(summary: dict) -> dict:
    return {
        "seconds": summary["seconds"],
        "rows_processed": summary["rows_processed"],
        "ranges_done": summary["ranges_done"],
        "ranges_skipped": summary["ranges_skipped"],
    }


if __name__ == "__main__":
    main()
