"""Checkpoint cost: the same job with checkpointed ranges vs without checkpoints.

"Without" is the same operator and pipeline with ``rows_per_range`` = the whole input (a single
file), so the job is one range: one read task, one output file, one commit at the very end,
i.e. no checkpoint until the job is done. Everything else (Ray Data stream, stages, driver-side
writer) is identical, so the difference is what checkpointing costs: a read task, a file, a
rename and a commit record per range, and shorter blocks. All runs share one embedded Ray and
are interleaved, so Ray's start-up (5-9 s, noisy) is not part of the comparison.

    python -m benchmarks.checkpoint_cost                 # 2M rows, 3 repeats
    python -m benchmarks.checkpoint_cost --rows 4000000
"""

from __future__ import annotations

from benchmarks.support.cli import base_parser, common_params
from benchmarks.support.data import make_input
from benchmarks.support.results import Results
from benchmarks.support.runs import run_variant
from benchmarks.support.stats import median, ratio

TARGET_SLOWDOWN = 0.05


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[2_000_000])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting (median kept)")
    parser.add_argument(
        "--finer", type=int, nargs="*", default=[25_000], help="extra, finer rows_per_range to show the trend"
    )
    args = parser.parse_args(argv)
    results = Results("checkpoint_cost", "Checkpoint cost: checkpointed ranges vs one range", args)

    for rows in args.rows:
        input_path = make_input(args.work_dir, rows, rows_per_file=rows)  # one file: one range is possible
        settings = {"none (one range)": rows, f"{args.rows_per_range:,} rows per range": args.rows_per_range}
        settings.update({f"{n:,} rows per range": n for n in args.finer})
        output = args.work_dir / "out-checkpoint"
        # A first, discarded run warms the Ray session (worker processes, imports, page cache).
        runs = [{"rows_per_range": args.rows_per_range, "setting": "warm-up"}]
        runs += [{"rows_per_range": n, "setting": name} for _ in range(args.repeats) for name, n in settings.items()]
        series = run_variant("operator_series", {**common_params(args, input_path, output), "runs": runs})["runs"]
        walls = {name: [r["wall_s"] for r in series if r["setting"] == name] for name in settings}
        baseline = median(walls["none (one range)"])
        for name, n in settings.items():
            wall = median(walls[name])
            results.add(
                rows=rows,
                checkpoints=name,
                ranges=-(-rows // n),
                wall_s=round(wall, 2),
                all_runs_s=" / ".join(f"{w:.2f}" for w in walls[name]),
                rows_per_s=round(rows / wall),
                slowdown=round(wall / baseline - 1, 3),
            )
        slowdown = ratio(median(walls[f"{args.rows_per_range:,} rows per range"]), baseline) - 1
        results.check(
            f"{rows:,} rows: {args.rows_per_range:,}-row ranges vs one range, extra time",
            round(slowdown, 3),
            f"< {TARGET_SLOWDOWN}",
            slowdown < TARGET_SLOWDOWN,
        )
    results.note(
        "wall_s: the operator's execute() inside an already started embedded Ray (the actor pool is "
        "still started per run), after one discarded warm-up run; median of the repeats, run interleaved."
    )
    results.write()
    return results


if __name__ == "__main__":
    main()
