"""LLMBatchInferenceOperator with ``engine="vllm"`` on vLLM's CPU build (``make test-vllm``), in a
real Airflow (``dag.test()``): on the embedded local Ray, and as a Ray Job on a ``ray start --head``
cluster whose Ray has vLLM beside it."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from airflow.sdk import DAG

from airflow_provider_raybatch.examples import llm_data
from tests.conftest import run_dag
from tests.support.cluster_dags import CONN_ID
from tests.support.data import assert_output_sound
from tests.support.example_dags import load_dag
from tests.support.llm_dags import LOGICAL_DATE, classify_dag
from tests.support.ray_cluster import connection

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("airflow_db")]
ROWS = 40
ENGINE_KWARGS = {"max_model_len": 256, "enforce_eager": True, "dtype": "float32"}


def vllm_dag(tmp_path, model, dag_id: str, **kwargs) -> DAG:
    """The classify DAG on vLLM's CPU backend, with the throughput knobs and per-row tokens."""
    return classify_dag(
        tmp_path,
        dag_id,
        engine="vllm",
        model=str(model),
        num_gpus=0,
        engine_kwargs=ENGINE_KWARGS,
        batch_size=8,
        max_concurrent_batches=2,
        token_columns=True,
        **kwargs,
    )


def check_output(tmp_path, summary: dict) -> None:
    assert summary["rows_out"] == ROWS and summary["engine_errors"] == 0
    out = pq.read_table(tmp_path / "out")
    assert summary["tokens_in"] == sum(out["num_input_tokens"].to_pylist()) > 0
    assert summary["tokens_out"] == sum(out["num_generated_tokens"].to_pylist()) > 0
    assert set(out["industry"].to_pylist()) <= set(llm_data.INDUSTRIES) and out["industry"].null_count == 0
    assert_output_sound(tmp_path / "out", range(ROWS))


@pytest.mark.usefixtures("ray_local")
def test_the_example_dag_runs_vllm_on_cpus_on_the_embedded_ray(tmp_path, tiny_models, capfd):
    """dags/llm_classify.py as a user triggers it with vLLM's CPU backend: engine, num_gpus and engine_kwargs."""
    llm_data.write_companies(tmp_path / "companies", ROWS)
    conf = {
        "data_root": str(tmp_path),
        "model": str(tiny_models["qwen2"]),
        "engine": "vllm",
        "num_gpus": 0,
        "batch_size": 8,
        "engine_kwargs": ENGINE_KWARGS,
    }
    run = run_dag(load_dag("llm_classify"), LOGICAL_DATE, conf=conf)
    ti = run.get_task_instance("classify")
    assert ti.state == "success"
    summary = ti.xcom_pull(task_ids="classify")
    assert summary["rows_out"] == ROWS and summary["engine_errors"] == 0
    assert summary["tokens_in"] > 0 and summary["tokens_out"] >= ROWS  # each answer at least its end token
    out = pq.read_table(tmp_path / "industries")
    assert set(out["industry"].to_pylist()) <= set(llm_data.INDUSTRIES) and out["industry"].null_count == 0
    assert_output_sound(tmp_path / "industries", range(ROWS))
    assert "vLLMEngineStageUDF" in "".join(capfd.readouterr())


def test_the_operator_runs_vllm_in_a_ray_job_on_a_cluster(tmp_path, tiny_models, ray_cluster, monkeypatch, capfd):
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection(ray_cluster))
    llm_data.write_companies(tmp_path / "companies", ROWS)
    dag = vllm_dag(tmp_path, tiny_models["qwen2"], "vllm_on_cluster", ray_conn_id=CONN_ID, poll_interval=0.5)
    ti = run_dag(dag, LOGICAL_DATE).get_task_instance("classify")
    assert ti.state == "success"
    summary = ti.xcom_pull(task_ids="classify")
    assert summary["ray_submission_id"]
    check_output(tmp_path, summary)
    job_log = [line for line in "".join(capfd.readouterr()).splitlines() if "[ray job]" in line]
    assert any("vLLMEngineStageUDF" in line for line in job_log)  # the job's log, streamed to the task's
