"""Output integrity: one schema per output, the id column as a key, input fingerprints a rewrite cannot pass.

Real Parquet files and a real local Ray; each bad case fails before Ray (planning) or before the
offending range's commit, and what was committed stays sound.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.commit.verify import verify_output
from airflow_provider_raybatch.pipeline.errors import (
    InputChangedError,
    InputError,
    NotRetryableError,
    OutputSchemaError,
    RowKeyError,
)
from airflow_provider_raybatch.pipeline.planning.input_files import read_file_info
from airflow_provider_raybatch.pipeline.planning.planner import input_changes, plan_input
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.shards import plan_shards
from tests.support.data import assert_output_sound, features_table, read_output, write_input
from tests.support.pipeline_runs import commit_count, config

pytestmark = pytest.mark.usefixtures("ray_local")

#: Writer settings under which the footer holds nothing that depends on the values: no statistics,
#: no compression, no dictionary. A file rewritten with its rows in another order keeps size and footer.
VALUE_BLIND = {"write_statistics": False, "compression": "none", "use_dictionary": False}


def only_uncommitted_faults(output: Path) -> None:
    """The verifier finds nothing wrong with what was committed: its only faults are ranges not committed."""
    faults = verify_output(str(output))
    assert faults and all(re.match(r"\d+ planned range\(s\) not committed", f) for f in faults), faults


def load_marker_config(tmp_path: Path, **kwargs) -> tuple[BatchInferenceConfig, Path]:
    marker = tmp_path / "model-loaded"
    return config(
        tmp_path, "tests.support.predictors:LoadMarker", predictor_kwargs={"marker": str(marker)}, **kwargs
    ), marker


# --- input schema ------------------------------------------------------------------------------


def test_an_id_column_of_two_types_is_refused_before_the_model_loads(tmp_path):
    write_input(tmp_path / "in", [100])
    drifted = features_table(100, 100)
    drifted = drifted.set_column(0, "id", drifted["id"].cast(pa.string()))
    pq.write_table(drifted, tmp_path / "in" / "part-1.parquet")
    cfg, marker = load_marker_config(tmp_path)
    with pytest.raises(InputError, match=r"column 'id' has type int64 in '.*part-0.parquet' but string in '.*part-1"):
        run_batch_inference(cfg)
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_features_column_of_two_types_is_refused_before_the_model_loads(tmp_path):
    (tmp_path / "in").mkdir()
    x = np.random.default_rng(0).random((50, 32))
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(x.astype(np.float32).reshape(-1)), 32)
    pq.write_table(pa.table({"id": np.arange(50), "features": fixed}), tmp_path / "in" / "a.parquet")
    variable = pa.array(list(x), pa.list_(pa.float64()))
    pq.write_table(pa.table({"id": np.arange(50, 100), "features": variable}), tmp_path / "in" / "b.parquet")
    cfg, marker = load_marker_config(tmp_path)
    with pytest.raises(
        InputError,
        match=r"column 'features' has type fixed_size_list<\w+: float>\[32\] in '.*a.parquet' "
        r"but list<element: double> in '.*b.parquet'",
    ):
        run_batch_inference(cfg)
    assert not marker.exists()


def test_an_empty_file_fits_any_type(tmp_path):
    write_input(tmp_path / "in", [0, 120])  # the empty file's string column is of type null
    run_batch_inference(config(tmp_path, keep_columns=["group"]))
    assert_output_sound(tmp_path / "out", range(120))


# --- output schema -----------------------------------------------------------------------------


def test_a_stage_whose_output_type_drifts_commits_nothing_of_the_drifting_range(tmp_path):
    write_input(tmp_path / "in", [500])
    cfg = config(
        tmp_path, "tests.support.predictors:IntegerScoreFor", predictor_kwargs={"drift_id": 250}, batch_size=100
    )
    with pytest.raises(OutputSchemaError) as failure:
        run_batch_inference(cfg)
    message = str(failure.value)
    # Whichever range committed first fixed the schema; the other kind is refused.
    assert re.search(r"column 'score' has type (int64|float) where the output has (float|int64)", message), message
    assert "stage 'score'" in message or "stage 'IntegerScoreFor'" in message, message
    refused = re.search(r"range (\S+) with a schema", message).group(1)
    assert not (tmp_path / "out" / f"part-{refused}.parquet").exists()
    assert 0 < commit_count(tmp_path / "out") < 5
    only_uncommitted_faults(tmp_path / "out")
    schemas = {pq.read_schema(p) for p in (tmp_path / "out").glob("part-*.parquet")}
    assert len(schemas) == 1  # every committed file has the one schema
    recorded = json.loads((tmp_path / "out" / "_raybatch" / "schemas" / "output.json").read_text())
    assert [f["name"] for f in recorded["fields"]] == ["id", "features", "group", "score"]


def test_shards_of_one_output_are_held_to_the_schema_the_first_recorded(tmp_path):
    write_input(tmp_path / "in", [400])
    base = config(
        tmp_path, "tests.support.predictors:IntegerScoreFor", predictor_kwargs={"drift_id": 350}, batch_size=100
    )
    first, second = plan_shards(base, 2)

    def shard(p):
        return config(
            tmp_path,
            "tests.support.predictors:IntegerScoreFor",
            predictor_kwargs={"drift_id": 350},
            batch_size=100,
            range_ids=p.range_ids,
        )

    run_batch_inference(shard(first))  # records score: float
    with pytest.raises(OutputSchemaError, match=r"column 'score' has type int64 where the output has float"):
        run_batch_inference(shard(second))
    assert read_output(tmp_path / "out").schema.field("score").type == pa.float32()
    only_uncommitted_faults(tmp_path / "out")


def test_recording_a_schema_is_create_if_absent(tmp_path):
    ledger = OutputLedger.open(str(tmp_path / "out"))
    first = pa.schema([("id", pa.int64()), ("score", pa.float32())])
    assert ledger.record_schema("output", first).equals(first)
    # A writer that lost the race is given the winner's schema to compare against.
    assert ledger.record_schema("output", pa.schema([("id", pa.int64()), ("score", pa.int64())])).equals(first)
    assert ledger.recorded_schema("output").equals(first)
    assert ledger.recorded_schema("rejects") is None


# --- the id column as a key ---------------------------------------------------------------------


def write_with_null_ids(path: Path, rows: int, null_rows: list[int], **writer) -> None:
    table = features_table(rows)
    ids = [None if i in null_rows else i for i in range(rows)]
    pq.write_table(table.set_column(0, "id", pa.array(ids, pa.int64())), path, row_group_size=100, **writer)


def test_null_ids_in_the_input_are_refused_at_planning_from_the_footer(tmp_path):
    write_input(tmp_path / "in", [100])
    write_with_null_ids(tmp_path / "in" / "part-1.parquet", 200, [3, 150, 170])
    cfg, marker = load_marker_config(tmp_path)
    with pytest.raises(InputError, match=r"id_column 'id' holds 3 null\(s\) in '.*part-1.parquet'"):
        run_batch_inference(cfg)
    assert not marker.exists()


def test_null_ids_without_statistics_are_refused_before_their_range_commits(tmp_path):
    (tmp_path / "in").mkdir()
    write_with_null_ids(tmp_path / "in" / "part-0.parquet", 300, [150, 170], write_statistics=False)
    with pytest.raises(
        RowKeyError, match=r"holds 2 null\(s\).*Found in range \S+ \(rows 100-200 of '.*part-0.parquet'\)"
    ):
        run_batch_inference(config(tmp_path, batch_size=100))
    only_uncommitted_faults(tmp_path / "out")


def test_null_ids_echoed_by_a_predictor_as_nan_are_refused_before_commit(tmp_path):
    (tmp_path / "in").mkdir()
    write_with_null_ids(tmp_path / "in" / "part-0.parquet", 300, [250], write_statistics=False)
    cfg = config(tmp_path, "tests.support.predictors:add_bias", predictor_kwargs={"bias": 1.0}, batch_size=100)
    with pytest.raises(
        RowKeyError,
        match=r"returned id_column 'id' with type double \(1 of them null or NaN\) where the input's is int64",
    ):
        run_batch_inference(cfg)
    only_uncommitted_faults(tmp_path / "out")
    assert read_output(tmp_path / "out").schema.field("id").type == pa.int64()


def test_duplicate_ids_within_a_range_are_refused_and_across_ranges_the_verifier_finds_them(tmp_path):
    (tmp_path / "in").mkdir()
    table = features_table(200)
    ids = list(range(200))
    ids[120] = 110
    pq.write_table(table.set_column(0, "id", pa.array(ids)), tmp_path / "in" / "part-0.parquet", row_group_size=100)
    with pytest.raises(RowKeyError, match=r"1 duplicated id\(s\), e\.g\. 110.*Found in range \S+-100-200"):
        run_batch_inference(config(tmp_path, batch_size=100))
    only_uncommitted_faults(tmp_path / "out")

    # Across ranges only the verifier, reading the whole output, can tell.
    ids[120], ids[150] = 120, 10
    pq.write_table(table.set_column(0, "id", pa.array(ids)), tmp_path / "in" / "part-0.parquet", row_group_size=100)
    run_batch_inference(config(tmp_path, batch_size=100, mode="overwrite"))
    assert verify_output(str(tmp_path / "out")) == ["1 id value(s) written more than once: 10"]


# --- input fingerprint --------------------------------------------------------------------------


def plan_of(folder: Path | str, fs=None):
    import fsspec

    fs = fs or fsspec.filesystem("file")
    return plan_input(fs, str(folder), str(folder), None, 100)


def test_a_same_size_same_footer_rewrite_is_refused_on_resume(tmp_path):
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "part-0.parquet"
    table = features_table(1000)
    pq.write_table(table, path, row_group_size=100, **VALUE_BLIND)
    marker = tmp_path / "fail-marker"
    marker.touch()
    cfg = config(
        tmp_path,
        "tests.support.predictors:FailWhileMarked",
        predictor_kwargs={"marker": str(marker), "fail_from_id": 600, "output": str(tmp_path / "out")},
        batch_size=100,
    )
    with pytest.raises(Exception, match="injected failure"):
        run_batch_inference(cfg)
    assert commit_count(tmp_path / "out") > 0
    before = read_file_info(_local(), str(path), str(tmp_path / "in"))[0]

    shuffled = table.take(np.random.default_rng(1).permutation(1000))
    pq.write_table(shuffled, path, row_group_size=100, **VALUE_BLIND)
    after = read_file_info(_local(), str(path), str(tmp_path / "in"))[0]
    assert (after.size, after.signature) == (before.size, before.signature)  # what the old check compared
    assert after.mtime != before.mtime

    marker.unlink()
    with pytest.raises(InputChangedError, match=r"changed since .* \(rewritten: part-0.parquet\)"):
        run_batch_inference(cfg)


def test_a_plan_recorded_without_the_new_fields_still_resumes(tmp_path):
    write_input(tmp_path / "in", [1000])
    marker = tmp_path / "fail-marker"
    marker.touch()
    cfg = config(
        tmp_path,
        "tests.support.predictors:FailWhileMarked",
        predictor_kwargs={"marker": str(marker), "fail_from_id": 600, "output": str(tmp_path / "out")},
        batch_size=100,
    )
    with pytest.raises(Exception, match="injected failure"):
        run_batch_inference(cfg)
    committed = commit_count(tmp_path / "out")
    assert committed > 0
    plan_file = tmp_path / "out" / "_raybatch" / "plan.json"
    plan = json.loads(plan_file.read_text())
    assert {"mtime"} <= plan["input"]["files"][0].keys()
    for described in plan["input"]["files"]:  # as an earlier version recorded it
        for key in ("mtime", "etag", "version"):
            described.pop(key, None)
    plan_file.write_text(json.dumps(plan))
    os.utime(tmp_path / "in" / "part-0.parquet", (1_000_000_000, 1_000_000_000))  # not compared: not recorded

    marker.unlink()
    summary = run_batch_inference(cfg)
    assert summary.ranges_skipped == committed
    assert_output_sound(tmp_path / "out", range(1000))


def test_an_object_store_rewrite_changes_etag_and_modification_time(tmp_path, s3_server):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server)
    table = features_table(200)
    with fs.open("raybatch-test/fingerprint/part-0.parquet", "wb") as f:
        pq.write_table(table, f, row_group_size=100, **VALUE_BLIND)
    recorded = plan_of("raybatch-test/fingerprint", fs).describe()
    assert recorded["files"][0]["etag"] and recorded["files"][0]["mtime"]
    with fs.open("raybatch-test/fingerprint/part-0.parquet", "wb") as f:
        pq.write_table(table.take(np.arange(199, -1, -1)), f, row_group_size=100, **VALUE_BLIND)
    fs.invalidate_cache()
    now = plan_of("raybatch-test/fingerprint", fs)
    assert now.files[0].signature == recorded["files"][0]["signature"]
    assert now.files[0].etag != recorded["files"][0]["etag"]
    assert input_changes(recorded, now) == "rewritten: part-0.parquet"


def _local():
    import fsspec

    return fsspec.filesystem("file")


def test_a_corrupt_data_page_fails_without_retry_naming_the_file_and_row_group(tmp_path):
    write_input(tmp_path / "in", [300])
    path = tmp_path / "in" / "part-0.parquet"
    pq.write_table(pq.read_table(path), path, row_group_size=100, compression="snappy")
    # Damage the second row group's pages, leaving the footer (and the first row group) intact.
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(1)
    start = chunk.data_page_offset + 40
    data = bytearray(path.read_bytes())
    data[start : start + 200] = bytes(200)
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"cannot read row group 1 of '{path}'.*\(range [0-9a-f]+-100-200\)"):
        run_batch_inference(config(tmp_path))
    assert verify_output(str(tmp_path / "out")) != []  # the output is not complete: that range is missing
    committed = OutputLedger.open(str(tmp_path / "out")).committed()
    assert all(not name.endswith("-100-200") for name in committed)


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB filesystem of its own (tmpfs), for an output that cannot fit on it."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_names_the_output_and_the_range_and_keeps_what_was_committed(tmp_path, small_disk, monkeypatch):
    # Each range recorded as it is published: ranges are committed before the disk fills. (Batched,
    # the batch whose record no longer fits is unpublished whole: nothing committed, nothing lost.)
    monkeypatch.setenv("RAYBATCH_RECORD_INTERVAL_S", "0")
    write_input(tmp_path / "in", [60_000], row_group_size=6_000)
    output = small_disk / "out"
    cfg = config(tmp_path, output_path=str(output), rows_per_range=6_000)
    with pytest.raises(
        Exception,
        match=rf"(cannot write rows of range #\d+ of the plan|cannot commit range \S+) "
        rf"(to|of) output '{output}'.*No space left on device",
    ) as failure:
        run_batch_inference(cfg)
    assert not isinstance(failure.value, NotRetryableError)  # space may be freed before the retry
    # What was committed before the disk filled stays readable, each row once.
    committed = OutputLedger.open(str(output)).committed()
    assert 0 < len(committed) < 10
    faults = verify_output(str(output))
    assert faults and all(re.match(r"\d+ planned range\(s\) not committed", f) for f in faults), faults
    ids = read_output(output)["id"].to_pylist()
    assert len(ids) == len(set(ids)) == sum(r.rows for r in committed.values())
    assert set(ids) <= set(range(60_000))
