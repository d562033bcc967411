"""Nightly embedding refresh: each day's documents into one Delta table of vectors, partitioned by
date, then a check that the day's vectors still find the right neighbours.

``EmbeddingOperator`` embeds the date's documents (``<data_root>/documents/<ds>/``) with
all-MiniLM-L6-v2 on the embedded local Ray and adds them to ``<data_root>/tables/document_embeddings``
as partition ``ds``, exactly once: a retried or killed try resumes from its committed ranges, a rerun
of a finished date commits nothing, and ``mode="overwrite"`` replaces only that date (after a model
change, which ``resume`` refuses). The second task embeds a few probe texts with the same model and
fails the run if their nearest documents of the day are not on the probe's topic: a check to copy
for a search index, where a wrong model, a broken tokenizer or vectors from another model show up
as wrong neighbours long before users notice.

`make demo-llm` prepares the model and yesterday's and today's documents under ``.demo/``; for
another date: ``python -m airflow_provider_raybatch.examples.documents prepare --root <data_root> --date <ds>``.
Needs the ``examples`` and ``llm`` extras.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Asset, Param, task

from airflow_provider_raybatch.examples.demo_input import require_demo_input
from airflow_provider_raybatch.operators.embedding import EmbeddingOperator
from airflow_provider_raybatch.version_compat import AirflowFailException

DEFAULT_ROOT = os.environ.get("RAYBATCH_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo"))
#: Every run's event on this asset carries its summary (rows, table version).
EMBEDDINGS = Asset(name="document_embeddings", uri="x-raybatch://embedding_refresh/document_embeddings")

with DAG(
    dag_id="embedding_refresh",
    description="Embed each day's documents into a Delta table of vectors and check their neighbours",
    doc_md=__doc__,
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    default_args={
        "retries": 2,
        "retry_delay": timedelta(seconds=float(os.environ.get("RAYBATCH_RETRY_DELAY_S", "30"))),
    },
    params={
        "data_root": Param(
            DEFAULT_ROOT,
            type="string",
            pattern=r"^(/|s3://[^/{}]+)[^{}]*$",
            description="Absolute folder or s3:// prefix holding models/, documents/<ds>/ and tables/",
        ),
        "mode": Param(
            "resume",
            type="string",
            enum=["resume", "overwrite"],
            description="resume: add only the rows the date's partition lacks (a rerun of a finished date commits "
            "nothing); overwrite: replace the date's rows in one commit (after changing the model, which resume "
            "refuses); other dates are never touched",
        ),
    },
    tags=["raybatch", "example", "embeddings"],
) as dag:
    # [START embedding_refresh]
    embed = EmbeddingOperator(
        task_id="embed_documents",
        input_path="{{ params.data_root }}/documents/{{ ds }}/",
        output_path="{{ params.data_root }}/tables/document_embeddings",
        output_format="delta",
        table_partition={"ds": "{{ ds }}"},
        mode="{{ params.mode }}",
        model="{{ params.data_root }}/models/all-MiniLM-L6-v2",
        text_column="text",
        normalize=True,  # unit vectors: a dot product is the cosine similarity
        keep_columns=["id", "topic", "text"],
        id_column="id",
        rows_per_range=8,
        asset=EMBEDDINGS,
        pre_execute=require_demo_input("documents", "demo-llm"),
    )
    # [END embedding_refresh]

    # [START neighbours_check]
    @task
    def check_neighbours(data_root: str, ds: str | None = None) -> list[dict]:
        """Each probe's three nearest documents of the day must be on its topic."""
        from airflow_provider_raybatch.examples.documents import nearest_neighbours, read_day

        found = nearest_neighbours(
            read_day(f"{data_root}/tables/document_embeddings", ds), f"{data_root}/models/all-MiniLM-L6-v2"
        )
        wrong = [f"{p['probe']!r} ({p['topic']}): {[n['topic'] for n in p['nearest']]}" for p in found if not p["ok"]]
        if wrong:
            # Not retried: the same vectors would find the same neighbours.
            raise AirflowFailException(f"{ds}: probes whose nearest documents are off topic: {'; '.join(wrong)}")
        return found

    # [END neighbours_check]
    embed >> check_neighbours("{{ params.data_root }}")
