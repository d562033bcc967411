"""The JSON spec a config travels as to a Ray cluster."""

from __future__ import annotations

import json

import pytest

from airflow_provider_raybatch.pipeline import BatchInferenceConfig, ConfigError, Stage
from tests.predictors import SumModel


def config(*stages: Stage) -> BatchInferenceConfig:
    return BatchInferenceConfig(
        input_path="s3://bucket/in/",
        output_path="s3://bucket/out/",
        stages=list(stages),
        keep_columns=["id"],
        run_key="dag/run/task/-1",
        storage_options={"key": "AKIA", "secret": "s3cr3t"},
    )


def test_a_config_round_trips_through_json_without_its_credentials():
    original = config(
        Stage(SumModel, {"output": "total"}, concurrency=(1, 4), num_gpus=1, resources={"side": 1}),
        Stage("tests.predictors:Scale", {"factor": 2.0}, batch_format="pandas"),
    )
    spec = json.loads(json.dumps(original.to_spec()))
    assert "s3cr3t" not in json.dumps(spec)
    restored = BatchInferenceConfig.from_spec(spec, storage_options={"anon": True})
    assert restored.stages[0].predictor == "tests.predictors:SumModel"
    assert restored.stages[0].concurrency == (1, 4)
    assert restored.job_signature() == original.job_signature()
    assert restored.storage_options == {"anon": True}
    assert restored.to_spec() == spec


def test_what_cannot_travel_is_refused_with_the_stage_named():
    with pytest.raises(ConfigError, match="stage 'lambda'.*cannot be imported by name on a Ray cluster"):
        config(Stage(lambda batch: batch, name="lambda")).to_spec()
    with pytest.raises(ConfigError, match="stage 'Scale': predictor_kwargs must be JSON-serialisable"):
        config(Stage("tests.predictors:Scale", {"factor": object()})).to_spec()
