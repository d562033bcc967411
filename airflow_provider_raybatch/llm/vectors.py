"""What every embedding engine's stage returns for a batch (:func:`embedding_output`): the same
columns, normalised, stored and counted the same way whichever engine computed the vectors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.llm.config import TOKEN_OUTPUT_COLUMNS, EmbeddingTask
from airflow_provider_raybatch.pipeline.columns import (
    INVALID_INPUT,
    REJECT_COLUMN,
    REJECT_KIND_COLUMN,
    TOKENS_IN_COLUMN,
    TRUNCATED_COLUMN,
)

if TYPE_CHECKING:
    import numpy as np


def embedding_output(
    task: EmbeddingTask,
    vectors: np.ndarray,
    tokens: list[int | None],
    truncated: list[bool | None],
    reasons: list[str | None],
) -> dict[str, Any]:
    """An embedding stage's result for a batch: the vectors (normalised and stored as the task says),
    the rows' input tokens, whether each was truncated, and the rows rejected as invalid input.

    :param vectors: ``(rows, dimension)`` floats; a rejected row's are ignored.
    :param tokens: each row's input tokens as the model saw them (after truncation; None: not counted).
    :param truncated: whether each row's text was cut to the model's maximum length (None: not
        known; an image). Counted for the summary whether or not the task writes its ``truncated_column``.
    :param reasons: why each row was rejected (its text or image is missing or unreadable), None for the rows
        embedded.
    """
    import numpy as np

    vectors = np.asarray(vectors, dtype=np.float32)
    if task.normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.where(norms > 0, norms, 1.0)  # a zero vector stays zero, not NaN
    out: dict[str, Any] = {
        task.output_column: vectors.astype(task.dtype),
        REJECT_COLUMN: reasons,
        REJECT_KIND_COLUMN: [INVALID_INPUT if r else None for r in reasons],
        TOKENS_IN_COLUMN: tokens,  # and no generated tokens: an embedding generates nothing
        TRUNCATED_COLUMN: [None if t is None else int(t) for t in truncated],
    }
    if task.truncated_column and task.image_column is None:  # an image is never cut
        out[task.truncated_column] = truncated
    if task.token_columns:
        out[TOKEN_OUTPUT_COLUMNS[0]] = tokens
    return out
