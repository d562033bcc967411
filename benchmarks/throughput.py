"""Throughput: the operator vs hand-written Ray Data pipelines vs Daft vs a plain single-process loop.

Same Parquet, same model (benchmarks.model.MLP), same batch size and torch thread count; each
run in its own process, the variants back to back for each size, so ratios come from one run.
Two models by default: ``heavy`` (32-256-256-10, inference is most of the time) and ``light``
(32-64-10, the data path shows), where Daft's class UDF on its native runner is the reference.
``operator`` starts a Ray for its task, as ``RAYBATCH_LOCAL_RAY=per-task`` does;
``operator_shared`` runs on the host's shared local Ray, warm (an untimed first run starts it).
``defaults_shared`` and ``defaults_cold`` run the operator as a new user does: a predictor class
as Ray's guide shows one (``benchmarks.model:GuideClassifier``, the light model's ``argmax`` or
the wide model's 256 outputs, no thread settings) and the operator's defaults but ``batch_size`` and ``id_column``; on the warm
shared Ray (warm from an untimed first run of the same task), and on a cold one (each run starts a
shared head of its own, in a folder of its own, and stops it after).

    python -m benchmarks.throughput                                # 1M and 4M rows, both models
    python -m benchmarks.throughput --rows 200000 --model light    # quick
    python -m benchmarks.throughput --rows 4000000 --model light --rows-per-file 125000 \
        --row-group-rows 31250 --variants plain daft defaults_shared defaults_cold   # issue 30's user
"""

from __future__ import annotations

from benchmarks.model import SHAPES
from benchmarks.support.cli import base_parser, common_params
from benchmarks.support.commits import commit_timeline
from benchmarks.support.data import make_input
from benchmarks.support.processes import shared_ray_env
from benchmarks.support.results import Results
from benchmarks.support.runs import DAFT_ENV_HINT, DAFT_PYTHON, run_variant
from benchmarks.support.stats import median, ratio

