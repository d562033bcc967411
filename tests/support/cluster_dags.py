"""A one-task DAG that runs on the test Ray cluster (connection ``ray_cluster``).

``python -m tests.support.cluster_dags '<json operator kwargs>'`` runs it with ``dag.test()``
in a process of its own, so that a test can kill the task process.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import DAG

from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

LOGICAL_DATE = datetime(2026, 11, 20, tzinfo=UTC)
CONN_ID = "ray_cluster"


def cluster_dag(dag_id: str, **operator_kwargs: Any) -> DAG:
    with DAG(dag_id, schedule=None, start_date=LOGICAL_DATE) as dag:
        RayBatchInferenceOperator(
            task_id="score",
            ray_conn_id=CONN_ID,
            id_column="id",
            poll_interval=0.5,
            **{"predictor": "tests.support.predictors:score", "num_cpus": 0.5, **operator_kwargs},
        )
    return dag


def mapped_cluster_dag(dag_id: str, shards: int, *, plan_deferrable: bool = False, **operator_kwargs: Any) -> DAG:
    """A mapped run on the test cluster: the planning task ``plan``, then ``score`` mapped over its shards."""
    common = {
        "ray_conn_id": CONN_ID,
        "id_column": "id",
        "poll_interval": 0.5,
        **{"predictor": "tests.support.predictors:score", "num_cpus": 0.5, **operator_kwargs},
    }
    with DAG(dag_id, schedule=None, start_date=LOGICAL_DATE) as dag:
        plan = RayBatchInferenceOperator(task_id="plan", plan_shards=shards, deferrable=plan_deferrable, **common)
        RayBatchInferenceOperator.partial(task_id="score", **common).expand(shard=plan.output)
    return dag


if __name__ == "__main__":
    from tests.conftest import run_dag

    kwargs = json.loads(sys.argv[1])
    run_dag(cluster_dag(kwargs.pop("dag_id"), **kwargs), LOGICAL_DATE)
