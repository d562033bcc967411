"""A second writer that takes a run's lease over while the run is mid-way (issue 41's sequence).

:class:`TakeOverOnce` is the run's stage: on its second batch it makes the run's lease stale (as a
frozen holder's would be) and starts a real second writer on the same output (:func:`.prepare.prepare`:
it takes the lease and removes the temporary files the first writer is writing), then lets the first
writer go on, to meet the takeover as a vanished folder when it writes that batch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from airflow_provider_raybatch.pipeline import BatchInferenceConfig
from tests.support.pipeline_runs import commit_count, config

RUN_KEY = "dag_a/run_1/score/-1"


def takeover_config(tmp_path: Path, try_number: int) -> BatchInferenceConfig:
    """The run's config (the second writer's differs only in its try), on ``tmp_path``'s in/ and out/."""
    return config(
        tmp_path,
        "tests.support.takeover:TakeOverOnce",
        predictor_kwargs={"tmp_path": str(tmp_path)},
        batch_size=100,
        concurrency=1,
        run_key=RUN_KEY,
        try_number=try_number,
    )


def files_of(output: Path) -> dict[str, int]:
    """Every file of ``output``, bookkeeping included, with its modification time."""
    return {str(p.relative_to(output)): p.stat().st_mtime_ns for p in output.rglob("*") if p.is_file()}


class TakeOverOnce:
    """Scores; on its second batch, a second writer takes the output over. What the output held
    right after the second writer's start-up is left in ``tmp_path/after_takeover.json``."""

    def __init__(self, tmp_path: str):
        self.tmp_path, self.calls = Path(tmp_path), 0

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from airflow_provider_raybatch.pipeline.prepare import prepare
        from tests.support.leases import make_stale

        self.calls += 1
        snapshot = self.tmp_path / "after_takeover.json"
        if self.calls == 2 and not snapshot.exists():
            output = self.tmp_path / "out"
            # Once the first batch's range is committed, the run has nothing left to publish: it
            # meets the takeover as a vanished folder, on this batch's write.
            deadline = time.monotonic() + 60
            while commit_count(output) == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            make_stale(output / "_raybatch" / "lease")
            prepare(takeover_config(self.tmp_path, try_number=2)).release()
            snapshot.write_text(json.dumps(files_of(output)))
        return {"score": batch["features"].sum(axis=1)}
