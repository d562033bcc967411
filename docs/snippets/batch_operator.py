"""RayBatchInferenceOperator: the short form and every argument (docs: operators/batch_inference.md, README).

A DAG file: tests/test_docs.py parses it as the DAG processor would. The predictors it names
are in my_pkg/ beside it (put my_pkg on the workers' sys.path, or install it, to run it).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

# [START import]
from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

with DAG(
    dag_id="docs_batch_operator",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    tags=["raybatch", "docs"],
):
    # [START short]
    RayBatchInferenceOperator(
        task_id="predict",
        input_path="s3://bucket/in/{{ ds }}/",
        output_path="s3://bucket/out/{{ ds }}/",
        predictor="my_pkg.models:Predictor",
        predictor_kwargs={"model_path": "s3://bucket/models/weights.npy"},
        id_column="id",
        keep_columns=["id"],
    )
    # [END short]

    # [START full]
    RayBatchInferenceOperator(
        task_id="predict_all_arguments",
        input_path="s3://bucket/in/{{ ds }}/",  # a file, a folder or a glob; local, s3://, gs://, abfs://
        output_path="s3://bucket/out-all/{{ ds }}/",
        predictor="my_pkg.models:Predictor",  # import path, or the class / function itself
        # kwargs of the class's constructor, or extra kwargs of a function:
        predictor_kwargs={"model_path": "s3://bucket/models/weights.npy"},
        batch_size=256,
        concurrency=1,  # replicas, or (min, max)
        num_cpus=1,  # per replica
        num_gpus=0,  # per replica, as num_cpus (fractions allowed)
        memory=None,  # bytes per replica
        accelerator_type=None,  # e.g. "A10G"
        ray_resources=None,  # custom Ray resources per replica, e.g. {"big_memory_node": 1}
        batch_format="numpy",  # or "pandas", "pyarrow"
        columns=None,  # input columns to read (None: all)
        keep_columns=["id"],  # input columns copied to the output (None: all read)
        id_column="id",  # None: a `_row_id` derived from (file, row) is written
        rows_per_range=100_000,  # checkpoint granularity
        mode="resume",  # or "overwrite"
        output_format="parquet",  # or "delta", "iceberg": output_path is then the table's root / location
        table=None,  # an Iceberg table, "namespace.table"
        table_partition=None,  # a table's partition this task writes; default {"ds": "{{ ds }}"}
        iceberg_conn_id="iceberg_default",  # the Iceberg catalog; no such connection: SQLite under $AIRFLOW_HOME
        table_commit_interval=60,  # seconds between a table's commits while a run appends
        table_add_columns=False,  # True: add the output's columns that an existing table lacks
        max_rows=None,  # a smoke run: only the input's first N rows (give it its own output path)
        ray_conn_id="ray_default",  # no such connection: local Ray; else a Ray Job on the cluster
        deferrable=False,  # on a cluster: wait in the triggerer instead of a worker slot
        poll_interval=5.0,  # seconds between job status checks on a cluster
        aws_conn_id=None,  # an Airflow AWS connection for s3:// (None: the environment's credentials)
        gcp_conn_id=None,  # a google_cloud_platform connection for gs://
        azure_conn_id=None,  # an Azure Blob Storage (wasb) connection for abfs:// and az://
        max_error_fraction=0.01,  # rows a predictor rejects as engine errors, at most this share
        lease_timeout=120,  # seconds without a heartbeat before another writer may take the output over
        progress_timeout=3600,  # seconds (or a timedelta) without a commit or a batch: the try fails, retryably
        asset=None,  # default: an Asset derived from output_path's static part (s3://bucket/out-all); None: none
        execution_timeout=timedelta(hours=6),  # Airflow's own: bounds the whole try
    )
    # [END full]
