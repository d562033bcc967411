"""Results: the machine's description, the load average, and a benchmark's tables (measured rows,
targets, notes), printed and written to ``<out>/<name>.json`` and ``<name>.md``."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    cpu_model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        ram_gib = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        ram_gib = None
    versions = {}
    for module in ("ray", "torch", "pyarrow"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = None
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "ram_gib": ram_gib,
        "cpu_model": cpu_model,
        "python": platform.python_version(),
        **versions,
    }


def load_average() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


class Results:
    """Tables of one benchmark, printed and written to ``<out>/<name>.json`` and ``<name>.md``.

    ``add`` appends a measured row; ``check`` appends a row to the table of targets.
    """

    def __init__(self, name: str, title: str, args: argparse.Namespace):
        self.name, self.title = name, title
        self.out = Path(args.out)
        self.params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        self.machine = machine()
        self.load_at_start = load_average()
        self.rows: list[dict[str, Any]] = []
        self.targets: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def add(self, **row: Any) -> dict[str, Any]:
        row.setdefault("load_avg", load_average())
        self.rows.append(row)
        print("  " + ", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        return row

    def check(self, measure: str, value: float, target: str, met: bool | None) -> None:
        """Record a measured value against its target (``met=None``: for information)."""
        verdict = "" if met is None else ("met" if met else "missed")
        self.targets.append({"measure": measure, "value": value, "target": target, "verdict": verdict})
        print(f"  {measure}: {value} (target {target}) {verdict}", flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(text, flush=True)

    def markdown(self) -> str:
        m = self.machine
        lines = [
            f"### {self.title}",
            "",
            f"{m['date']}; {m['nproc']} CPUs ({m['cpu_model']}), {m['ram_gib']} GiB RAM; "
            f"load average (1/5/15 min) at start {self.load_at_start}, at end {load_average()}; "
            f"ray {m['ray']}, torch {m['torch']}, pyarrow {m['pyarrow']}.",
            "",
            markdown_table(self.rows),
        ]
        if self.targets:
            lines += ["", markdown_table(self.targets)]
        if self.notes:
            lines += ["", *[f"- {n}" for n in self.notes]]
        return "\n".join(lines) + "\n"

    def write(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        data = {
            "benchmark": self.name,
            "title": self.title,
            "machine": self.machine,
            "params": self.params,
            "load_avg_start": self.load_at_start,
            "load_avg_end": load_average(),
            "rows": self.rows,
            "targets": self.targets,
            "notes": self.notes,
        }
        (self.out / f"{self.name}.json").write_text(json.dumps(data, indent=2) + "\n")
        markdown = self.markdown()
        (self.out / f"{self.name}.md").write_text(markdown)
        print("\n" + markdown, flush=True)
        return self.out / f"{self.name}.md"


def markdown_table(rows: Iterable[dict[str, Any]]) -> str:
    rows = list(rows)
    if not rows:
        return "(no rows)"
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
