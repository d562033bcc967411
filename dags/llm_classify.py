"""Classify companies by industry with a text LLM on Ray (Ray's text LLM batch inference guide).

Every answer is one of ``choices``: vLLM structured outputs with ``engine="vllm"``, a JSON
schema enum with ``engine="openai"``, log-likelihood scoring of each choice with
``engine="transformers"``. The defaults run on the embedded local Ray with the tiny random Qwen2
that `make demo-llm` builds under ``.demo/models/`` (its answers are valid, not smart); on a GPU
cluster set ``engine`` to ``vllm`` and ``model`` to e.g. ``Qwen/Qwen2.5-0.5B-Instruct``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_provider_raybatch.operators.llm_batch_inference import LLMBatchInferenceOperator

DEFAULT_ROOT = os.environ.get("RAYBATCH_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo"))
INDUSTRIES = ["Technology", "Finance", "Healthcare", "Retail", "Energy"]

with DAG(
    dag_id="llm_classify",
    description="Classify companies into industries with a chat model on Ray Data",
    schedule=None,
    start_date=datetime(2026, 11, 1),
    catchup=False,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    render_template_as_native_obj=True,
    params={
        "data_root": Param(DEFAULT_ROOT, type="string", minLength=1, description="holds companies/ and industries/"),
        "engine": Param("transformers", enum=["transformers", "vllm", "openai"]),
        "model": Param("", type="string", description="model id or folder; empty: the demo's tiny Qwen2"),
        "choices": Param(INDUSTRIES, type="array", minItems=1, items={"type": "string"}),
        "batch_size": Param(64, type="integer", minimum=1),
        "engine_kwargs": Param({}, type="object"),
    },
    tags=["raybatch", "example", "llm"],
) as dag:
    LLMBatchInferenceOperator(
        task_id="classify",
        input_path="{{ params.data_root }}/companies/",
        output_path="{{ params.data_root }}/industries/",
        system_prompt="You are a business analyst. Answer with the industry only.",
        prompt="What industry is this company in: {Company}",
        choices="{{ params.choices }}",
        model="{{ params.model or params.data_root ~ '/models/tiny-qwen2' }}",
        engine="{{ params.engine }}",
        sampling_params={"temperature": 0, "max_tokens": 8},
        engine_kwargs="{{ params.engine_kwargs }}",
        batch_size="{{ params.batch_size }}",
        output_column="industry",
        keep_columns=["Company", "true_industry"],
        id_column="id",
        rows_per_range=100,
    )
