"""The quick start's model and data (needs the ``examples`` extra: torch and scikit-learn)."""

from __future__ import annotations

import argparse
from pathlib import Path


def demo_args(description: str, argv: list[str] | None) -> tuple[str, Path, str]:
    """``prepare|report --root DIR --date DS``, the command line of the demos' data scripts."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["prepare", "report"])
    parser.add_argument("--root", type=Path, required=True, help="the demo's data folder")
    parser.add_argument("--date", required=True, help="the logical date (ds) of the run")
    args = parser.parse_args(argv)
    return args.command, args.root.resolve(), args.date
