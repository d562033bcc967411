"""The operator in a real Airflow (`dag.test()`) on a real local Ray."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow.parquet as pq
import pytest
from airflow.sdk import DAG, Param

from airflow_provider_raybatch.hooks.object_stores import storage_options
from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator
from airflow_provider_raybatch.pipeline import Stage
from airflow_provider_raybatch.version_compat import AirflowFailException
from tests.conftest import run_dag
from tests.support.data import assert_exactly_once, assert_output_sound, features_table, read_output, write_input

pytestmark = pytest.mark.usefixtures("ray_local", "airflow_db")
LOGICAL_DATE = datetime(2026, 11, 20, tzinfo=UTC)


def states(dag: DAG) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in run_dag(dag, LOGICAL_DATE).get_task_instances()}


def test_the_guide_s_predictors_run_unchanged(tmp_path):
    """The torch class, a function with fn kwargs, CPU preprocessing then a model, a chain of two models."""
    write_input(tmp_path / "in" / "2026-11-20", [300, 200])
    common = {"input_path": str(tmp_path / "in" / "{{ ds }}"), "id_column": "id", "rows_per_range": 100}
    with DAG("guide_predictors", schedule=None, start_date=LOGICAL_DATE, render_template_as_native_obj=True) as dag:
        RayBatchInferenceOperator(
            task_id="torch",
            predictor="tests.support.predictors:TorchPredictor",
            keep_columns=[],
            output_path=str(tmp_path / "torch" / "{{ ds }}"),
            **common,
        )
        RayBatchInferenceOperator(
            task_id="function",
            predictor="tests.support.predictors:add_bias",
            predictor_kwargs={"bias": 10.0},
            output_path=str(tmp_path / "function"),
            keep_columns=["group"],
            **common,
        )
        RayBatchInferenceOperator(
            task_id="preprocess_then_model",
            stages=[
                Stage("tests.support.predictors:normalize", num_cpus=0.25),
                Stage("tests.support.predictors:SumModel", {"output": "total"}, num_cpus=0.25, num_gpus=0),
            ],
            output_path=str(tmp_path / "pre"),
            keep_columns=[],
            **common,
        )
        RayBatchInferenceOperator(
            task_id="chain",
            stages=[
                Stage("tests.support.predictors:SumModel", {"output": "total"}, num_cpus=0.5),
                Stage("tests.support.predictors:Scale", {"factor": "{{ params.factor }}"}, num_cpus=0.5),
            ],
            params={"factor": 2},
            output_path=str(tmp_path / "chain"),
            keep_columns=[],
            **common,
        )
    assert set(states(dag).values()) == {"success"}

    features = np.concatenate(
        [
            features_table(300, 0)["features"].combine_chunks().flatten().to_numpy(),
            features_table(200, 300)["features"].combine_chunks().flatten().to_numpy(),
        ]
    ).reshape(-1, 8)
    torch_out = read_output(tmp_path / "torch" / "2026-11-20").sort_by("id")
    assert torch_out.column_names == ["id", "output"] and torch_out.num_rows == 500
    assert np.asarray(torch_out["output"].to_pylist()).shape == (500, 2)

    fn_out = read_output(tmp_path / "function").sort_by("id")
    assert np.allclose(fn_out["biased"].to_numpy(), features.sum(axis=1) + 10.0, rtol=1e-5)
    assert fn_out["group"].to_pylist()[:3] == ["g0", "g1", "g2"]
    # The function returned its whole batch: its columns are written as returned.
    assert set(fn_out.column_names) == {"id", "group", "features", "biased"}

    pre_out = read_output(tmp_path / "pre").sort_by("id")
    assert np.allclose(pre_out["total"].to_numpy(), 0.0, atol=1e-4)  # normalised rows sum to zero

    chain_out = read_output(tmp_path / "chain").sort_by("id")
    assert chain_out.column_names == ["id", "scaled"]  # the templated factor reached the second model
    assert np.allclose(chain_out["scaled"].to_numpy(), features.sum(axis=1) * 2, rtol=1e-5)


def test_summary_goes_to_xcom_and_a_retry_of_a_finished_task_is_a_no_op(tmp_path):
    write_input(tmp_path / "in", [250])
    with DAG("summary_xcom", schedule=None, start_date=LOGICAL_DATE) as dag:
        RayBatchInferenceOperator(
            task_id="score",
            predictor="tests.support.predictors:score",
            input_path=str(tmp_path / "in"),
            output_path=str(tmp_path / "out"),
            id_column="id",
            rows_per_range=100,
        )
    run = run_dag(dag, LOGICAL_DATE)
    summary = run.get_task_instance("score").xcom_pull(task_ids="score")
    assert summary["rows_out"] == 250 and summary["ranges_done"] == 3
    assert summary["output_path"] == str(tmp_path / "out")
    json.dumps(summary)
    rerun = run_dag(dag, datetime(2026, 11, 21, tzinfo=UTC))
    again = rerun.get_task_instance("score").xcom_pull(task_ids="score")
    assert again["ranges_skipped"] == 3 and again["rows_processed"] == 0
    assert_exactly_once(read_output(tmp_path / "out"), range(250))


def test_bad_settings_fail_the_task_without_retries(tmp_path):
    write_input(tmp_path / "in", [10])
    operator = RayBatchInferenceOperator(
        task_id="bad",
        predictor="tests.support.predictors:score",
        input_path=str(tmp_path / "in"),
        output_path=str(tmp_path / "in" / "out"),
        retries=3,
    )
    context = {
        "ti": type("TI", (), {"dag_id": "d", "run_id": "r", "task_id": "bad", "map_index": -1, "try_number": 1})()
    }
    with pytest.raises(AirflowFailException, match="overlaps input path"):
        operator.execute(context)


def test_predictor_and_stages_are_exclusive():
    with pytest.raises(ValueError, match="exactly one of predictor or stages"):
        RayBatchInferenceOperator(task_id="x", input_path="a", output_path="b")
    with pytest.raises(ValueError, match="exactly one of predictor or stages"):
        RayBatchInferenceOperator(task_id="y", input_path="a", output_path="b", predictor="m:f", stages=[Stage("m:f")])


def test_s3_credentials_come_from_an_airflow_aws_connection(tmp_path, s3_server, monkeypatch):
    client = s3_server["client_kwargs"]
    conn = {
        "conn_type": "aws",
        "login": "testing",
        "password": "testing",
        "extra": {"endpoint_url": client["endpoint_url"], "region_name": client["region_name"]},
    }
    monkeypatch.setenv("AIRFLOW_CONN_S3_TEST", json.dumps(conn))
    # Resolved by the Amazon provider's hook; keyed by store, so that each path gets its own.
    assert storage_options(aws_conn_id="s3_test") == {"s3": {**s3_server}}

    import s3fs

    fs = s3fs.S3FileSystem(**s3_server)
    with fs.open("raybatch-test/op-in/2026-11-20/data.parquet", "wb") as f:
        pq.write_table(features_table(120), f, row_group_size=60)
    with DAG("s3_operator", schedule=None, start_date=LOGICAL_DATE) as dag:
        RayBatchInferenceOperator(
            task_id="score",
            predictor="tests.support.predictors:score",
            aws_conn_id="s3_test",
            input_path="s3://raybatch-test/op-in/{{ ds }}/",
            output_path="s3://raybatch-test/op-out/{{ ds }}/",
            id_column="id",
            rows_per_range=60,
        )
    run = run_dag(dag, LOGICAL_DATE)
    summary = run.get_task_instance("score").xcom_pull(task_ids="score")
    fs.invalidate_cache()
    assert_exactly_once(pq.read_table("raybatch-test/op-out/2026-11-20", filesystem=fs), range(120))
    # The secret reaches fsspec only: not the summary (XCom), not the output's bookkeeping.
    assert summary["rows_out"] == 120 and "testing" not in json.dumps(summary)
    assert b"testing" not in fs.cat("raybatch-test/op-out/2026-11-20/_raybatch/plan.json")


def test_max_error_fraction_bounds_the_rows_a_predictor_rejects(tmp_path, capfd):
    write_input(tmp_path / "in", [300])
    # 4 engine errors among 300 rows: within 2 %, past the default 1 % of a second output.
    errors = {"error_ids": [11, 151, 152, 291]}
    with DAG("reject_fraction", schedule=None, start_date=LOGICAL_DATE) as dag:
        for task_id, fraction in (("tolerant", {"max_error_fraction": "{{ params.fraction }}"}), ("strict", {})):
            RayBatchInferenceOperator(
                task_id=task_id,
                predictor="tests.support.predictors:RejectSome",
                predictor_kwargs=errors,
                input_path=str(tmp_path / "in"),
                output_path=str(tmp_path / task_id),
                id_column="id",
                rows_per_range=100,
                num_cpus=0.5,
                retries=2,
                params={"fraction": 0.02},
                **fraction,
            )
    run = run_dag(dag, LOGICAL_DATE)
    tolerant, strict = run.get_task_instance("tolerant"), run.get_task_instance("strict")
    assert tolerant.state == "success" and tolerant.xcom_pull(task_ids="tolerant")["engine_errors"] == 4
    assert strict.state == "failed" and strict.try_number == 1  # not retried: the errors are committed
    assert "4 of 300 rows that reached a model failed (1.3%), more than max_error_fraction=0.01" in "".join(
        capfd.readouterr()
    )
    assert sorted(pq.read_table(str(tmp_path / "strict" / "_rejects"))["id"].to_pylist()) == [11, 151, 152, 291]


def test_params_rendered_as_text_are_read_as_their_values_and_a_null_fraction_fails_without_retry(tmp_path, capfd):
    """As a run triggered from the UI renders them: each Param into a templated field, as text."""
    write_input(tmp_path / "in", [300])
    params = {
        "limit": Param(100, type=["null", "integer"]),
        "tolerance": Param(0.05, type=["null", "number"]),
        "timeout": Param(None, type=["null", "number"]),
        "columns": Param(None, type=["null", "array"]),
        "max_error_fraction": Param(None, type=["null", "number"]),
    }
    common = {
        "predictor": "tests.support.predictors:score",
        "input_path": str(tmp_path / "in"),
        "id_column": "id",
        "rows_per_range": 100,
        # A retry would come at once: a retried task would end with try_number > 1.
        "retries": 2,
        "retry_delay": timedelta(0),
    }
    with DAG("rendered_params", schedule=None, start_date=LOGICAL_DATE, params=params) as dag:
        RayBatchInferenceOperator(
            task_id="rendered",
            output_path=str(tmp_path / "rendered"),
            max_rows="{{ params.limit }}",  # "100"
            max_error_fraction="{{ params.tolerance }}",  # "0.05"
            progress_timeout="{{ params.timeout }}",  # "None": no limit
            columns="{{ params.columns }}",  # "None": every column
            **common,
        )
        RayBatchInferenceOperator(
            task_id="null_fraction",
            output_path=str(tmp_path / "null_fraction"),
            max_error_fraction="{{ params.max_error_fraction }}",  # "None"
            **common,
        )
    run = run_dag(dag, LOGICAL_DATE)
    rendered, null_fraction = run.get_task_instance("rendered"), run.get_task_instance("null_fraction")
    assert (null_fraction.state, null_fraction.try_number) == ("failed", 1)  # not retried
    logs = "".join(capfd.readouterr())
    assert "AirflowFailException: max_error_fraction must be a number between 0 and 1, got 'None'" in logs
    assert not (tmp_path / "null_fraction").exists()  # refused before anything was written
    assert rendered.state == "success", rendered.state
    assert rendered.xcom_pull(task_ids="rendered")["rows_out"] == 100


def test_progress_timeout_reaches_the_config_in_seconds_and_none_disables_it(tmp_path):
    context = {"ti": type("TI", (), {"dag_id": "d", "run_id": "r", "task_id": "t", "map_index": -1, "try_number": 1})()}
    paths = {"input_path": str(tmp_path / "in"), "output_path": str(tmp_path / "out")}
    default = RayBatchInferenceOperator(task_id="default", predictor="tests.support.predictors:score", **paths)
    assert default.build_config(context).progress_timeout == 3600
    for given, seconds in ((timedelta(minutes=5), 300), (90, 90), ("12.5", 12.5), (None, None), ("None", None)):
        operator = RayBatchInferenceOperator(
            task_id="t", predictor="tests.support.predictors:score", progress_timeout=given, **paths
        )
        assert operator.build_config(context).progress_timeout == seconds, given
    assert "progress_timeout" in RayBatchInferenceOperator.template_fields


def test_a_hung_predictor_fails_the_try_after_progress_timeout_and_the_retry_resumes(tmp_path, capfd):
    write_input(tmp_path / "in", [500])
    marker = tmp_path / "hang-marker"
    marker.touch()
    common = {
        "predictor": "tests.support.stall_predictors:HangOnce",
        "input_path": str(tmp_path / "in"),
        "id_column": "id",
        "rows_per_range": 100,
        "batch_size": 100,
    }
    with DAG("stalled_predictor", schedule=None, start_date=LOGICAL_DATE) as dag:
        # No limit, and a warm local Ray for the next task: the watchdog counts the stage's start-up.
        warm = RayBatchInferenceOperator(
            task_id="warm",
            predictor_kwargs={"marker": str(tmp_path / "no-marker"), "hang_id": -1},
            output_path=str(tmp_path / "warm"),
            progress_timeout=None,
            **common,
        )
        hangs = RayBatchInferenceOperator(
            task_id="hangs",
            predictor_kwargs={"marker": str(marker), "hang_id": 250},
            output_path=str(tmp_path / "out"),
            progress_timeout=timedelta(seconds=15),
            retries=1,
            retry_delay=timedelta(0),
            **common,
        )
        warm >> hangs
    run = run_dag(dag, LOGICAL_DATE)
    ti = run.get_task_instance("hangs")
    assert run.get_task_instance("warm").state == "success"
    assert ti.state == "success" and ti.try_number == 2  # the first try stalled and was retried
    logs = "".join(capfd.readouterr())
    assert re.search(
        r"NoProgressError: no range committed and no batch received for \d+s \(progress_timeout=15s\)", logs
    )
    # Its replicas also read the input: "reading the input and stage 'HangOnce' (Ray Data's ...): ..."
    assert re.search(r"stage 'HangOnce'[^:]*: \d+ task\(s\) in flight", logs)
    assert_output_sound(tmp_path / "out", range(500))
