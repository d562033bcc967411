"""Inputs and outputs on object stores, with credentials from Airflow connections (docs: connections/object_stores.md)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

with DAG(
    dag_id="docs_object_stores",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    default_args={"retries": 2},
    tags=["raybatch", "docs"],
):
    # [START s3]
    RayBatchInferenceOperator(
        task_id="s3_to_s3",
        input_path="s3://raw-bucket/events/{{ ds }}/",
        output_path="s3://scored-bucket/events/{{ ds }}/",
        predictor="my_pkg.models:Predictor",
        predictor_kwargs={"model_path": "/models/weights.npy"},
        aws_conn_id="aws_default",  # resolved by the Amazon provider's hook: keys, profile, role_arn...
    )
    # [END s3]

    # [START cross]
    RayBatchInferenceOperator(
        task_id="gcs_to_azure",
        input_path="gs://raw-bucket/events/{{ ds }}/",
        output_path="abfs://scored/events/{{ ds }}/",  # container "scored" of the connection's account
        predictor="my_pkg.models:Predictor",
        predictor_kwargs={"model_path": "/models/weights.npy"},
        gcp_conn_id="google_cloud_default",  # the input's store
        azure_conn_id="wasb_default",  # the output's store: each path gets its own store's options
    )
    # [END cross]
