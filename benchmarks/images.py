"""Images: the operator (a CPU preprocessing stage + a CNN stage) vs the guide's hand-written Ray
Data pipeline vs Daft vs a plain single-process loop.

Ray's batch inference guide's image workload: Parquet of JPEG bytes (generated, 224-320 pixels a
side), decoded and resized to 224x224 and normalised on CPUs, classified by a small torch CNN
(``benchmarks.cnn``; no torchvision here), each image's id and label written as Parquet. The
same preprocessing function, model, weights, batch size and torch threads everywhere (Daft
decodes and resizes with its own image functions); each run in its own process, the variants
back to back, so ratios come from one run. Every variant's decode and model calls time
themselves (``benchmarks.support.timings.record``): the table splits each run into decode, model, and the
rest (start-up, hand-off between stages, writing, shut-down).

    python -m benchmarks.images               # 2,000 images
    python -m benchmarks.images --quick       # 200 images: checks that everything runs
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.support.cli import base_parser
from benchmarks.support.commits import commit_timeline
from benchmarks.support.data import cnn_weights, make_image_input
from benchmarks.support.processes import shared_ray_env
from benchmarks.support.results import Results
from benchmarks.support.runs import DAFT_ENV_HINT, DAFT_PYTHON, run_variant
from benchmarks.support.stats import median, ratio
from benchmarks.support.timings import TIMINGS_ENV, read_timings

VARIANTS = ["plain", "operator", "operator_shared", "handwritten", "daft"]
OPERATORS = ("operator", "operator_shared")
QUICK_IMAGES = [200]
BATCH_SIZE = 64  # images per model call (the guide's order of magnitude)
#: The operator's rows/s over each baseline's (wall time), at the largest size.
TARGETS = {"handwritten": 1.0, "daft": 1.0}


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[2000])
    parser.set_defaults(batch_size=BATCH_SIZE)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_IMAGES[0]} images (overrides --rows)")
    parser.add_argument(
        "--variants", nargs="+", default=None, choices=VARIANTS, help=f"default: all ({' '.join(VARIANTS)})"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each variant per size (median kept)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows = QUICK_IMAGES
    variants = args.variants or list(VARIANTS)
    skipped_daft = False
    if "daft" in variants and not DAFT_PYTHON.exists():
        if args.variants:
            parser.error(f"the daft variant needs Daft's environment, {DAFT_PYTHON} is missing: {DAFT_ENV_HINT}")
        variants.remove("daft")
        skipped_daft = True
    args.variants = variants
    results = Results(
        "images", "Images: operator (preprocess + CNN stages) vs hand-written Ray Data vs Daft vs plain loop", args
    )
    if skipped_daft:
        results.note(f"daft: not run, {DAFT_PYTHON} is missing; {DAFT_ENV_HINT}")
    with shared_ray_env() as shared_env:
        if "operator_shared" in variants:
            run_variant("ray_start", {}, shared_env)  # starts the shared head: the timed runs find it warm
        measure(args, results, variants, shared_env)
    results.write()
    return results


def measure(args, results: Results, variants: list[str], shared_env: dict[str, str]) -> None:
    weights = str(cnn_weights(args.work_dir))
    for images in args.rows:
        input_path = make_image_input(args.work_dir, images)
        print(f"{images:,} images", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for _ in range(args.repeats):
            for variant in variants:  # interleaved: load changes hit every variant alike
                output = args.work_dir / f"out-images-{variant}"
                timings = args.work_dir / f"timings-images-{variant}.jsonl"
                timings.unlink(missing_ok=True)
                params = {
                    "input": str(input_path),
                    "output": str(output),
                    "weights": weights,
                    "batch_size": args.batch_size,
                    "threads": args.threads,
                    "rows_per_range": args.rows_per_range,
                }
                env = {TIMINGS_ENV: str(timings)}
                name = "images_operator" if variant in OPERATORS else f"images_{variant}"
                if variant == "operator_shared":
                    env.update(shared_env)
                result = run_variant(name, params, env, python=DAFT_PYTHON if variant == "daft" else None)
                if variant in OPERATORS:
                    result.update(commit_timeline(output, result["started_at"]))
                result["breakdown"] = breakdown(timings, result)
                runs[variant].append(result)
        wall = {v: median(r["wall_s"] for r in runs[v]) for v in variants}
        for variant in variants:
            last = runs[variant][-1]
            results.add(
                images=images,
                variant=variant,
                wall_s=round(wall[variant], 2),
                images_per_s=round(images / wall[variant], 1),
                task_s=last.get("summary", {}).get("seconds", ""),
                process_s=round(median(r["process_s"] for r in runs[variant]), 2),
                **last["breakdown"],
                first_commit_s=last.get("first_commit_s", ""),
                peak_rss_mb=last["peak_rss_mb"],
                repeats=len(runs[variant]),
                load_avg=last["load_avg"],
            )
        check_ratios(results, images, wall, images == max(args.rows))


def breakdown(timings: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Where a run's time went, from the batches its decode and model calls timed.

    ``decode_s``, ``model_s`` (and the plain loop's ``read_s``, ``write_s``; Daft's ``normalize_s``,
    its decode being native): seconds spent in those calls, summed over processes.
    ``to_model_s``: from the clock's start to the first model call (Ray's start, the replicas'
    start, the first read and decode). ``model_gaps_s``: time between the first model call's
    start and the last one's end that the model did not compute: in a pipeline, the hand-off of
    batches between stages, writing in the model's replica, and waiting for decoded images.
    ``after_model_s``: from the last model call to the end of the clock (the last write, the
    last commits, the engine's shut-down).
    """
    lines = read_timings(timings)
    spent: dict[str, float] = {}
    for line in lines:
        spent[line["stage"]] = spent.get(line["stage"], 0.0) + line["end"] - line["start"]
    row: dict[str, Any] = {f"{stage}_s": round(seconds, 4) for stage, seconds in sorted(spent.items())}
    model = sorted((line["start"], line["end"]) for line in lines if line["stage"] == "model")
    if model:
        start, end = result["started_at"], result["started_at"] + result["wall_s"]
        first, last = model[0][0], max(e for _, e in model)
        row["to_model_s"] = round(first - start, 2)
        row["model_gaps_s"] = round((last - first) - spent["model"], 2)
        row["after_model_s"] = round(end - last, 2)
    return row


def check_ratios(results: Results, images: int, wall: dict[str, float], largest: bool) -> None:
    """Each operator variant's speed over each baseline's (the baseline's wall time over its own)."""
    for operator in [v for v in OPERATORS if v in wall]:
        for baseline in ("plain", "handwritten", "daft"):
            if baseline not in wall:
                continue
            value = ratio(wall[baseline], wall[operator])
            target = TARGETS.get(baseline)
            met = None if target is None or not largest else value >= target
            shown = "(none)" if target is None else f">= {target}x"
            results.check(f"{images:,} images: {operator}/{baseline} images/s", value, shown, met)


if __name__ == "__main__":
    main()
