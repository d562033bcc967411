"""Predictors used by the tests. Ray workers import them by path, as they would a user's module.

The first ones are written as in Ray Data's batch inference guide, unchanged.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch


# As in the guide: a torch model built in __init__, a dict of numpy arrays in and out.
class TorchPredictor:
    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        self.model.eval()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict:
        tensor = torch.as_tensor(batch["features"], dtype=torch.float32)
        with torch.inference_mode():
            return {"output": self.model(tensor).numpy()}


# As in the guide: a function UDF that takes extra keyword arguments (fn_kwargs).
def add_bias(batch: dict[str, np.ndarray], bias: float) -> dict[str, np.ndarray]:
    batch["biased"] = batch["features"].sum(axis=1) + bias
    return batch


# As in the guide's "CPU preprocessing then GPU model": a preprocessing function and a model class.
def normalize(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    features = batch["features"]
    batch["features"] = (features - features.mean(axis=1, keepdims=True)).astype(np.float32)
    return batch


class SumModel:
    def __init__(self, column: str = "features", output: str = "total"):
        self.column, self.output = column, output

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch[self.output] = batch[self.column].sum(axis=1)
        return batch


class Scale:
    """Second model of a chain: reads the first model's output."""

    def __init__(self, factor: float, column: str = "total"):
        self.factor, self.column = factor, column

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"scaled": batch[self.column] * self.factor}


def score(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"score": batch["features"].sum(axis=1)}


class ScoreWithSettings:
    """Scores as ``score`` does, whatever settings it is given (a model path, an engine's): for the
    tests of what an output records of its settings."""

    def __init__(self, **settings):
        self.settings = settings

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return score(batch)


class SlowScore:
    """Scores, sleeping per batch so that a test can kill the run part-way."""

    def __init__(self, delay_s: float = 0.3):
        self.delay_s = delay_s

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(self.delay_s)
        return {"score": batch["features"].sum(axis=1)}


class SlowWhileMarked:
    """Scores, sleeping ``delay_s`` per batch while the marker file exists: a run to fault part-way, whose retry (with
    the same settings, the marker gone) runs at full speed."""

    def __init__(self, marker: str, delay_s: float = 1.0):
        self.marker, self.delay_s = marker, delay_s

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if os.path.exists(self.marker):
            time.sleep(self.delay_s)
        return {"score": batch["features"].sum(axis=1)}


class CommittedSeen:
    """Scores after ``delay_s``, recording how many ranges of ``output`` were committed by then."""

    def __init__(self, output: str, delay_s: float = 1.0):
        self.output, self.delay_s = output, delay_s

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from tests.support.pipeline_runs import commit_count

        time.sleep(self.delay_s)
        committed = commit_count(self.output)
        return {"score": batch["features"].sum(axis=1), "committed": np.full(len(batch["id"]), committed)}


class WaitWhileMarked:
    """Scores once the marker file is gone: a run that holds its replicas until a test lets it go."""

    def __init__(self, marker: str):
        self.marker = marker

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        while os.path.exists(self.marker):
            time.sleep(0.1)
        return {"score": batch["features"].sum(axis=1)}


class FailWhileMarked:
    """Raises on rows with id >= fail_from_id while the marker file exists (a failing first try).

    With ``output``, it raises only once a range of that output is committed (within ``wait_s``),
    so that the failure finds committed ranges to resume after, however fast the stage runs. Once
    one replica has raised, the others raise at once: the run has failed, and a replica left
    waiting would hold its CPU for the next test.
    """

    def __init__(self, marker: str, fail_from_id: int, output: str | None = None, wait_s: float = 60):
        self.marker, self.fail_from_id, self.output = marker, fail_from_id, output
        self.wait_s = wait_s if output else 1

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if os.path.exists(self.marker) and batch["id"].max() >= self.fail_from_id:
            raised = self.marker + ".raised"
            deadline = time.monotonic() + self.wait_s
            while time.monotonic() < deadline and not self._committed() and not os.path.exists(raised):
                time.sleep(0.1)
            open(raised, "w").close()
            raise RuntimeError("injected failure")
        return {"score": batch["features"].sum(axis=1)}

    def _committed(self) -> bool:
        segments = os.path.join(self.output or "", "_raybatch", "segments")
        return self.output is not None and os.path.isdir(segments) and bool(os.listdir(segments))


