"""Reading planned ranges: the ranges of one row group share a read task, so the group is decoded once."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline.execution.datasource import group_ranges
from airflow_provider_raybatch.pipeline.execution.range_reader import read_ranges
from airflow_provider_raybatch.pipeline.planning.planner import plan_input
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.store.files import resolve
from tests.support.data import assert_output_sound, write_input
from tests.support.pipeline_runs import commit_count, config


def plan(path, rows_per_range):
    fs, fs_path = resolve(str(path))
    return fs, plan_input(fs, fs_path, str(path), None, rows_per_range)


def spans(p, groups):
    return [[(p.ranges[i].file_index, p.ranges[i].start, p.ranges[i].end) for i in group] for group in groups]


def test_ranges_of_one_row_group_are_read_together_and_replicas_still_get_work(tmp_path):
    write_input(tmp_path, [250, 120], row_group_size=250)
    _, p = plan(tmp_path, rows_per_range=50)
    pending = list(range(len(p.ranges)))
    # One task per row group (never across files).
    assert spans(p, group_ranges(p, pending, replicas=1)) == [
        [(0, 0, 50), (0, 50, 100), (0, 100, 150), (0, 150, 200), (0, 200, 250)],
        [(1, 0, 50), (1, 50, 100), (1, 100, 120)],
    ]
    # Three replicas: at most 370 / 3 rows a task, so that each replica gets some.
    assert [len(g) for g in group_ranges(p, pending, replicas=3)] == [2, 2, 1, 3]
    # A committed range in between: the ranges around it still share their row group's read.
    assert spans(p, group_ranges(p, [0, 1, 3, 4], replicas=1)) == [
        [(0, 0, 50), (0, 50, 100), (0, 150, 200), (0, 200, 250)]
    ]


def test_ranges_of_different_row_groups_are_not_grouped(tmp_path):
    write_input(tmp_path, [300], row_group_size=100)
    _, p = plan(tmp_path, rows_per_range=100)
    assert group_ranges(p, list(range(len(p.ranges))), replicas=1) == [[0], [1], [2]]


def test_a_shared_row_group_is_decoded_once(tmp_path, monkeypatch):
    write_input(tmp_path, [300], row_group_size=150)
    fs, p = plan(tmp_path, rows_per_range=50)
    decoded = []
    real = pq.ParquetFile.read_row_group
    monkeypatch.setattr(
        pq.ParquetFile, "read_row_group", lambda self, i, **kw: decoded.append(i) or real(self, i, **kw)
    )
    (group,) = [g for g in group_ranges(p, list(range(len(p.ranges))), replicas=1) if p.ranges[g[0]].start == 0]
    tables = list(read_ranges(fs, p.files[0], [(i, p.ranges[i]) for i in group], p.schema.names, [], False))
    assert decoded == [0]  # three ranges, one decode
    assert [t.num_rows for t in tables] == [50, 50, 50]
    assert pa.concat_tables(tables).column("id").to_pylist() == list(range(150))


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("concurrency", [1, 2])
def test_small_ranges_in_large_row_groups_are_written_once_each(tmp_path, concurrency):
    write_input(tmp_path / "in", [1000, 400], row_group_size=500)
    summary = run_batch_inference(config(tmp_path, rows_per_range=20, concurrency=concurrency, batch_size=64))
    assert summary.ranges_done == summary.ranges_total == 70 and summary.rows_processed == 1400
    assert_output_sound(tmp_path / "out", range(1400))


@pytest.mark.usefixtures("ray_local")
def test_ranges_read_together_are_committed_one_by_one_and_a_failure_keeps_them(tmp_path):
    # 25 ranges of 20 rows in one 500-row row group: one read task, one block. The replica
    # hands on its ranges as it scores them, so those before the failing row are committed (the
    # files written before the failure, when the run fails: no need to wait for a commit first).
    write_input(tmp_path / "in", [500], row_group_size=500)
    marker = tmp_path / "fail-marker"
    marker.touch()
    cfg = config(
        tmp_path,
        predictor="tests.support.predictors:FailWhileMarked",
        predictor_kwargs={"marker": str(marker), "fail_from_id": 300, "output": str(tmp_path / "out"), "wait_s": 1},
        rows_per_range=20,
        batch_size=20,
    )
    with pytest.raises(Exception, match="injected failure"):
        run_batch_inference(cfg)
    assert commit_count(tmp_path / "out") == 15  # every range before id 300
    marker.unlink()
    summary = run_batch_inference(cfg)
    assert summary.ranges_skipped == 15 and summary.rows_processed == 200
    assert_output_sound(tmp_path / "out", range(500))
