"""Daily batch inference: score each day's Parquet with a torch classifier on Ray.

Paths are templated by the logical date, so a rerun (clear in the UI) or a backfill of a date
reads and writes that date's folders only. With no ``ray_default`` connection the task runs on
an embedded local Ray; `make demo` prepares the model and data under ``.demo/``.

A run needs its date's input, ``<data_root>/input/<ds>/``: `make demo` prepares yesterday's (which
it runs) and today's (the date a trigger from the UI, or the first scheduled run after unpausing,
gets). For another date, prepare it first:
``python -m airflow_provider_raybatch.examples.digits prepare --root <data_root> --date <ds>``.

Runs wait for a slot of the ``raybatch_gpu`` pool (create it: ``airflow pools set raybatch_gpu
2 "Ray batch inference"``; another pool through ``RAYBATCH_POOL``), at most 2 at a time.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Asset, Param

from airflow_provider_raybatch.examples.demo_input import require_demo_input
from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

DEFAULT_ROOT = os.environ.get("RAYBATCH_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo"))
#: Downstream DAGs schedule on this (see digits_accuracy_report.py); each event's extra is the summary.
PREDICTIONS = Asset(name="daily_digits_predictions", uri="x-raybatch://daily_batch_inference/predictions")
#: An absolute local path or an s3:// prefix: a relative path would depend on the worker's folder.
PATH_PATTERN = r"^(/|s3://[^/{}]+)[^{}]*$"

with DAG(
    dag_id="daily_batch_inference",
    description="Score each day's digits with a torch classifier on Ray Data",
    doc_md=__doc__,
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=2,
    # Params reach resources as numbers, not text.
    render_template_as_native_obj=True,
    default_args={
        "retries": 2,
        # Tests shorten the delay (read when the DAG is parsed).
        "retry_delay": timedelta(seconds=float(os.environ.get("RAYBATCH_RETRY_DELAY_S", "30"))),
    },
    params={
        "data_root": Param(
            DEFAULT_ROOT,
            type="string",
            pattern=PATH_PATTERN,
            description="Absolute folder or s3:// prefix holding model/, input/<ds>/ and output/<ds>/",
        ),
        "model_path": Param(
            None,
            type=["null", "string"],
            pattern=PATH_PATTERN,
            description="Model weights (safetensors); empty: <data_root>/model/digits.safetensors",
        ),
        "batch_size": Param(256, type="integer", minimum=1, maximum=65536, description="Rows per model call"),
        "concurrency": Param(
            1, type="integer", minimum=1, maximum=16, description="Model replicas (each takes one CPU)"
        ),
        "num_gpus": Param(
            0, type="number", minimum=0, maximum=8, description="GPUs per replica (0 on a CPU-only cluster)"
        ),
        "row_limit": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            description="Smoke run: score only the first N rows, written to smoke/<ds>-first-N/ "
            "(never into the date's real output)",
        ),
        "mode": Param(
            "resume",
            type="string",
            enum=["resume", "overwrite"],
            description="resume: keep what the date's output already holds and score only the rest (a rerun of a "
            "finished date does nothing); overwrite: delete the date's output and score it all again (after changing "
            "the model or another setting, which resume refuses)",
        ),
    },
    tags=["raybatch", "example"],
) as dag:
    RayBatchInferenceOperator(
        task_id="predict_digits",
        input_path="{{ params.data_root }}/input/{{ ds }}/",
        output_path="{{ params.data_root }}/"
        "{% if params.row_limit %}smoke/{{ ds }}-first-{{ params.row_limit }}{% else %}output/{{ ds }}{% endif %}/",
        max_rows="{{ params.row_limit }}",
        mode="{{ params.mode }}",
        predictor="airflow_provider_raybatch.predictors.torch:TorchPredictor",
        predictor_kwargs={
            "model_class": "airflow_provider_raybatch.examples.digits:DigitsMLP",
            "weights_path": "{{ params.model_path or params.data_root ~ '/model/digits.safetensors' }}",
            "input_column": "features",
            "output_column": "predicted_label",
            "argmax": True,
        },
        batch_size="{{ params.batch_size }}",
        concurrency="{{ params.concurrency }}",
        num_gpus="{{ params.num_gpus }}",
        keep_columns=["id", "label"],
        id_column="id",
        rows_per_range=200,
        asset=PREDICTIONS,
        # GPUs are bounded by an Airflow pool (one slot per task) and by tasks at once per DAG.
        pool=os.environ.get("RAYBATCH_POOL", "raybatch_gpu"),
        max_active_tis_per_dag=2,
        # A date the demo did not prepare fails before Ray starts, naming the command that prepares it.
        pre_execute=require_demo_input("digits", "demo"),
    )
