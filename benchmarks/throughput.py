"""Throughput: the operator vs a hand-written Ray Data pipeline vs a plain single-process loop.

Same Parquet, same model (benchmarks.model.MLP), same batch size and torch thread count; each
run in its own process, the variants back to back for each size, so ratios come from one run.

    python benchmarks/throughput.py                 # 1M and 4M rows, a few minutes
    python benchmarks/throughput.py --rows 200000   # quick
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    Results,
    base_parser,
    commit_timeline,
    common_params,
    make_input,
    median,
    ratio,
    run_variant,
)

VARIANTS = ["plain", "operator", "handwritten_arrow", "handwritten"]
TARGET_VS_PLAIN = 0.9  # operator rows/s >= 0.9 x the plain loop's at 4M rows
TARGET_VS_HANDWRITTEN = 1.0  # and faster than the hand-written pipeline


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[1_000_000, 4_000_000])
    parser.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each variant per size (median kept)")
    args = parser.parse_args(argv)
    results = Results("throughput", "Throughput: operator vs hand-written Ray Data vs plain loop", args)

    for rows in args.rows:
        input_path = make_input(args.work_dir, rows)
        print(f"{rows:,} rows", flush=True)
        runs: dict[str, list[dict]] = {v: [] for v in args.variants}
        for _ in range(args.repeats):
            for variant in args.variants:  # interleaved: load changes hit every variant alike
                output = args.work_dir / f"out-throughput-{variant}"
                result = run_variant(variant, common_params(args, input_path, output))
                if variant == "operator":
                    result.update(commit_timeline(output, result["started_at"]))
                runs[variant].append(result)
        wall = {v: median(r["wall_s"] for r in runs[v]) for v in args.variants}
        for variant in args.variants:
            last = runs[variant][-1]
            results.add(
                rows=rows,
                variant=variant,
                wall_s=round(wall[variant], 2),
                rows_per_s=round(rows / wall[variant]),
                first_commit_s=last.get("first_commit_s", ""),
                steady_rows_per_s=last.get("steady_rows_per_s", ""),
                peak_rss_mb=last["peak_rss_mb"],
                repeats=len(runs[variant]),
                load_avg=last["load_avg"],
            )
        if "operator" in wall:
            for baseline, target in (("plain", TARGET_VS_PLAIN), ("handwritten", TARGET_VS_HANDWRITTEN)):
                if baseline in wall:
                    # A ratio of speeds (rows/s): the baseline's time over the operator's.
                    value = ratio(wall[baseline], wall["operator"])
                    met = value >= target if rows == max(args.rows) or baseline != "plain" else None
                    results.check(f"{rows:,} rows: operator/{baseline} rows/s", value, f">= {target}x", met)
            if "handwritten_arrow" in wall:
                value = ratio(wall["handwritten_arrow"], wall["operator"])
                results.check(f"{rows:,} rows: operator/handwritten_arrow rows/s", value, "(none)", None)
    results.write()
    return results


if __name__ == "__main__":
    main()