VARIANTS = [
    "plain",
    "operator",
    "operator_shared",
    "defaults_shared",
    "defaults_cold",
    "handwritten_arrow",
    "handwritten",
    "daft",
]
OPERATORS = ("operator", "operator_shared", "defaults_shared", "defaults_cold")
#: Operator variants on the benchmark's warm shared Ray, and the variant each one runs.
ON_SHARED = {"operator_shared": "operator", "defaults_shared": "operator_defaults"}
#: Variants with the user's predictor (``benchmarks.model.GuideClassifier``), and the models it runs.
USER_VARIANTS = ("defaults_shared", "defaults_cold")
USER_MODELS = ("light", "wide")
MODELS = ["heavy", "light"]
#: Targets per model, as speed ratios (the other's time over the operator's): the operator's
#: rows/s over each baseline's at the largest size (the hand-written one at every size), each
#: timed by ``wall_s``.
TARGETS: dict[str, dict[str, float]] = {
    "heavy": {"plain": 0.9, "handwritten": 1.0},
    "light": {"handwritten": 1.0},
}
#: The light model's comparison (issue 13), on the issue's clocks: the task's own seconds against
#: the baseline's whole run (its process: interpreter, imports, work), at the largest size. Once
#: running, 0.9x the plain loop's marginal rate (below).
WHOLE_RUN_TARGETS: dict[str, dict[str, float]] = {"light": {"plain": 0.8, "daft": 1.0}}
#: The same for a task that finds no local Ray and starts the shared head (issue 30).
COLD_WHOLE_RUN_TARGETS: dict[str, float] = {"plain": 0.6, "daft": 0.8}
#: Marginal rows/s (largest size minus smallest, so fixed costs cancel), operator over plain.
MARGINAL_TARGETS = {"light": 0.9}


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[1_000_000, 4_000_000])
    parser.add_argument(
        "--variants", nargs="+", default=None, choices=VARIANTS, help=f"default: all ({' '.join(VARIANTS)})"
    )
    parser.add_argument(
        "--model", nargs="+", default=MODELS, choices=list(SHAPES), help=f"MLP shapes (default: {' '.join(MODELS)})"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each variant per size (median kept)")
    args = parser.parse_args(argv)
    variants = args.variants or list(VARIANTS)
    skipped_daft = False
    if "daft" in variants and not DAFT_PYTHON.exists():
        if args.variants:  # asked for by name: say how to get it rather than fail in the child
            parser.error(f"the daft variant needs Daft's environment, {DAFT_PYTHON} is missing: {DAFT_ENV_HINT}")
        variants.remove("daft")
        skipped_daft = True
    args.variants = variants
    results = Results("throughput", "Throughput: operator vs hand-written Ray Data vs Daft vs plain loop", args)
    if skipped_daft:
        results.note(f"daft: not run, {DAFT_PYTHON} is missing; {DAFT_ENV_HINT}")

    with shared_ray_env() as shared_env:
        if "operator_shared" in variants or "defaults_shared" in variants:
            run_variant("ray_start", {}, shared_env)  # starts the shared head: the timed runs find it warm
        if "defaults_shared" in variants:
            # A user's first run of the task (untimed) leaves warm workers for the next one of its environment.
            small = make_input(args.work_dir, 100_000, args.rows_per_file, row_group_rows=args.row_group_rows)
            for model in [m for m in args.model if m in USER_MODELS]:
                params = common_params(args, small, args.work_dir / "out-throughput-warmup", model)
                run_variant("operator_defaults", params, shared_env)
        measure(args, results, variants, shared_env)
    results.write()
    return results


def measure(args, results: Results, all_variants: list[str], shared_env: dict[str, str]) -> None:
    walls: dict[str, dict[int, dict[str, float]]] = {m: {} for m in args.model}
    for rows in args.rows:
        input_path = make_input(args.work_dir, rows, args.rows_per_file, row_group_rows=args.row_group_rows)
        for model in args.model:
            print(f"{rows:,} rows, {model} model", flush=True)
            # The user's predictor is the light or the wide model: with the heavy one its variants are left out.
            variants = [v for v in all_variants if model in USER_MODELS or v not in USER_VARIANTS]
            runs: dict[str, list[dict]] = {v: [] for v in variants}
            for _ in range(args.repeats):
                for variant in variants:  # interleaved: load changes hit every variant alike
                    output = args.work_dir / f"out-throughput-{variant}"
                    params = common_params(args, input_path, output, model)
                    if variant in ON_SHARED:
                        result = run_variant(ON_SHARED[variant], params, shared_env)
                    elif variant == "defaults_cold":
                        with shared_ray_env() as cold_env:  # no head there yet: the task starts it
                            result = run_variant("operator_defaults", params, cold_env)
                    else:
                        result = run_variant(variant, params, python=DAFT_PYTHON if variant == "daft" else None)
                    if variant in OPERATORS:
                        result.update(commit_timeline(output, result["started_at"]))
                    runs[variant].append(result)
            wall = walls[model][rows] = {v: median(r["wall_s"] for r in runs[v]) for v in variants}
            for variant in variants:
                last = runs[variant][-1]
                results.add(
                    rows=rows,
                    model=model,
                    variant=variant,
                    wall_s=round(wall[variant], 2),
                    rows_per_s=round(rows / wall[variant]),
                    task_s=last.get("summary", {}).get("seconds", ""),
                    process_s=round(median(r["process_s"] for r in runs[variant]), 2),
                    first_commit_s=last.get("first_commit_s", ""),
                    steady_rows_per_s=last.get("steady_rows_per_s", ""),
                    peak_rss_mb=last["peak_rss_mb"],
                    repeats=len(runs[variant]),
                    load_avg=last["load_avg"],
                )
            largest = rows == max(args.rows)
            check_ratios(results, model, rows, wall, largest)
            whole = {v: median(r["process_s"] for r in runs[v]) for v in variants if v not in OPERATORS}
            tasks = {v: median(r["summary"]["seconds"] for r in runs[v]) for v in variants if v in OPERATORS}
            check_whole_runs(results, model, rows, tasks, whole, largest)
    for model in args.model:
        check_marginal(results, model, walls[model])


def check_ratios(results: Results, model: str, rows: int, wall: dict[str, float], largest: bool) -> None:
    """Each operator variant's speed over each baseline's; against its target at the largest size."""
    targets = TARGETS.get(model, {})
    for operator in [v for v in OPERATORS if v in wall]:
        for baseline in ("plain", "daft", "handwritten", "handwritten_arrow"):
            if baseline not in wall:
                continue
            # A ratio of speeds (rows/s): the baseline's time over the operator's.
            value = ratio(wall[baseline], wall[operator])
            target = targets.get(baseline)
            met = None if target is None or not (largest or baseline == "handwritten") else value >= target
            shown = "(none)" if target is None else f">= {target}x"
            results.check(f"{rows:,} rows, {model}: {operator}/{baseline} rows/s", value, shown, met)


def check_whole_runs(
    results: Results, model: str, rows: int, tasks: dict[str, float], whole: dict[str, float], largest: bool
) -> None:
    """Each operator variant's task seconds against each baseline's whole process, as rows/s."""
    for baseline, warm_target in WHOLE_RUN_TARGETS.get(model, {}).items():
        for operator, seconds in tasks.items():
            target = COLD_WHOLE_RUN_TARGETS[baseline] if operator == "defaults_cold" else warm_target
            if baseline in whole:
                value = ratio(whole[baseline], seconds)
                results.check(
                    f"{rows:,} rows, {model}: {operator} task / {baseline} whole run, rows/s",
                    value,
                    f">= {target}x",
                    value >= target if largest else None,
                )


def check_marginal(results: Results, model: str, walls: dict[int, dict[str, float]]) -> None:
    """Rows/s between the smallest and largest size, where fixed costs cancel: each operator over plain."""
    if len(walls) < 2:
        return
    small, large = min(walls), max(walls)
    measured = set(walls[small]) & set(walls[large])
    if "plain" not in measured:
        return
    for operator in [v for v in OPERATORS if v in measured]:
        spent = {v: walls[large][v] - walls[small][v] for v in (operator, "plain")}
        if min(spent.values()) <= 0:  # sizes too close to tell apart from noise: no rate to compare
            results.note(f"{model}, {operator}: no marginal rate, {large:,} rows took no longer than {small:,}")
            continue
        marginal = {v: (large - small) / spent[v] for v in spent}
        value = ratio(marginal[operator], marginal["plain"])
        target = MARGINAL_TARGETS.get(model)
        results.check(
            f"{small:,} -> {large:,} rows, {model}: {operator}/plain marginal rows/s "
            f"({marginal[operator]:,.0f} vs {marginal['plain']:,.0f})",
            value,
            "(none)" if target is None else f">= {target}x",
            None if target is None else value >= target,
        )


if __name__ == "__main__":
    main()
