"""How the operator reads its trigger's event: a timeout or an unreachable cluster fails the try."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator
from airflow_provider_raybatch.pipeline import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.job import write_job_result
from airflow_provider_raybatch.pipeline.shards import Shard
from airflow_provider_raybatch.version_compat import AirflowException, AirflowTaskTimeout


def operator() -> RayBatchInferenceOperator:
    return RayBatchInferenceOperator(
        task_id="score", input_path="/data/in", output_path="/data/out", predictor="tests.support.predictors:score"
    )


# The second of each pair is what a trigger of an earlier version fired (its outcome in ``status``):
# a task deferred across an upgrade of the provider resumes the same way.
@pytest.mark.parametrize(
    ("event", "error"),
    [
        ({"outcome": "timeout", "status": None, "message": "deadline; the job was stopped"}, AirflowTaskTimeout),
        ({"status": "TIMEOUT", "message": "deadline; the job was stopped"}, AirflowTaskTimeout),
        ({"outcome": "error", "status": None, "message": "cannot reach the Ray Jobs API"}, AirflowException),
        ({"status": "ERROR", "message": "cannot reach the Ray Jobs API"}, AirflowException),
    ],
)
def test_a_wait_that_did_not_see_the_job_end_fails_the_try_with_its_message(event, error):
    op = operator()
    op.retries = 1
    # A try with a retry left: the next try reattaches to the job (the last try stops it first:
    # tests/operators/test_ray_pipeline_outages.py).
    context = {"ti": SimpleNamespace(try_number=1, max_tries=1)}
    with pytest.raises(error) as raised:
        op.execute_complete(context, {"submission_id": "raybatch-x-0", **event})
    assert type(raised.value) is error and str(raised.value) == event["message"]
    assert op.submission_id == "raybatch-x-0"


class NoRebuild(RayBatchInferenceOperator):
    def build_stages(self, context):
        raise AssertionError("the config was built again after the deferral")


@pytest.mark.parametrize("planning", [False, True])
def test_an_ended_job_s_result_is_read_after_a_deferral_without_building_the_config_again(
    tmp_path, monkeypatch, planning
):
    # A cluster's connection (never reached: the result is in the output), and the result the job left there.
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps({"conn_type": "ray", "host": "http://127.0.0.1:1"}))
    output = str(tmp_path / "out")
    shard = Shard(index=0, count=1, range_ids=["a-0-10"], rows=10)
    left = {"partitions": [shard.to_dict()]} if planning else {"output_path": output, "rows_out": 7}
    OutputLedger.open(output).fs.makedirs(f"{output}/_raybatch/jobs", exist_ok=True)
    write_job_result(BatchInferenceConfig(input_path="-", output_path=output, stages=[]), "raybatch-x-0", left)
    op = NoRebuild(task_id="score", input_path="/data/in", output_path="/elsewhere", predictor="x:y", asset=None)
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="score", map_index=-1, try_number=1, max_tries=0)
    event = {"submission_id": "raybatch-x-0", "outcome": "ended", "status": "SUCCEEDED", "message": ""}
    result = op.execute_complete({"ti": ti}, event, output_path=output, planning=planning, max_rows=None)
    if planning:
        assert result == [shard.to_dict()]
    else:
        assert result["rows_out"] == 7 and result["ray_submission_id"] == "raybatch-x-0"
