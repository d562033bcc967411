"""Rejected rows: written beside the output, committed with it, counted, never seen by later stages."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline import (
    BatchInferenceConfig,
    Stage,
    StageError,
    TooManyErrorsError,
    TransformStage,
)
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.execution.range_commits import RECORD_INTERVAL_ENV
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from tests.support.data import write_input
from tests.support.pipeline_runs import commit_count

pytestmark = pytest.mark.usefixtures("ray_local")


def reject_config(tmp_path, reject_kwargs, then=None, **kwargs) -> BatchInferenceConfig:
    stages = [Stage("tests.support.predictors:RejectSome", reject_kwargs, num_cpus=0.5, batch_size=64)]
    if then is not None:
        stages.append(then)
    kwargs = {"output_path": str(tmp_path / "out"), "id_column": "id", "rows_per_range": 100, **kwargs}
    return BatchInferenceConfig(str(tmp_path / "in"), stages=stages, **kwargs)


def read_rejects(out):
    return pq.read_table(str(out / "_rejects"))


def assert_once_across(out, expected):
    ids = pq.read_table(str(out))["id"].to_pylist() + read_rejects(out)["id"].to_pylist()
    assert sorted(ids) == list(expected), "every id exactly once across output and rejects"


def test_rejected_rows_go_to_rejects_with_reason_and_skip_later_stages(tmp_path):
    write_input(tmp_path / "in", [250, 130])
    then = Stage("tests.support.predictors:Scale", {"factor": 2.0, "column": "score"}, num_cpus=0.5, batch_size=50)
    cfg = reject_config(tmp_path, {"invalid_every": 7, "error_ids": [3, 200]}, then=then, keep_columns=["group"])
    summary = run_batch_inference(cfg)
    out = tmp_path / "out"
    accepted = pq.read_table(str(out))
    assert accepted.column_names == ["id", "group", "scaled"]  # the second stage ran on accepted rows only
    assert accepted["scaled"].null_count == 0
    rejects = read_rejects(out).sort_by("id")
    assert rejects.column_names == ["id", "group", "reason", "kind"]
    invalid = [i for i in range(380) if i % 7 == 0]
    assert rejects["id"].to_pylist() == sorted(invalid + [3, 200])
    by_id = {r["id"]: r for r in rejects.to_pylist()}
    assert by_id[7] == {"id": 7, "group": "g1", "reason": "id 7 is invalid", "kind": "invalid_input"}
    assert by_id[200]["kind"] == "engine_error" and by_id[200]["reason"] == "model failed on id 200"
    assert_once_across(out, range(380))
    assert summary.rows_out == 380 - len(invalid) - 2 and summary.rows_rejected == len(invalid) + 2
    assert summary.engine_errors == 2 and summary.rows_processed == 380
    # Each commit record names both files of its range.
    record = OutputLedger.open(str(out)).committed()[accepted_range_id(out)]
    assert sorted(record.files) == [
        f"_rejects/part-{record.range_id}.parquet",
        f"part-{record.range_id}.parquet",
    ]
    assert run_batch_inference(cfg).rows_rejected == len(invalid) + 2  # a rerun counts the committed rejects


def accepted_range_id(out) -> str:
    return sorted(p.name for p in (out / "_rejects").glob("part-*.parquet"))[0][len("part-") : -len(".parquet")]


def test_too_many_engine_errors_fail_the_run_and_its_reruns(tmp_path):
    write_input(tmp_path / "in", [300])
    # 3 errors among 300 rows that reached the model: 1 % is allowed, 0.5 % is not.
    errors = {"error_ids": [11, 151, 291], "invalid_every": 50}
    assert run_batch_inference(reject_config(tmp_path, errors, max_error_fraction=0.011)).engine_errors == 3
    with pytest.raises(
        TooManyErrorsError, match=r"3 of 294 rows that reached a model failed .*max_error_fraction=0.005"
    ):
        run_batch_inference(reject_config(tmp_path, errors, max_error_fraction=0.005))
    # Invalid inputs alone never trip it.
    run_batch_inference(
        reject_config(tmp_path, {"invalid_every": 2}, output_path=str(tmp_path / "out2"), max_error_fraction=0)
    )


def test_too_many_engine_errors_stop_the_run_early(tmp_path, monkeypatch):
    # The errors are counted as ranges are recorded: one at a time here, not in batches of a
    # second's ranges (the whole of this small input can arrive within one).
    monkeypatch.setenv(RECORD_INTERVAL_ENV, "0")
    write_input(tmp_path / "in", [1000])
    every = {"error_ids": list(range(0, 1000, 2))}
    with pytest.raises(TooManyErrorsError):
        run_batch_inference(reject_config(tmp_path, every, max_error_fraction=0.1))
    assert commit_count(tmp_path / "out") < 10


def test_a_transform_stage_keeps_internal_columns_and_skips_rejects(tmp_path):
    write_input(tmp_path / "in", [200])
    then = TransformStage("tests.support.predictors:doubling_transform", batch_size=50, num_cpus=0.5)
    summary = run_batch_inference(reject_config(tmp_path, {"invalid_every": 10}, then=then, keep_columns=["group"]))
    out = pq.read_table(str(tmp_path / "out")).sort_by("id")
    assert set(out.column_names) == {"id", "group", "score", "doubled"}
    assert out.num_rows == 180 and summary.rows_rejected == 20
    assert out["doubled"].to_pylist() == [2 * s for s in out["score"].to_pylist()]
    assert_once_across(tmp_path / "out", range(200))


def test_a_transform_that_drops_internal_columns_is_named(tmp_path):
    write_input(tmp_path / "in", [100])
    then = TransformStage("tests.support.predictors:dropping_transform", num_cpus=0)
    # Raised where the rows are written, in a Ray task: the driver raises it unwrapped from Ray's task error.
    with pytest.raises(StageError, match="^a transform stage dropped the internal columns"):
        run_batch_inference(reject_config(tmp_path, {}, then=then))


def test_stages_round_trip_through_the_json_spec():
    cfg = BatchInferenceConfig(
        "in",
        "out",
        [
            Stage("tests.support.predictors:RejectSome", {"invalid_every": 3}, input_columns=["id"]),
            TransformStage("tests.support.predictors:doubling_transform", concurrency=(1, 2)),
        ],
        max_error_fraction=0.05,
    )
    spec = json.loads(json.dumps(cfg.to_spec()))
    again = BatchInferenceConfig.from_spec(spec)
    assert again == cfg and isinstance(again.stages[1], TransformStage) and again.max_error_fraction == 0.05
    assert again.job_signature() == cfg.job_signature()
