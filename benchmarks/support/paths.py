"""Where things are: the repository, the benchmarks' folder, the default work and results folders."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO / "benchmarks"
DEFAULT_WORK_DIR = BENCH_DIR / "data"  # git-ignored: inputs and outputs
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"
