"""Daily batch inference: score each day's Parquet with a torch classifier on Ray.

Paths are templated by the logical date, so a rerun (clear in the UI) or a backfill of a date
reads and writes that date's folders only. With no ``ray_default`` connection the task runs on
an embedded local Ray; `make demo` prepares the model and data under ``.demo/``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

DEFAULT_ROOT = os.environ.get("RAYBATCH_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo"))

with DAG(
    dag_id="daily_batch_inference",
    description="Score each day's digits with a torch classifier on Ray Data",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=2,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    params={
        "data_root": Param(
            DEFAULT_ROOT,
            type="string",
            minLength=1,
            description="Folder (or s3:// prefix) holding model/, input/<ds>/ and output/<ds>/",
        ),
    },
    tags=["raybatch", "example"],
) as dag:
    RayBatchInferenceOperator(
        task_id="predict_digits",
        input_path="{{ params.data_root }}/input/{{ ds }}/",
        output_path="{{ params.data_root }}/output/{{ ds }}/",
        predictor="airflow_provider_raybatch.predictors.torch:TorchPredictor",
        predictor_kwargs={
            "model_class": "airflow_provider_raybatch.examples.digits:DigitsMLP",
            "weights_path": "{{ params.data_root }}/model/digits.safetensors",
            "input_column": "features",
            "output_column": "predicted_label",
            "argmax": True,
        },
        batch_size=256,
        keep_columns=["id", "label"],
        id_column="id",
        rows_per_range=200,
    )
