"""Classify companies by industry with a text LLM on Ray (Ray's text LLM batch inference guide).

Every answer is one of ``choices``: vLLM structured outputs with ``engine="vllm"``, a JSON
schema enum with ``engine="openai"``, log-likelihood scoring of each choice with
``engine="transformers"``. The defaults run on the embedded local Ray with the tiny random Qwen2
that `make demo-llm` builds under ``.demo/models/`` (its answers are valid, not smart); on a GPU
cluster set ``engine`` to ``vllm`` and ``model`` to e.g. ``Qwen/Qwen2.5-0.5B-Instruct``, and add
``num_gpus: 0`` for vLLM's CPU backend.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Asset, Param

from airflow_provider_raybatch.examples.demo_input import require_demo_input
from airflow_provider_raybatch.operators.llm_batch_inference import LLMBatchInferenceOperator

DEFAULT_ROOT = os.environ.get("RAYBATCH_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo"))
INDUSTRIES = ["Technology", "Finance", "Healthcare", "Retail", "Energy"]
#: Each event's extra is the run's summary, with the rendered output path.
COMPANY_INDUSTRIES = Asset(name="company_industries", uri="x-raybatch://llm_classify/industries")
#: An absolute local path or an s3:// prefix: a relative path would depend on the worker's folder.
PATH_PATTERN = r"^(/|s3://[^/{}]+)[^{}]*$"

with DAG(
    dag_id="llm_classify",
    description="Classify companies into industries with a chat model on Ray Data",
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2026, 11, 1),
    catchup=False,
    default_args={
        "retries": 2,
        # Tests shorten the delay (read when the DAG is parsed).
        "retry_delay": timedelta(seconds=float(os.environ.get("RAYBATCH_RETRY_DELAY_S", "30"))),
    },
    render_template_as_native_obj=True,  # lists, numbers and dicts from params stay what they are
    params={
        "data_root": Param(
            DEFAULT_ROOT,
            type="string",
            pattern=PATH_PATTERN,
            description="Absolute folder or s3:// prefix holding companies/, industries/ and models/",
        ),
        "engine": Param(
            "transformers",
            type="string",
            enum=["transformers", "vllm", "openai"],
            description="transformers (CPU or GPU), vllm (GPU cluster) or openai (an OpenAI-compatible endpoint)",
        ),
        "model": Param(
            None,
            type=["null", "string"],
            description="Model id (e.g. Qwen/Qwen2.5-0.5B-Instruct) or folder; empty: the demo's tiny Qwen2 "
            "under <data_root>/models/",
        ),
        "choices": Param(
            INDUSTRIES,
            type="array",
            minItems=1,
            uniqueItems=True,
            items={"type": "string", "minLength": 1},
            description="The industries: every answer is exactly one of them",
        ),
        "num_gpus": Param(
            None,
            type=["null", "number"],
            minimum=0,
            description="GPUs per engine replica; empty: the engine's own (vllm: tensor x pipeline parallel size); "
            "0 with engine vllm: vLLM's CPU backend (vLLM's CPU build installed where the task runs)",
        ),
        "batch_size": Param(64, type="integer", minimum=1, maximum=4096, description="Companies per engine call"),
        "engine_kwargs": Param({}, type="object", description='Engine settings, e.g. {"max_model_len": 4096} for vLLM'),
        "mode": Param(
            "resume",
            type="string",
            enum=["resume", "overwrite"],
            description="resume: keep what the output already holds and answer only the rest (a rerun "
            "of a finished run does nothing); overwrite: delete the output and answer it all again (after "
            "changing the model, the prompt or another setting, which resume refuses)",
        ),
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
        num_gpus="{{ params.num_gpus }}",
        output_column="industry",
        keep_columns=["Company", "true_industry"],
        id_column="id",
        rows_per_range=100,
        mode="{{ params.mode }}",
        asset=COMPANY_INDUSTRIES,
        pre_execute=require_demo_input("llm_data", "demo-llm"),
    )
