"""Daily image captioning with a vision-language model on Ray (Ray's multimodal batch inference guide).

Each day's images (a Parquet folder with an ``id`` and the encoded image in ``jpg``) are
captioned; corrupt images go to ``captions/<ds>/_rejects/`` with the reason. The defaults run on
the embedded local Ray with the ``transformers`` engine and the tiny random Llava that
`make demo-llm` builds under ``.demo/models/`` (its captions are noise: it shows the plumbing).
On a GPU cluster: set ``engine`` to ``vllm`` and ``model`` to e.g. ``Qwen/Qwen2.5-VL-3B-Instruct``
(and a ``ray_default`` connection); or ``openai`` with an ``openai_default`` connection.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_provider_raybatch.operators.vlm_caption import VLMCaptionOperator

DEFAULT_ROOT = os.environ.get("RAYBATCH_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo"))

with DAG(
    dag_id="vlm_caption",
    description="Caption each day's images with a VLM on Ray Data",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    render_template_as_native_obj=True,  # numbers and dicts from params stay numbers and dicts
    params={
        "data_root": Param(
            DEFAULT_ROOT, type="string", minLength=1, description="holds images/<ds>/ and captions/<ds>/"
        ),
        "engine": Param("transformers", enum=["transformers", "vllm", "openai"], description="the engine"),
        "model": Param("", type="string", description="model id or folder; empty: the demo's tiny Llava"),
        "batch_size": Param(16, type="integer", minimum=1),
        "concurrency": Param(1, type="integer", minimum=1, description="engine replicas"),
        "sampling_params": Param({"temperature": 0.3, "max_tokens": 16}, type="object"),
        "engine_kwargs": Param({}, type="object", description='e.g. {"max_model_len": 8192} for vLLM'),
    },
    tags=["raybatch", "example", "llm"],
) as dag:
    VLMCaptionOperator(
        task_id="caption",
        input_path="{{ params.data_root }}/images/{{ ds }}/",
        output_path="{{ params.data_root }}/captions/{{ ds }}/",
        image_column="jpg",
        model="{{ params.model or params.data_root ~ '/models/tiny-llava' }}",
        engine="{{ params.engine }}",
        image_size=(225, 225),
        sampling_params="{{ params.sampling_params }}",
        engine_kwargs="{{ params.engine_kwargs }}",
        batch_size="{{ params.batch_size }}",
        concurrency="{{ params.concurrency }}",
        output_column="generated_caption",
        keep_columns=["label"],
        id_column="id",
        rows_per_range=32,
    )
