from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline.errors import InputError
from airflow_provider_raybatch.pipeline.planning.footers import (
    RAY_FOOTERS_MIN_FILES_ENV,
    read_footers_on_ray,
    read_footers_threaded,
)
from airflow_provider_raybatch.pipeline.planning.planner import input_changes, plan_input
from airflow_provider_raybatch.pipeline.store.files import resolve
from tests.support.data import OpenRecordingFileSystem, features_table, write_input


def plan(path, columns=None, rows_per_range=100):
    fs, fs_path = resolve(str(path))
    return plan_input(fs, fs_path, str(path), columns, rows_per_range)


def test_ranges_follow_row_groups_and_cover_every_row_once(tmp_path):
    write_input(tmp_path, [250, 0, 130], row_group_size=40)
    p = plan(tmp_path, rows_per_range=100)
    by_file = {}
    for r in p.ranges:
        by_file.setdefault(r.file_index, []).append((r.start, r.end))
    # 250 rows in groups of 40: cut at group boundaries, never above 100 rows.
    assert by_file[0] == [(0, 80), (80, 160), (160, 250)]
    assert by_file[1] == [(0, 0)]  # an empty file still has a range, committed empty
    assert by_file[2] == [(0, 80), (80, 130)]
    assert p.total_rows == 380
    assert len({r.id for r in p.ranges}) == len(p.ranges)


def test_row_groups_larger_than_a_range_are_cut_by_offset(tmp_path):
    write_input(tmp_path, [250], row_group_size=250)
    assert [(r.start, r.end) for r in plan(tmp_path, rows_per_range=100).ranges] == [(0, 100), (100, 200), (200, 250)]


def test_plan_is_deterministic_whatever_the_creation_order(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_input(a, [120, 80])
    b.mkdir()
    for name in ["part-1.parquet", "part-0.parquet"]:  # created in the other order
        (b / name).write_bytes((a / name).read_bytes())
    assert [r.id for r in plan(a).ranges] == [r.id for r in plan(b).ranges]


def test_file_folder_and_glob_inputs_skip_hidden_files(tmp_path):
    write_input(tmp_path / "in", [10, 10])
    pq.write_table(features_table(5), tmp_path / "in" / "_SUCCESS.parquet")
    (tmp_path / "in" / ".crc").write_text("x")
    assert [f.relpath for f in plan(tmp_path / "in").files] == ["part-0.parquet", "part-1.parquet"]
    assert [f.relpath for f in plan(f"{tmp_path}/in/*-1.parquet").files] == ["part-1.parquet"]
    assert [f.relpath for f in plan(tmp_path / "in" / "part-0.parquet").files] == ["part-0.parquet"]


def test_missing_path_and_empty_glob_name_the_path(tmp_path):
    with pytest.raises(InputError, match=f"'{tmp_path}/nope' does not exist"):
        plan(tmp_path / "nope")
    (tmp_path / "in").mkdir()
    with pytest.raises(InputError, match=r"matches no file"):
        plan(f"{tmp_path}/in/*.parquet")
    with pytest.raises(InputError, match=r"holds no data file"):
        plan(tmp_path / "in")


def test_missing_column_lists_the_columns_that_exist(tmp_path):
    write_input(tmp_path, [10])
    with pytest.raises(InputError, match=r"\['label'\] not found in .*part-0.parquet.*\['id', 'features', 'group'\]"):
        plan(tmp_path, columns=["id", "label"])


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("not parquet")
    with pytest.raises(InputError, match=r"cannot read Parquet file .*notes.txt"):
        plan(tmp_path)


def test_input_changes_are_described(tmp_path):
    write_input(tmp_path, [50, 50, 50])
    recorded = plan(tmp_path).describe()
    assert input_changes(recorded, plan(tmp_path)) == ""
    os.remove(tmp_path / "part-0.parquet")
    pq.write_table(features_table(51), tmp_path / "part-1.parquet")
    pq.write_table(features_table(5), tmp_path / "part-9.parquet")
    assert input_changes(recorded, plan(tmp_path)) == (
        "added: part-9.parquet; removed: part-0.parquet; rewritten: part-1.parquet"
    )


@pytest.mark.usefixtures("ray_local")
def test_on_a_ray_driver_many_footers_are_read_by_ray_tasks_into_the_same_plan(tmp_path, monkeypatch):
    write_input(tmp_path / "in", [30] * 11 + [0], row_group_size=10)
    fs = OpenRecordingFileSystem(str(tmp_path / "opens.log"))
    folder = str(tmp_path / "in")
    expected = sorted(fs.find(folder))

    here = plan_input(fs, folder, folder, None, 25, "id", footer_reader=read_footers_threaded)
    assert {pid for pid, _ in fs.opened()} == {os.getpid()}

    # Ray is initialised in this process (as in a Ray Job's driver) and there are 12 files.
    monkeypatch.setenv(RAY_FOOTERS_MIN_FILES_ENV, "12")
    on_ray = plan_input(fs, folder, folder, None, 25, "id")
    opened = fs.opened()
    assert sorted(path for _, path in opened) == expected  # each footer read once...
    assert os.getpid() not in {pid for pid, _ in opened}  # ...by Ray's worker processes, not the driver
    assert on_ray == here  # files, fingerprints, ranges and schema alike
    assert read_footers_on_ray(fs, folder, expected, "id", files_per_task=5) == read_footers_threaded(
        fs, folder, expected, "id"
    )
    fs.opened()

    # Fewer files than the threshold: a Ray round trip costs more than the reads.
    monkeypatch.setenv(RAY_FOOTERS_MIN_FILES_ENV, "13")
    assert plan_input(fs, folder, folder, None, 25, "id") == here
    assert {pid for pid, _ in fs.opened()} == {os.getpid()}


@pytest.mark.usefixtures("ray_local")
def test_ray_tasks_name_the_first_unreadable_file_as_the_threads_do(tmp_path):
    write_input(tmp_path, [10] * 6)
    for name in ("part-1b.parquet", "part-4b.parquet"):  # in the first and the last batch of two
        (tmp_path / name).write_text("not parquet")
    fs, folder = resolve(str(tmp_path))
    paths = sorted(fs.find(folder))
    for reader in (read_footers_threaded, lambda *a: read_footers_on_ray(*a, files_per_task=2)):
        with pytest.raises(InputError, match=r"cannot read Parquet file .*part-1b.parquet"):
            reader(fs, folder, paths, None)