class FailWhileAnotherRangeRuns:
    """Raises on the range holding id 0 once another range is being scored (``folder`` shows it,
    within 30 s), which takes ``busy_s``: a run that fails while a replica is busy."""

    def __init__(self, folder: str, busy_s: float = 3.0):
        self.folder, self.busy_s = folder, busy_s

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if batch["id"].min() == 0:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not os.listdir(self.folder):
                time.sleep(0.05)
            raise RuntimeError("injected failure")
        open(os.path.join(self.folder, str(batch["id"].min())), "w").close()
        time.sleep(self.busy_s)
        return {"score": batch["features"].sum(axis=1)}


class LoadMarker:
    """Writes a marker file when the model 'loads', to prove that checks ran before loading."""

    def __init__(self, marker: str):
        open(marker, "w").close()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"score": batch["features"].sum(axis=1)}


def drop_one_row(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"score": batch["features"].sum(axis=1)[1:]}


NOT_CALLABLE = 42


def node_id(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The Ray node each row was scored on."""
    import ray

    return {"node_id": np.array([ray.get_runtime_context().get_node_id()] * len(batch["id"]))}


class WhereScored:
    """The process that scored each row, the task's mark in its environment, and whether the
    replica's warm imports were there before it was built (a warm worker imported them ahead)."""

    warm_imports = ("tests.support.warm_import",)

    def __init__(self):
        import sys

        self.preloaded = "tests.support.warm_import" in sys.modules

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = len(batch["id"])
        return {
            "pid": np.full(rows, os.getpid()),
            "mark": np.array([os.environ.get("RAYBATCH_TEST_MARK", "")] * rows),
            "preloaded": np.full(rows, self.preloaded),
        }


class RejectSome:
    """Rejects ids divisible by ``invalid_every`` as invalid input and ids in ``error_ids`` as engine errors."""

    def __init__(self, invalid_every: int = 0, error_ids: tuple[int, ...] = ()):
        self.invalid_every, self.error_ids = invalid_every, set(error_ids)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict:
        reasons, kinds = [], []
        for i in batch["id"].tolist():
            if self.invalid_every and i % self.invalid_every == 0:
                reasons.append(f"id {i} is invalid")
                kinds.append("invalid_input")
            elif i in self.error_ids:
                reasons.append(f"model failed on id {i}")
                kinds.append("engine_error")
            else:
                reasons.append(None)
                kinds.append(None)
        return {
            "score": batch["features"].sum(axis=1),
            "__raybatch_reject": reasons,
            "__raybatch_reject_kind": kinds,
        }


def _double(table):
    import pyarrow.compute as pc

    return table.append_column("doubled", pc.multiply(table["score"], 2))


def doubling_transform(stage):
    """A dataset transform (as a ray.data.llm processor is): adds ``doubled``, keeps every column."""
    return lambda ds: ds.map_batches(_double, batch_format="pyarrow", batch_size=stage.batch_size)


def dropping_transform(stage):
    """A transform that forgets to carry the internal columns."""
    return lambda ds: ds.select_columns(["score"])


class IntegerScoreFor:
    """Scores as float32, except the batch holding ``drift_id``: int64 (a model whose output type drifts)."""

    def __init__(self, drift_id: int):
        self.drift_id = drift_id

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        total = batch["features"].sum(axis=1)
        if self.drift_id in batch["id"]:
            return {"score": total.round().astype(np.int64)}
        return {"score": total.astype(np.float32)}


class ThreadsSeen:
    """The process that scored each row, and the threads its torch and Arrow use there."""

    warm_imports = ("torch",)  # a warm worker imports torch before Ray says the replica's CPUs

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import pyarrow as pa

        rows = len(batch["id"])
        return {
            "pid": np.full(rows, os.getpid()),
            "torch_threads": np.full(rows, torch.get_num_threads()),
            "arrow_threads": np.full(rows, pa.cpu_count()),
        }


class CountTokens:
    """A model that passes its batch on and reports what each row cost: ``id % 7 + 1`` prompt tokens and ``out`` generated
    tokens, none counted for ids divisible by ``uncounted_every``; ``error_ids`` are rejected as
    engine errors (their tokens still counted: they were spent)."""

    def __init__(self, out: int = 2, uncounted_every: int = 0, error_ids: tuple[int, ...] = ()):
        self.out, self.uncounted_every, self.error_ids = out, uncounted_every, set(error_ids)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict:
        ids = batch["id"].tolist()
        counted = [not (self.uncounted_every and i % self.uncounted_every == 0) for i in ids]
        return {
            **batch,  # a later stage reads the same columns
            f"score_{self.out}": batch["features"].sum(axis=1),
            "__raybatch_tokens_in": [i % 7 + 1 if c else None for i, c in zip(ids, counted, strict=True)],
            "__raybatch_tokens_out": [self.out if c else None for c in counted],
            "__raybatch_reject": [f"model failed on id {i}" if i in self.error_ids else None for i in ids],
        }
