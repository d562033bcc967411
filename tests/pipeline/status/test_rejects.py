"""An output's rejects as the status reads them: counts from the records, rows from the committed files."""

from __future__ import annotations

import pytest

from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.status import OutputNotFoundError, read_rejects, read_status
from tests.support.data import write_input
from tests.support.pipeline_runs import config

pytestmark = pytest.mark.usefixtures("ray_local")


def test_rejects_are_counted_by_kind_and_read_in_range_order_up_to_the_limit(tmp_path):
    write_input(tmp_path / "in", [250])
    cfg = config(
        tmp_path,
        predictor="tests.support.predictors:RejectSome",
        predictor_kwargs={"invalid_every": 9, "error_ids": [5, 130]},
    )
    summary = run_batch_inference(cfg)
    invalid = [i for i in range(250) if i % 9 == 0]

    status = read_status(cfg.output_path)
    assert (status.rows_rejected, status.engine_errors) == (summary.rows_rejected, summary.engine_errors)
    assert status.rows_rejected == len(invalid) + 2 and status.rows_done == 250

    sample = read_rejects(cfg.output_path, limit=4)
    assert (sample.rejected, sample.engine_errors) == (len(invalid) + 2, 2)
    assert sample.rows.num_rows == 4 and {"reason", "kind"} <= set(sample.rows.column_names)
    assert sorted(sample.rows["id"].to_pylist()) == [0, 5, 9, 18]  # the first range's, in its file's order
    by_id = {row["id"]: row for row in sample.rows.to_pylist()}
    assert (by_id[5]["reason"], by_id[5]["kind"]) == ("model failed on id 5", "engine_error")
    assert (by_id[9]["reason"], by_id[9]["kind"]) == ("id 9 is invalid", "invalid_input")
    everything = read_rejects(cfg.output_path, limit=None)
    assert sorted(everything.rows["id"].to_pylist()) == sorted(invalid + [5, 130])
    assert len(everything.files) == 3 and everything.to_dict()["invalid_input"] == len(invalid)


def test_rejects_of_a_path_without_an_output_name_it(tmp_path):
    with pytest.raises(OutputNotFoundError, match="nothing"):
        read_rejects(str(tmp_path / "nothing"))
