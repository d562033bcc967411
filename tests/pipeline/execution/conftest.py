"""The write step and the driver's commits, driven without Ray Data: a prepared output of 3 ranges."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_raybatch.pipeline.execution.range_reader import read_ranges
from airflow_provider_raybatch.pipeline.prepare import prepare
from tests.support.data import write_input
from tests.support.pipeline_runs import config


@pytest.fixture
def prepared(tmp_path):
    write_input(tmp_path / "in", [300])  # 3 ranges of 100 rows
    cfg = config(tmp_path)
    run = prepare(cfg)
    yield cfg, run
    run.release()


def scored_block(run, index: int) -> pa.Table:
    """Range ``index`` as the last stage hands it to the write step: its rows with a score."""
    row_range = run.plan.ranges[index]
    file = run.plan.files[row_range.file_index]
    (table,) = read_ranges(run.in_fs, file, [(index, row_range)], run.plan.schema.names, run.keep, False)
    return table.append_column("score", pa.array([float(i) for i in range(table.num_rows)], pa.float32()))
