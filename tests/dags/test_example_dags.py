"""The example DAGs: they load cleanly, and the daily one really predicts on the embedded Ray."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime

import pytest

from airflow_provider_raybatch.examples import digits
from tests.conftest import REPO, run_dag


def test_all_dags_load_without_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert "daily_batch_inference" in bag.dags
    dag = bag.dags["daily_batch_inference"]
    assert dag.default_args["retries"] >= 1


@pytest.mark.usefixtures("ray_local", "airflow_db")
def test_daily_dag_scores_the_day_s_digits_with_the_demo_model(tmp_path):
    digits.train(tmp_path / "model" / "digits.safetensors", epochs=150)
    rows = digits.write_input(tmp_path / "input" / "2026-11-21")
    spec = importlib.util.spec_from_file_location("daily_dag", REPO / "dags" / "daily_batch_inference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = run_dag(module.dag, datetime(2026, 11, 21, tzinfo=UTC), conf={"data_root": str(tmp_path)})
    summary = run.get_task_instance("predict_digits").xcom_pull(task_ids="predict_digits")
    assert summary["rows_out"] == rows
    scored, accuracy = digits.accuracy(str(tmp_path / "output" / "2026-11-21"))
    assert scored == rows and accuracy > 0.85  # held-out digits: a real model, really predicting
