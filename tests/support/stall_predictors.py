"""Predictors of the watchdog tests: numpy only, so that replicas start in about a second.

The watchdog counts a stage's start-up as time without progress; importing torch (as
``tests.support.predictors`` does) takes seconds per replica, more on a loaded machine.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa


class HangOnce:
    """Scores, but hangs on the batch holding ``hang_id`` while ``marker`` exists: a model call that never returns.

    The hung call removes the marker (so the next try runs through), writes its process id to
    ``marker + ".pid"`` and sleeps ``hang_s``: long past any watchdog under test, yet bounded, so
    that a test whose watchdog fails to act ends (and fails) instead of hanging.
    """

    def __init__(self, marker: str, hang_id: int, hang_s: float = 300.0):
        self.marker, self.hang_id, self.hang_s = marker, hang_id, hang_s

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.hang_id in batch["id"] and os.path.exists(self.marker):
            os.remove(self.marker)
            with open(self.marker + ".pid", "w") as f:
                f.write(str(os.getpid()))
            deadline = time.monotonic() + self.hang_s
            while time.monotonic() < deadline:
                time.sleep(0.2)
        return {"score": batch["features"].sum(axis=1)}


def double(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"doubled": batch["score"] * 2}


def _score_or_hang(table, marker: str, hang_id: int):
    HangOnce(marker, hang_id)({"id": table.column("id").to_numpy(), "features": np.zeros((table.num_rows, 1))})
    features = table.column("features").combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)
    return table.append_column("score", pa.array(features.sum(axis=1)))


def hanging_transform(stage):
    """A dataset transform (as a ``ray.data.llm`` processor is) whose step hangs as :class:`HangOnce` does."""
    from functools import partial

    step = partial(_score_or_hang, **stage.predictor_kwargs)
    return lambda ds: ds.map_batches(step, batch_format="pyarrow", batch_size=stage.batch_size, num_cpus=0.5)
