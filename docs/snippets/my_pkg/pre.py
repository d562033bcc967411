"""A preprocessing stage: a plain function, called with each batch and its stage's ``predictor_kwargs``."""

from __future__ import annotations

import numpy as np


# [START normalize]
def normalize(batch: dict[str, np.ndarray], column: str) -> dict[str, np.ndarray]:
    """Scale each row of ``column`` to unit length; the next stage receives the returned columns."""
    values = batch[column].astype(np.float32)
    norms = np.linalg.norm(values, axis=1, keepdims=True)
    return {column: values / np.maximum(norms, 1e-12)}


# [END normalize]
