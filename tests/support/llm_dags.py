"""The DAG the LLM operator's tests build: companies classified by industry with ``choices``,
each test adding the engine and what it checks."""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG

from airflow_provider_raybatch.examples import llm_data
from airflow_provider_raybatch.operators.llm_batch_inference import LLMBatchInferenceOperator

LOGICAL_DATE = datetime(2026, 11, 21, tzinfo=UTC)


def classify_dag(tmp_path, dag_id: str, **kwargs) -> DAG:
    with DAG(dag_id, schedule=None, start_date=LOGICAL_DATE) as dag:
        LLMBatchInferenceOperator(
            task_id="classify",
            input_path=str(tmp_path / "companies"),
            output_path=str(tmp_path / "out"),
            prompt="What industry is this company in: {Company}",
            choices=llm_data.INDUSTRIES,
            output_column="industry",
            keep_columns=["Company"],
            id_column="id",
            rows_per_range=20,
            retries=2,
            **kwargs,
        )
    return dag
