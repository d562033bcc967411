"""Timed steps written by the processes of a run (Ray's workers too) to one file, named by
``$RAYBATCH_BENCH_TIMINGS``: one JSON line per step (stage, process, start, end, items).

Standard library only, so that a worker can time its own imports with it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

TIMINGS_ENV = "RAYBATCH_BENCH_TIMINGS"


def record(stage: str, started: float, items: int = 0, ended: float | None = None) -> None:
    """Append one timed step to ``$RAYBATCH_BENCH_TIMINGS`` (nothing when it is not set).

    Wall-clock times (``time.time()``), so that the processes of a run share one clock; one short
    line per write, which O_APPEND keeps whole between processes.
    """
    path = os.environ.get(TIMINGS_ENV)
    if not path:
        return
    end = time.time() if ended is None else ended
    line = json.dumps({"stage": stage, "pid": os.getpid(), "start": started, "end": end, "images": items})
    with open(path, "a") as f:
        f.write(line + "\n")


def read_timings(path: Path) -> list[dict[str, Any]]:
    """The steps recorded in ``path`` (none when no process wrote it)."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
