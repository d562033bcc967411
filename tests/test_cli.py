"""The ``raybatch`` command line as a user runs it: a process of its own on a real output, as the
console script and as ``python -m airflow_provider_raybatch``; text for people, ``--json`` for
scripts; connections resolved as the operators resolve them, their secrets never printed."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.csv as csv
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.cli import PROGRESS_MIN_FILES, ProgressBar
from airflow_provider_raybatch.pipeline.commit.verify import verify_output
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from benchmarks.status import write_output
from benchmarks.support.data import moto_s3
from tests.support.data import write_input
from tests.support.pipeline_runs import config

SCRIPT = Path(sys.executable).parent / "raybatch"


def cli(*args: str, module: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "airflow_provider_raybatch"] if module else [str(SCRIPT)]
    return subprocess.run(
        command + list(args), capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


@pytest.fixture(scope="module")
def output(tmp_path_factory, ray_local) -> Path:
    """A finished output of 250 rows with rejects (every 9th id invalid, two engine errors)."""
    tmp_path = tmp_path_factory.mktemp("cli")
    write_input(tmp_path / "in", [250])
    run_batch_inference(
        config(
            tmp_path,
            predictor="tests.support.predictors:RejectSome",
            predictor_kwargs={"invalid_every": 9, "error_ids": [5, 130]},
            rows_per_range=50,
        )
    )
    return tmp_path / "out"


REJECTED = len([i for i in range(250) if i % 9 == 0]) + 2


def test_status_prints_a_summary_and_json_for_scripts(output):
    text = cli("status", str(output))
    assert text.returncode == 0, text.stderr
    assert f"{output}: done" in text.stdout and "100.0%" in text.stdout and "ranges 5/5, rows 250/250" in text.stdout
    assert f"rejected {REJECTED} rows (2 engine errors" in text.stdout and "released" in text.stdout

    document = json.loads(cli("status", str(output), "--json").stdout)
    assert document["state"] == "done" and document["rows_planned"] == 250 and document["fraction_done"] == 1.0
    assert document["rows_rejected"] == REJECTED and document["lease"]["released"] is True
    assert document["timeline"][-1]["rows"] == 250
    # The figures by the names the view, the summary and the docs use.
    assert document["commit_rows_per_s"] is None and "rate_rows_per_s" not in document  # done: no current rate
    assert document["average_commit_rows_per_s"] > 0 and document["last_writer"]["describe"]
    [written] = document["tries"]
    assert written["rows"] == 250 and written["writer"] == document["last_writer"]
    assert f"commit rate {document['average_commit_rows_per_s']:,.0f} rows/s (average" in text.stdout
    assert f"last writer: {document['last_writer']['describe']}" in text.stdout


@pytest.mark.skipif(not SCRIPT.exists(), reason="the package is not installed (pip install -e .)")
def test_the_console_script_is_the_same_command(output):
    result = cli("status", str(output), "--json", module=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "done"


def test_rejects_prints_a_sample_and_exports_all_of_them(output, tmp_path):
    sample = cli("rejects", str(output), "--limit", "3")
    assert sample.returncode == 0, sample.stderr
    lines = sample.stdout.splitlines()
    assert lines[0] == f"{output}: {REJECTED} rejected rows (2 engine errors, {REJECTED - 2} invalid input)"
    header = lines[1].split()
    assert header[0] == "id" and header[-2:] == ["kind", "reason"] and len(lines) == 1 + 1 + 3 + 1  # and "... N more"
    assert "invalid_input" in sample.stdout and "id 9 is invalid" in sample.stdout

    document = json.loads(cli("rejects", str(output), "--json", "--limit", "5").stdout)
    assert document["rejected"] == REJECTED and document["engine_errors"] == 2 and len(document["rows"]) == 5
    assert {"id", "reason", "kind"} <= set(document["rows"][0])

    for name, read in (("all.parquet", pq.read_table), ("all.csv", csv.read_csv)):
        exported = cli("rejects", str(output), "--export", str(tmp_path / name))
        assert exported.returncode == 0 and f"wrote {REJECTED} rows" in exported.stdout, exported.stderr
        table = read(str(tmp_path / name))
        assert table.num_rows == REJECTED and sorted(table["id"].to_pylist())[:3] == [0, 5, 9]

    wrong = cli("rejects", str(output), "--export", str(tmp_path / "all.txt"))
    assert wrong.returncode == 2 and ".parquet or .csv" in wrong.stderr


def test_verify_keeps_its_form_and_answers_json(output):
    result = cli("verify", str(output))
    assert result.returncode == 0 and result.stdout.startswith(f"OK {output}: "), result.stdout + result.stderr
    assert result.stderr == ""  # not a terminal: no progress bar
    assert json.loads(cli("verify", str(output), "--json").stdout) == {
        "path": str(output),
        "ok": True,
        "faults": [],
        "warnings": [],
    }
    # An upload that landed after its writer gave up on it: a warning, no fault (no reader sees it).
    stray = output / "_raybatch" / "tmp" / "part-3.0123abcd.parquet"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"late")
    try:
        result = cli("verify", str(output))
        assert result.returncode == 0 and result.stdout.startswith(f"OK {output}: "), result.stdout
        assert "\nWARNING 1 stray temporary file(s) that no live writer is writing" in result.stdout
        assert json.loads(cli("verify", str(output), "--json").stdout)["warnings"][0].endswith(
            "_raybatch/tmp/part-3.0123abcd.parquet"
        )
    finally:
        shutil.rmtree(stray.parent)


def test_the_verifier_reports_its_progress_and_the_bar_draws_only_for_long_outputs(output):
    calls = []
    assert verify_output(str(output), progress=lambda done, total: calls.append((done, total))) == []
    assert calls[-1] == (10, 10) and [done for done, _ in calls] == list(range(1, 11))  # 5 ranges: 5 + 5 rejects

    short, long = io.StringIO(), io.StringIO()
    bar = ProgressBar(short)
    for done in range(1, 9):
        bar(done, 8)
    bar.close()
    assert short.getvalue() == ""
    bar = ProgressBar(long)
    for done in range(1, PROGRESS_MIN_FILES + 1):
        bar(done, PROGRESS_MIN_FILES)
    bar.close()
    assert long.getvalue().endswith(f"{PROGRESS_MIN_FILES}/{PROGRESS_MIN_FILES} files\n")


@pytest.mark.parametrize("command", ["status", "rejects", "verify"])
def test_a_path_without_an_output_is_a_usage_error_naming_it_for_every_command(tmp_path, command):
    """Exit 2 and the path named, as docs/cli.md's table says: a folder and a table's partition."""
    result = cli(command, str(tmp_path / "nowhere"))
    assert result.returncode == 2 and str(tmp_path / "nowhere") in result.stderr and "plan.json" in result.stderr
    assert result.stdout == ""
    table = cli(command, str(tmp_path), "--format", "delta", "--table-partition", "ds=2026-11-24")
    assert table.returncode == 2 and str(tmp_path) in table.stderr and "ds" in table.stderr, table.stderr


def test_usage_errors_exit_2(tmp_path):
    assert cli("status", str(tmp_path), "--format", "delta").returncode == 2  # a table needs --table-partition
    assert cli("frobnicate", str(tmp_path)).returncode == 2


def test_a_connection_reads_a_remote_output_and_its_secret_is_never_printed(tmp_path):
    options, server = moto_s3("cli-bucket")
    try:
        write_output("s3://cli-bucket/out", options, ranges=20, per_segment=5, done=12)[1].release()
        endpoint = options["client_kwargs"]["endpoint_url"]
        secret = "s3cr3t-never-printed"
        connection = {
            "conn_type": "aws",
            "login": "testing",
            "password": secret,
            "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
        env = {"AIRFLOW_CONN_STATUS_S3": json.dumps(connection)}
        for args in (("status", "s3://cli-bucket/out"), ("status", "s3://cli-bucket/out", "--json")):
            result = cli(*args, "--aws-conn-id", "status_s3", env=env)
            assert result.returncode == 0, result.stderr[-2000:]
            assert secret not in result.stdout + result.stderr
        assert json.loads(result.stdout)["ranges_committed"] == 12
        missing = cli("status", "s3://cli-bucket/elsewhere", "--aws-conn-id", "status_s3", "--json", env=env)
        assert missing.returncode == 2 and "s3://cli-bucket/elsewhere" in missing.stderr
        assert secret not in missing.stdout + missing.stderr
    finally:
        server.stop()


def test_a_delta_tables_date_has_a_status_per_writer(tmp_path, ray_local):
    pytest.importorskip("deltalake")
    from tests.support.tables import table_config

    write_input(tmp_path / "in", [150])
    cfg = table_config(tmp_path, "delta")
    run_batch_inference(cfg)
    result = cli("status", cfg.output_path, "--format", "delta", "--table-partition", "ds=2026-11-24", "--json")
    assert result.returncode == 0, result.stderr
    [writer] = json.loads(result.stdout)["writers"]
    assert writer["state"] == "done" and writer["rows_out"] == 150 and writer["table_commits"] == 1
    text = cli("status", cfg.output_path, "--format", "delta", "--table-partition", "ds=2026-11-24").stdout
    assert "generation 0" in text and "table commits 1, adding 2 of 2 ranges" in text
    # --partition: the old name of --table-partition, kept as an alias.
    verified = cli("verify", cfg.output_path, "--format", "delta", "--partition", "ds=2026-11-24")
    assert verified.returncode == 0 and verified.stdout.startswith("OK "), verified.stdout + verified.stderr
