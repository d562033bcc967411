"""Chains of stages: a CPU preprocessing stage before a GPU model (docs: operators/batch_inference.md)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

# [START import]
from airflow_provider_raybatch.pipeline import Stage

with DAG(
    dag_id="docs_chains",
    schedule=None,
    start_date=datetime(2026, 11, 1),
    catchup=False,
    default_args={"retries": 2},
    tags=["raybatch", "docs"],
):
    # [START chain]
    RayBatchInferenceOperator(
        task_id="embed",
        input_path="s3://bucket/docs/{{ ds }}/",
        output_path="s3://bucket/embeddings/{{ ds }}/",
        id_column="id",
        keep_columns=["id"],
        stages=[
            # Each stage gets its own resources and receives what the previous one returned.
            Stage("my_pkg.pre:normalize", {"column": "features"}, num_cpus=1, batch_size=1024),
            Stage(
                "my_pkg.models:Embedder",
                {"model_path": "s3://bucket/models/embedder.npy"},
                num_gpus=1,
                batch_size=64,
                concurrency=2,
            ),
        ],
    )
    # [END chain]

    # [START rejects]
    RayBatchInferenceOperator(
        task_id="score_or_reject",
        input_path="s3://bucket/in/{{ ds }}/",
        output_path="s3://bucket/checked/{{ ds }}/",
        id_column="id",
        predictor="my_pkg.models:score_or_reject",  # a function: fn(batch, **predictor_kwargs)
        predictor_kwargs={"limit": 1000.0},
        max_error_fraction=0.05,  # engine errors among the rows that reached the model
    )
    # [END rejects]
