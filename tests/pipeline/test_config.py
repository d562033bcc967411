"""The JSON spec a config travels as to a Ray cluster."""

from __future__ import annotations

import json

import pytest

from airflow_provider_raybatch.pipeline import BatchInferenceConfig, ConfigError, Stage, TransformStage
from airflow_provider_raybatch.pipeline.config import TableOutput
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from tests.support.predictors import SumModel


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
        Stage("tests.support.predictors:Scale", {"factor": 2.0}, batch_format="pandas"),
    )
    spec = json.loads(json.dumps(original.to_spec()))
    assert "s3cr3t" not in json.dumps(spec)
    restored = BatchInferenceConfig.from_spec(spec, storage_options={"anon": True})
    assert restored.stages[0].predictor == "tests.support.predictors:SumModel"
    assert restored.stages[0].concurrency == (1, 4)
    assert restored.job_signature() == original.job_signature()
    assert restored.storage_options == {"anon": True}
    assert restored.to_spec() == spec


def test_what_cannot_travel_is_refused_with_the_stage_named():
    with pytest.raises(ConfigError, match="stage 'lambda'.*cannot be imported by name on a Ray cluster"):
        config(Stage(lambda batch: batch, name="lambda")).to_spec()
    with pytest.raises(ConfigError, match="stage 'Scale': predictor_kwargs must be JSON-serialisable"):
        config(Stage("tests.support.predictors:Scale", {"factor": object()})).to_spec()


def test_a_transform_stage_round_trips_and_keeps_the_signature_outputs_recorded():
    stage = TransformStage("tests.support.predictors:doubling_transform", {"k": 1}, concurrency=(1, 2), num_cpus=0.5)
    spec = json.loads(json.dumps(config(stage, Stage("tests.support.predictors:Scale", {"factor": 2.0})).to_spec()))
    assert [s["kind"] for s in spec["stages"]] == ["transform", "batch"]
    again = BatchInferenceConfig.from_spec(spec)
    assert isinstance(again.stages[0], TransformStage) and again.stages[0] == stage
    assert type(again.stages[1]) is Stage
    # As an output planned when transform stages were Stage(transform=True) recorded it in plan.json:
    # the same signature, so such an output still resumes.
    assert again.job_signature()["stages"][0] == {
        "predictor": "tests.support.predictors:doubling_transform",
        "predictor_kwargs": {"k": 1},
        "batch_format": "numpy",
        "transform": True,
    }
    assert "transform" not in again.job_signature()["stages"][1]


def test_a_transform_stage_takes_a_factory_not_a_class():
    with pytest.raises(ConfigError, match="stage 'SumModel': a transform stage takes a factory function"):
        TransformStage(SumModel).validate()
    with pytest.raises(TypeError):
        Stage("tests.support.predictors:doubling_transform", transform=True)  # the flag is gone: the type says it


def test_a_table_output_travels_with_its_options_but_without_its_catalog():
    original = config(Stage("tests.support.predictors:Scale", {"factor": 2.0}))
    original.table = TableOutput(
        "iceberg",
        {"ds": "2026-11-24"},
        "daily.score",
        identifier="ml.preds",
        catalog={"type": "sql", "uri": "postgresql://iceberg:s3cr3t@db/catalog"},
        add_columns=True,
    )
    spec = json.loads(json.dumps(original.to_spec()))
    assert "s3cr3t" not in json.dumps(spec)
    # What a Ray Job's driver builds from the spec (pipeline/job.py).
    restored = BatchInferenceConfig.from_spec(spec)
    assert restored.table.add_columns is True and restored.table.catalog == {}
    restored.validate()
    assert BatchInferenceConfig.from_spec({**spec, "table": {**spec["table"], "add_columns": False}}).table == (
        TableOutput("iceberg", {"ds": "2026-11-24"}, "daily.score", identifier="ml.preds")
    )


def test_add_columns_must_be_true_or_false():
    assert TableOutput("delta", {"ds": "2026-11-24"}, "daily.score").add_columns is False
    with pytest.raises(ConfigError, match="add_columns must be True or False, got 'yes'"):
        TableOutput("delta", {"ds": "2026-11-24"}, "daily.score", add_columns="yes").validate()  # type: ignore[arg-type]


def test_a_transform_stage_needs_a_concurrency():
    with pytest.raises(ConfigError, match="a transform stage needs its concurrency"):
        TransformStage(lambda stage: stage, concurrency=None).validate()
    Stage("m:P", concurrency=None).validate()  # a batch stage decides it when the run starts


@pytest.mark.parametrize("timeout", [2, 29.9, 0, float("nan")])
def test_a_lease_timeout_below_the_floor_is_refused_naming_it(tmp_path, timeout):
    """A writer heartbeats every lease_timeout/4: one on an object store cannot keep up with 0.5 s (issue 41)."""
    cfg = BatchInferenceConfig(
        str(tmp_path / "in"), str(tmp_path / "out"), [Stage("tests.support.predictors:score")], lease_timeout=timeout
    )
    with pytest.raises(ConfigError, match=rf"lease_timeout must be a number of seconds >= 30, got {timeout!r}"):
        run_batch_inference(cfg)  # refused before anything is planned, leased or written
    assert not (tmp_path / "out").exists()
    cfg.lease_timeout = 30
    cfg.validate()
