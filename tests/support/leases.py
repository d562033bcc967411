"""Lease records as tests set them up: a holder written by hand, or a live holder's heartbeat made old.

A takeover is tested by making the holder's recorded heartbeat old rather than by waiting out its
``lease_timeout`` (at least 30 s): the record is what another writer judges, wherever it came from.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from airflow_provider_raybatch.pipeline.commit.lease import LeaseHolder


def newest_generation(folder: Path) -> Path:
    return max(folder.glob("*.json"), key=lambda p: int(p.stem))


def make_stale(folder: Path) -> None:
    """Age the heartbeat of the lease in ``folder`` past its holder's timeout, as a frozen holder's would be.

    Only for a holder that cannot heartbeat meanwhile (stopped, or written by hand).
    """
    path = newest_generation(folder)
    record = json.loads(path.read_text())
    record["heartbeat"] -= 2 * (record.get("timeout_s") or 3600) + 1
    path.write_text(json.dumps(record))


def write_holder(folder: Path, age_s: float, timeout_s: float | None, generation: int = 1) -> dict:
    """A lease record of a writer on another host, ``age_s`` seconds since its heartbeat; without
    ``timeout_s`` (None) as an older release wrote it."""
    now = time.time()
    record = {
        "generation": generation,
        "holder": dataclasses.asdict(LeaseHolder(run_key="dag_a/run_1/score/-1", try_number=1, host="worker-7")),
        "taken_at": now - age_s - 1,
        "heartbeat": now - age_s,
        "released": False,
    }
    if timeout_s is not None:
        record["timeout_s"] = timeout_s
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{generation:012d}.json").write_text(json.dumps(record))
    return record
