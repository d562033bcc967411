"""The embedding operator with its common arguments (docs: operators/embedding.md)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

# [START import]
from airflow_provider_raybatch.operators.embedding import EmbeddingOperator

with DAG(
    dag_id="docs_embedding",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    default_args={"retries": 2},
    tags=["raybatch", "docs", "embedding"],
):
    # [START embedding]
    EmbeddingOperator(
        task_id="embed",
        input_path="s3://bucket/documents/{{ ds }}/",
        output_path="s3://bucket/document-vectors",
        output_format="delta",  # or "parquet" (a folder), "iceberg" (with table=...)
        table_partition={"ds": "{{ ds }}"},  # one partition per day; mode="overwrite" replaces it
        text_column="body",
        prefix="passage: ",  # what E5-style models expect before a document ("query: " for a question)
        model="/models/all-MiniLM-L6-v2",  # a sentence-transformers folder: its pooling and length are used
        engine="transformers",
        normalize=True,  # unit vectors: cosine similarity is a dot product
        dtype="float32",  # "float16" halves a Parquet folder's size (Delta and Iceberg have no float16)
        output_column="embedding",  # FixedSizeList<float32>[384] here
        truncated_column="truncated",  # True where the text was cut to the model's length
        engine_kwargs={"num_threads": 4},  # also max_model_len, pooling ("mean" | "cls"), device, dtype
        batch_size=64,
        concurrency=2,
        num_cpus=4,  # also num_gpus=, memory=, accelerator_type=, ray_resources=
        id_column="doc_id",
        keep_columns=["doc_id", "title"],
        ray_conn_id="ray_default",
    )
    # [END embedding]
