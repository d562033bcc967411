"""The command line every benchmark script shares: its options (sizes, folders, batch size,
threads, range size) and the parameters every variant run gets from them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.support.data import BATCH_SIZE, ROW_GROUP_ROWS, ROWS_PER_FILE, THREADS, weights
from benchmarks.support.paths import DEFAULT_RESULTS_DIR, DEFAULT_WORK_DIR


def base_parser(description: str, rows: list[int]) -> argparse.ArgumentParser:
    """Options every benchmark script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--rows", type=int, nargs="+", default=rows, help=f"input sizes in rows (default: {' '.join(map(str, rows))})"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR, help="folder for the results (JSON, Markdown)")
    parser.add_argument(
        "--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="folder for generated input and outputs"
    )
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="rows per model call, in every variant")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch threads, in every variant")
    parser.add_argument("--rows-per-range", type=int, default=100_000, help="the operator's checkpoint granularity")
    parser.add_argument(
        "--rows-per-file", type=int, default=ROWS_PER_FILE, help=f"input rows per file (default {ROWS_PER_FILE:,})"
    )
    parser.add_argument(
        "--row-group-rows",
        type=int,
        default=ROW_GROUP_ROWS,
        help=f"input rows per row group (default {ROW_GROUP_ROWS:,})",
    )
    return parser


def common_params(
    args: argparse.Namespace, input_path: Path, output_path: Path, model: str = "heavy"
) -> dict[str, Any]:
    return {
        "input": str(input_path),
        "output": str(output_path),
        "model": model,
        "weights": str(weights(args.work_dir, model)),
        "batch_size": args.batch_size,
        "threads": args.threads,
        "rows_per_range": args.rows_per_range,
    }
