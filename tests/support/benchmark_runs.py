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


def run_images(tmp_path: Path, *variants: str) -> tuple[dict, dict[str, dict]]:
    """benchmarks/images.py on 20 images: its results and each variant's output, by id."""
    out, work = tmp_path / "results", tmp_path / "data"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.images", "--rows", "20", "--batch-size", "8", "--variants", *variants]
        + ["--out", str(out), "--work-dir", str(work)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((out / "images.json").read_text())
    labels = {v: pq.read_table(work / f"out-images-{v}").sort_by("id").to_pydict() for v in variants}
    return results, labels


def run_embedding(tmp_path: Path, *variants: str) -> tuple[dict, dict[str, dict]]:
    """benchmarks/embedding.py on 64 texts with all-MiniLM-L6-v2: its results and each variant's vectors, by id."""
    out, work = tmp_path / "results", tmp_path / "data"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.embedding", "--rows", "64", "--batch-size", "16", "--variants", *variants]
        + ["--out", str(out), "--work-dir", str(work)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((out / "embedding.json").read_text())
    vectors = {}
    for variant in variants:
        table = pq.read_table(work / f"out-embed-{variant}").sort_by("id")
        vectors[variant] = {
            "id": table.column("id").to_pylist(),
            "embedding": np.stack(table["embedding"].to_numpy(zero_copy_only=False)),
        }
    return results, vectors
