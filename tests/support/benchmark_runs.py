"""Running a benchmark script at a tiny size, for the smoke tests of benchmarks/ (structure, never timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from tests.conftest import REPO

#: Daft's own environment (`make daft-env`): its variants run with this interpreter.
DAFT_PYTHON = REPO / ".venv-daft" / "bin" / "python"


def run_benchmark(name: str, tmp_path: Path, *args: str, timeout: int = 600) -> dict:
    """``python -m benchmarks.<name> ARGS``, writing its results to ``tmp_path/results`` and its data to
    ``tmp_path/data``; the results' JSON (the test fails with the script's output if it did)."""
    run = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args]
        + ["--out", str(tmp_path / "results"), "--work-dir", str(tmp_path / "data")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads((tmp_path / "results" / f"{name}.json").read_text())


def run_images(tmp_path: Path, *variants: str) -> tuple[dict, dict[str, dict]]:
    """benchmarks/images.py on 20 images: its results and each variant's output, by id."""
    results = run_benchmark("images", tmp_path, "--rows", "20", "--batch-size", "8", "--variants", *variants)
    labels = {v: pq.read_table(tmp_path / "data" / f"out-images-{v}").sort_by("id").to_pydict() for v in variants}
    return results, labels


def run_embedding(tmp_path: Path, *variants: str) -> tuple[dict, dict[str, dict]]:
    """benchmarks/embedding.py on 64 texts with all-MiniLM-L6-v2: its results and each variant's vectors, by id."""
    results = run_benchmark("embedding", tmp_path, "--rows", "64", "--batch-size", "16", "--variants", *variants)
    vectors = {}
    for variant in variants:
        table = pq.read_table(tmp_path / "data" / f"out-embed-{variant}").sort_by("id")
        vectors[variant] = {
            "id": table.column("id").to_pylist(),
            "embedding": np.stack(table["embedding"].to_numpy(zero_copy_only=False)),
        }
    return results, vectors
