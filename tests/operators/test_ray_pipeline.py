"""How the operator reads its trigger's event: a timeout or an unreachable cluster fails the try."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator
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
