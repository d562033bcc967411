"""Daily image captioning with a vision-language model on Ray (Ray's multimodal batch inference guide).

Each day's images (a Parquet folder with an ``id`` and the encoded image in ``jpg``) are
captioned; corrupt images go to ``captions/<ds>/_rejects/`` with the reason. The defaults run on
the embedded local Ray with the ``transformers`` engine and the tiny random Llava that
`make demo-llm` builds under ``.demo/models/`` (its captions are noise: it shows the plumbing).
On a GPU cluster: set ``engine`` to ``vllm`` and ``model`` to e.g. ``Qwen/Qwen2.5-VL-3B-Instruct``
(and a ``ray_default`` connection); or ``openai`` with an ``openai_default`` connection.

A run needs its date's images, ``<data_root>/images/<ds>/``: `make demo-llm` prepares yesterday's
and today's. For another date:
``python -m airflow_provider_raybatch.examples.llm_data prepare --root <data_root> --date <ds>``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Asset, Param

from airflow_provider_raybatch.examples.demo_input import require_demo_input
from airflow_provider_raybatch.operators.vlm_caption import VLMCaptionOperator

DEFAULT_ROOT = os.environ.get("RAYBATCH_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo"))
#: Each event's extra is the run's summary, with the rendered output path of the day's captions.
CAPTIONS = Asset(name="daily_image_captions", uri="x-raybatch://vlm_caption/captions")
#: An absolute local path or an s3:// prefix: a relative path would depend on the worker's folder.
PATH_PATTERN = r"^(/|s3://[^/{}]+)[^{}]*$"

with DAG(
    dag_id="vlm_caption",
    description="Caption each day's images with a VLM on Ray Data",
    doc_md=__doc__,
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args={
        "retries": 2,
        # Tests shorten the delay (read when the DAG is parsed).
        "retry_delay": timedelta(seconds=float(os.environ.get("RAYBATCH_RETRY_DELAY_S", "30"))),
    },
    render_template_as_native_obj=True,  # numbers and dicts from params stay numbers and dicts
    params={
        "data_root": Param(
            DEFAULT_ROOT,
            type="string",
            pattern=PATH_PATTERN,
            description="Absolute folder or s3:// prefix holding images/<ds>/, captions/<ds>/ and models/",
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
            description="Model id (e.g. Qwen/Qwen2.5-VL-3B-Instruct) or folder; empty: the demo's tiny Llava "
            "under <data_root>/models/",
        ),
        "batch_size": Param(16, type="integer", minimum=1, maximum=4096, description="Images per engine call"),
        "concurrency": Param(1, type="integer", minimum=1, maximum=16, description="Engine replicas"),
        "sampling_params": Param(
            {"temperature": 0.3, "max_tokens": 16},
            type="object",
            description="Generation settings passed to the engine, e.g. temperature and max_tokens",
        ),
        "engine_kwargs": Param({}, type="object", description='Engine settings, e.g. {"max_model_len": 8192} for vLLM'),
        "mode": Param(
            "resume",
            type="string",
            enum=["resume", "overwrite"],
            description="resume: keep what the date's output already holds and answer only the rest (a rerun "
            "of a finished date does nothing); overwrite: delete the date's output and answer it all again (after "
            "changing the model, the prompt or another setting, which resume refuses)",
        ),
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
        mode="{{ params.mode }}",
        asset=CAPTIONS,
        # A date the demo did not prepare fails before Ray starts, naming the command that prepares it.
        pre_execute=require_demo_input("llm_data", "demo-llm"),
    )
