"""A smoke test of the benchmark scripts at a tiny size: structure only, never timings."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_throughput_script_runs_and_writes_its_results(tmp_path):
    out = tmp_path / "results"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "throughput.py"), "--rows", "3000", "--variants", "plain"]
        + ["--out", str(out), "--work-dir", str(tmp_path / "data"), "--batch-size", "1000"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    results = json.loads((out / "throughput.json").read_text())
    assert results["benchmark"] == "throughput"
    assert {"nproc", "cpu_model", "ram_gib", "date"} <= set(results["machine"])
    (row,) = results["rows"]
    assert row["variant"] == "plain" and row["rows"] == 3000 and row["rows_per_s"] > 0
    assert "| plain |" in (out / "throughput.md").read_text()
