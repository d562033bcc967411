"""The verifier on real outputs: a sound one passes; each kind of damage is found and named."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline.commit.verify import verify_output
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from tests.support.data import write_input
from tests.support.pipeline_runs import config

pytestmark = pytest.mark.usefixtures("ray_local")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("verify")
    write_input(tmp_path / "in", [300, 200])
    run_batch_inference(
        config(
            tmp_path,
            predictor="tests.support.predictors:RejectSome",
            predictor_kwargs={"invalid_every": 7},
            rows_per_range=50,
        )
    )
    return tmp_path / "out"


@pytest.fixture
def output(finished, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(finished, copy)
    return copy


def cli(path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "airflow_provider_raybatch", "verify", str(path)], capture_output=True, text=True
    )


def test_a_finished_output_passes(output):
    assert list((output / "_rejects").glob("part-*.parquet"))  # the rejects are checked too
    assert verify_output(str(output)) == []
    result = cli(output)
    assert result.returncode == 0 and result.stdout.startswith("OK "), result.stdout + result.stderr


def test_each_kind_of_damage_is_named(output):
    parts = sorted(output.glob("part-*.parquet"))
    manifest_path = output / "_raybatch" / "manifest.json"
    # A committed file lost, a stray part file, a file whose rows changed, a commit record lost.
    parts[0].unlink()
    shutil.copy(parts[1], output / "part-stray.parquet")
    # One row of another range written again (its row count unchanged).
    dup = pq.read_table(parts[2])["id"][0].as_py()
    table = pq.read_table(parts[3])
    pq.write_table(table.set_column(0, "id", pa.array([dup, *table["id"].to_pylist()[1:]], pa.int64())), parts[3])
    pq.write_table(pq.read_table(parts[4]).slice(0, 10), parts[4])
    lost = parts[5].name.removeprefix("part-").removesuffix(".parquet")
    manifest = json.loads(manifest_path.read_text())
    (record,) = [r for r in manifest["records"] if r[0] == lost]
    assert record[4] == [parts[5].name, f"_rejects/{parts[5].name}"]  # its files, rejects too
    manifest["records"].remove(record)
    manifest_path.write_text(json.dumps(manifest))

    faults = verify_output(str(output))
    text = "\n".join(faults)
    assert f"1 committed file(s) missing: {parts[0].name}" in text
    # The lost record named the range's rejects file too.
    assert f"3 part file(s) without a commit record: _rejects/{parts[5].name}, {parts[5].name}, part-stray" in text
    assert f"1 planned range(s) not committed: {lost}" in text
    assert f"file(s) whose rows differ from their record: {parts[4].name} (10 rows, recorded" in text
    assert f"1 id value(s) written more than once: {dup}" in text
    assert len(faults) == 5
    result = cli(output)
    assert result.returncode == 1 and result.stdout.count("FAULT ") == 5


def test_a_folder_that_is_not_an_output_is_a_fault(tmp_path):
    assert verify_output(str(tmp_path)) == [f"{tmp_path}: no _raybatch/plan.json: not an output of this provider"]
