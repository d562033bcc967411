"""Memory: peak memory of the whole process tree at 1M and 4M rows.

The tree is the task's process and every descendant: Ray's GCS and raylet, its workers and
agents, the predictor's actor. Sampled every 0.5 s: the sum of RSS (counts the shared object
store once per process that maps it: an over-estimate) and the sum of PSS (shared pages divided
among their users: the tree's real footprint). Streaming means the peak does not grow with the
input; the plain loop is shown for scale.

    python -m benchmarks.memory
"""

from __future__ import annotations

from benchmarks.support.cli import base_parser, common_params
from benchmarks.support.data import make_input
from benchmarks.support.results import Results
from benchmarks.support.runs import run_variant
from benchmarks.support.stats import ratio

VARIANTS = ["operator", "plain"]
#: "Bounded": the peak at the largest input may exceed the smallest's by sampling noise only.
MAX_GROWTH = 1.2


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[1_000_000, 4_000_000])
    parser.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    args = parser.parse_args(argv)
    results = Results("memory", "Memory: peak of the whole process tree", args)

    peaks: dict[str, dict[int, float]] = {v: {} for v in args.variants}
    for rows in args.rows:
        input_path = make_input(args.work_dir, rows)
        for variant in args.variants:
            output = args.work_dir / f"out-memory-{variant}"
            result = run_variant(variant, common_params(args, input_path, output), pss=True)
            peaks[variant][rows] = result["peak_pss_mb"]
            results.add(
                rows=rows,
                variant=variant,
                peak_pss_mb=result["peak_pss_mb"],
                peak_rss_mb=result["peak_rss_mb"],
                processes=result["peak_processes"],
                wall_s=result["wall_s"],
                load_avg=result["load_avg"],
            )
    small, large = min(args.rows), max(args.rows)
    if small != large:
        for variant in args.variants:
            growth = ratio(peaks[variant][large], peaks[variant][small])
            results.check(
                f"{variant}: peak PSS at {large:,} / at {small:,} rows",
                growth,
                f"<= {MAX_GROWTH} (bounded)",
                growth <= MAX_GROWTH if variant == "operator" else None,
            )
    results.write()
    return results


if __name__ == "__main__":
    main()
