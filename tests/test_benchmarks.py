"""A smoke test of the benchmark scripts at a tiny size: structure only, never timings."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_throughput_script_runs_and_writes_its_results(tmp_path):
    out = tmp_path / "results"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "throughput.py"),
            "--rows",
            "3000",
            "--variants",
            "plain",
            "operator",
        ]
        + ["--out", str(out), "--work-dir", str(tmp_path / "data"), "--batch-size", "1000"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((out / "throughput.json").read_text())
    assert results["benchmark"] == "throughput"
    assert {"nproc", "cpu_model", "ram_gib", "date"} <= set(results["machine"])
    assert [(r["variant"], r["rows"]) for r in results["rows"]] == [("plain", 3000), ("operator", 3000)]
    assert all(r["rows_per_s"] > 0 for r in results["rows"])
    assert "| plain |" in (out / "throughput.md").read_text()


def test_commit_cost_script_runs(tmp_path):
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "commit_cost.py"), "--ranges", "3", "--repeats", "1"]
        + ["--rows-per-range", "1000", "--out", str(out), "--work-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((out / "commit_cost.json").read_text())["rows"]
    assert [r["setting"] for r in rows] == ["durable and fenced", "fenced, no fsync", "neither"]


def test_ledger_cost_script_runs(tmp_path):
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "ledger_cost.py"), "--ranges", "50", "--record-each", "5"]
        + ["--out", str(out), "--work-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((out / "ledger_cost.json").read_text())["rows"]
    assert [(r["layout"], r["objects_read"]) for r in rows] == [
        ("layout 1", 50),
        ("layout 2, folded", 1),
        ("layout 2, killed", 2),  # 50 records, 30 a segment
    ]
