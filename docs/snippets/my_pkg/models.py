"""Predictors as Ray Data's batch inference guide has them: a class built once per replica, or a function."""

from __future__ import annotations

import numpy as np


# [START class]
class Predictor:
    """Built once per replica with ``predictor_kwargs``; called with each batch."""

    def __init__(self, model_path: str):
        # Load the model once per replica, not once per batch. (fsspec.open(model_path) reads
        # s3:// and other stores as well; a local path keeps this example short.)
        self.weights = np.load(model_path)  # a (features, classes) matrix

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # A fixed-size list column arrives as a 2-d array: one row per input row.
        scores = batch["features"] @ self.weights
        # One value per input row in every returned column; kept columns are added by the operator.
        return {"label": scores.argmax(axis=1), "score": scores.max(axis=1)}


# [END class]


# [START embedder]
class Embedder:
    """A second model stage: receives what the previous stage returned."""

    def __init__(self, model_path: str, device: str = "cpu"):
        self.projection = np.load(model_path)
        self.device = device  # where a real model would be moved (e.g. "cuda" with num_gpus=1)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # An N-d output is written as a fixed-size list column (plain Parquet).
        return {"embedding": (batch["features"] @ self.projection).astype(np.float32)}


# [END embedder]


# [START rejects]
def score_or_reject(batch: dict[str, np.ndarray], limit: float) -> dict[str, np.ndarray]:
    """A function predictor that rejects some rows instead of failing its batch."""
    total = batch["features"].sum(axis=1)
    too_large = np.abs(total) > limit
    return {
        "score": np.where(too_large, np.nan, total),
        # A reason per rejected row, None for the rows accepted; rejected rows go to _rejects/.
        "__raybatch_reject": np.where(too_large, f"feature sum beyond {limit}", None),
        # Optional: "engine_error" (the default, counted against max_error_fraction) or "invalid_input".
        "__raybatch_reject_kind": np.full(len(total), "engine_error", dtype=object),
    }


# [END rejects]
