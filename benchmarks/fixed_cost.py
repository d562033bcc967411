"""Fixed cost: seconds from task start to the first committed range, and for an empty input.

Runs the operator (local Ray) in a fresh process per measurement, as a task would:
- Ray alone: import, embedded start, shutdown (the floor under every Ray run);
- one range (10,000 rows): time to its commit and to the end of the task;
- 1M rows: time to the first of its ranges' commits;
- an empty input (a file with no rows): no Ray is started;
- a rerun of a finished output: returns the recorded summary, no Ray;
each with a Ray started for the task (``per-task``), then Ray alone, one range and the first
rows on the host's shared Ray once it is warm (``shared``: started by an untimed first run),
with the warm workers the previous run of the same environment left, and in a new environment.

    python -m benchmarks.fixed_cost
"""

from __future__ import annotations

import itertools

from benchmarks.support.cli import base_parser, common_params
from benchmarks.support.commits import commit_timeline
from benchmarks.support.data import make_input
from benchmarks.support.processes import shared_ray_env
from benchmarks.support.results import Results
from benchmarks.support.runs import run_variant
from benchmarks.support.stats import median

SMALL_ROWS = 10_000


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[1_000_000])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each measurement (median kept)")
    args = parser.parse_args(argv)
    results = Results("fixed_cost", "Fixed cost: time to the first committed range, empty input", args)

    per_task(args, results)
    shared_warm(args, results)
    results.note(
        "wall_s runs from the operator's execute() to its return (Ray shut down, or disconnected from the "
        "shared Ray); first_commit_s from the same start to the first commit record's modification time."
    )
    results.write()
    return results


def per_task(args, results: Results) -> None:
    ray_runs = [run_variant("ray_start", {}) for _ in range(args.repeats)]
    add_ray_alone(results, "Ray alone: import + embedded start + shutdown", ray_runs, ("start", "shutdown"))

    cases = [("one range", SMALL_ROWS), *((f"{rows:,} rows", rows) for rows in args.rows), ("empty input", 0)]
    for case, rows in cases:
        input_path = make_input(args.work_dir, rows)
        output = args.work_dir / f"out-fixed-{rows}"
        runs = []
        for _ in range(args.repeats):
            result = run_variant("operator", common_params(args, input_path, output))
            runs.append({**result, **commit_timeline(output, result["started_at"])})
        first = [r["first_commit_s"] for r in runs if "first_commit_s" in r]
        results.add(
            case=f"operator, {case}",
            rows=rows,
            first_commit_s=round(median(first), 2) if first and rows else "",
            wall_s=round(median(r["wall_s"] for r in runs), 2),
            detail="no Ray started" if rows == 0 else f"{runs[-1]['summary']['ranges_total']} range(s)",
            load_avg=runs[-1]["load_avg"],
        )
        if rows == SMALL_ROWS:
            # The output is finished: a rerun (a cleared task, a backfill) returns its summary.
            rerun = run_variant("operator", {**common_params(args, input_path, output), "fresh_output": False})
            assert rerun["summary"]["rows_processed"] == 0, rerun["summary"]
            results.add(
                case="operator, rerun of a finished output",
                rows=rows,
                first_commit_s="",
                wall_s=round(rerun["wall_s"], 2),
                detail="no Ray started",
                load_avg=rerun["load_avg"],
            )


def add_ray_alone(results: Results, case: str, runs: list[dict], names: tuple[str, str]) -> None:
    """A row for runs of Ray alone: import, then the start (or connect) and the end, named by ``names``."""
    steps = ("import_s", "init_s", "shutdown_s")
    results.add(
        case=case,
        rows=0,
        first_commit_s="",
        wall_s=round(median(sum(r[k] for k in steps) for r in runs), 2),
        detail=", ".join(
            f"{name} {median(r[k] for r in runs):.2f} s" for name, k in zip(("import", *names), steps, strict=True)
        ),
        load_avg=runs[-1]["load_avg"],
    )


def shared_warm(args, results: Results) -> None:
    """The same task on the host's shared Ray, warm: the first run (untimed) starts it."""
    with shared_ray_env() as env:
        cold = run_variant("ray_start", {}, env)
        add_ray_alone(
            results,
            "shared Ray, cold: import + start the head + connect + disconnect",
            [cold],
            ("start and connect", "disconnect"),
        )
        ray_runs = [run_variant("ray_start", {}, env) for _ in range(args.repeats)]
        add_ray_alone(results, "shared Ray, warm: import + connect + disconnect", ray_runs, ("connect", "disconnect"))
        cases = [("one range", SMALL_ROWS), *((f"{rows:,} rows", rows) for rows in args.rows)]
        # Untimed: the first task of this environment leaves the warm workers the next one finds.
        first_input = make_input(args.work_dir, SMALL_ROWS)
        run_variant("operator", common_params(args, first_input, args.work_dir / "out-fixed-shared-first"), env)
        # New environments last: their warm workers, left for nobody, take room until the idle timeout.
        for workers, (case, rows) in itertools.product(("warm workers", "new environment"), cases):
            input_path = make_input(args.work_dir, rows)
            output = args.work_dir / f"out-fixed-shared-{rows}"
            runs = []
            for run in range(args.repeats):
                # A task finds the warm workers of the last task with its environment: another
                # environment each run finds none, and starts its own.
                run_env = env if workers == "warm workers" else {**env, "RAYBATCH_BENCH_RUN": f"{case}-{run}"}
                result = run_variant("operator", common_params(args, input_path, output), run_env)
                runs.append({**result, **commit_timeline(output, result["started_at"])})
            first = [r["first_commit_s"] for r in runs if "first_commit_s" in r]
            results.add(
                case=f"operator on the warm shared Ray ({workers}), {case}",
                rows=rows,
                first_commit_s=round(median(first), 2) if first else "",
                wall_s=round(median(r["wall_s"] for r in runs), 2),
                detail=f"{runs[-1]['summary']['ranges_total']} range(s)",
                load_avg=runs[-1]["load_avg"],
            )


if __name__ == "__main__":
    main()
