"""A task on a Ray cluster through the Jobs API, waiting in the triggerer (docs: cluster.md)."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

with DAG(
    dag_id="docs_cluster",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    default_args={"retries": 3, "retry_delay": timedelta(minutes=2)},
    tags=["raybatch", "docs"],
):
    # [START cluster]
    RayBatchInferenceOperator(
        task_id="predict_on_cluster",
        input_path="s3://bucket/in/{{ ds }}/",  # storage every node of the cluster reaches
        output_path="s3://bucket/out/{{ ds }}/",
        predictor="my_pkg.models:Predictor",  # importable on the cluster (its image or runtime_env)
        predictor_kwargs={"model_path": "s3://bucket/models/weights.npy"},
        id_column="id",
        ray_conn_id="ray_default",  # a `ray` connection whose host is the dashboard address
        deferrable=True,  # the wait runs in the triggerer: no worker slot while the job runs
        poll_interval=10.0,
        execution_timeout=timedelta(hours=4),  # the job is stopped and the task times out past it
        concurrency=(1, 8),  # an autoscaling pool of replicas
        num_gpus=1,
        ray_resources={"big_memory_node": 1},  # replicas only on nodes started with this resource
    )
    # [END cluster]
