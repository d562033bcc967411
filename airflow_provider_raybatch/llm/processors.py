"""What every ``ray.data.llm`` engine shares: a processor applied as a dataset transform.

:func:`processor_transform` builds the transform of a
:class:`~airflow_provider_raybatch.llm.engines.base.ProcessorEngine`'s stage, on the driver
(its factory, the stage's predictor, calls it). Around Ray's processor:

- :class:`ChatRequest` (the processor's preprocess) builds the same chat messages for every
  engine, and the engine shapes them into its request; a row an earlier stage rejected gets
  ``__inference_error__`` set instead, which makes every ``ray.data.llm`` stage pass it by
  untouched.
- :class:`ChatAnswer` (its postprocess, which returns only what it returns) carries the
  ``__raybatch_`` columns through explicitly, turns a failed or out-of-choices answer (read
  by the engine) into a reject, and records the tokens the row cost (as the engine counts them).
- :func:`finish_row` runs after the processor: rows that bypassed postprocess (pre-rejected rows,
  and engine failures under ``should_continue_on_error``) come out with every column of the
  processor's row; it keeps the internal columns, records the engine error, and gives every row
  the same columns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.llm.config import (
    PREPARED_IMAGE_COLUMN,
    TOKEN_OUTPUT_COLUMNS,
    ChatTask,
    EmbeddingTask,
    EngineConfig,
)
from airflow_provider_raybatch.llm.engines.openai import OpenAIEngine
from airflow_provider_raybatch.llm.engines.vllm import VLLMEngine
from airflow_provider_raybatch.llm.engines.vllm_embedding import VLLMEmbeddingEngine
from airflow_provider_raybatch.llm.prompts import chat_messages
from airflow_provider_raybatch.llm.vectors import embedding_output
from airflow_provider_raybatch.pipeline.columns import (
    ENGINE_ERROR,
    INTERNAL_PREFIX,
    INVALID_INPUT,
    REJECT_COLUMN,
    REJECT_KIND_COLUMN,
    TOKEN_COLUMNS,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_provider_raybatch.llm.engines.base import ProcessorEngine
    from airflow_provider_raybatch.pipeline.config import Stage
    from airflow_provider_raybatch.pipeline.resources import ReplicaResources

#: ray.data.llm's per-row error column: rows where it is not ``""`` skip every stage and postprocess. A
#: preprocess that sets it for some rows sets it to ``""`` for the others: a block's rows share their
#: columns, and a missing value (null) counts as an error.
INFERENCE_ERROR = "__inference_error__"
SKIPPED = "rejected by an earlier stage"
#: An embedding's vector (float32 bytes), input tokens and truncation between its postprocess and
#: :func:`finish_embeddings`.
VECTOR_KEY, TOKENS_KEY, TRUNCATED_KEY = "raybatch_vector", "raybatch_tokens", "raybatch_truncated"


class ChatRequest:
    """Preprocess of the processor: one row in, the engine's request fields out."""

    def __init__(self, task: ChatTask, config: EngineConfig, engine: ProcessorEngine):
        self.task, self.config, self.engine = task, config, engine

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if row.get(REJECT_COLUMN):
            return {INFERENCE_ERROR: SKIPPED}
        image = row.get(PREPARED_IMAGE_COLUMN) if self.task.image_column else None
        return {
            **self.engine.request(self.task, self.config, chat_messages(self.task, row, image)),
            INFERENCE_ERROR: "",
        }


class ChatAnswer:
    """Postprocess of the processor: the answer (or a reject), the tokens it cost, and the internal columns."""

    def __init__(self, task: ChatTask, config: EngineConfig, engine: ProcessorEngine):
        self.task, self.config, self.engine = task, config, engine

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in row.items() if k.startswith(INTERNAL_PREFIX)}
        answer, error = self.engine.answer(self.task, self.config, row)
        if error is None and self.task.choices is not None and answer not in self.task.choices:
            error = f"the answer {str(answer)[:200]!r} is not one of the choices"
        out[self.task.output_column] = None if error else answer
        out[REJECT_COLUMN] = error
        out[REJECT_KIND_COLUMN] = ENGINE_ERROR if error else None
        for name, count in zip(TOKEN_COLUMNS, self.engine.tokens(row), strict=True):
            if count is not None:  # added to an earlier stage's count of the row, if any
                out[name] = (out.get(name) or 0) + int(count)
        return out


def finish_row(row: dict[str, Any], output_column: str, token_columns: bool = False) -> dict[str, Any]:
    """After the processor: the same columns for every row, engine failures as rejects, and the
    row's token counts as output columns when the task asks for them."""
    out = {k: v for k, v in row.items() if k.startswith(INTERNAL_PREFIX)}
    error = row.get(INFERENCE_ERROR) or None
    if not out.get(REJECT_COLUMN) and error:
        out[REJECT_COLUMN], out[REJECT_KIND_COLUMN] = str(error), ENGINE_ERROR
    for name in (REJECT_COLUMN, REJECT_KIND_COLUMN, *TOKEN_COLUMNS):
        out.setdefault(name, None)
    out[output_column] = None if out[REJECT_COLUMN] else row.get(output_column)
    if token_columns:
        for name, internal in zip(TOKEN_OUTPUT_COLUMNS, TOKEN_COLUMNS, strict=True):
            out[name] = out[internal]
    return out


class ChatTransform:
    """``ds -> ds``: the processor, then :func:`finish_row`.

    :param token_columns: :func:`finish_row`'s (the task's ``token_columns``).
    :param map_kwargs: Ray Data ``map`` arguments of :func:`finish_row` (its resources).
    """

    def __init__(
        self,
        processor: Callable[[Any], Any],
        output_column: str,
        token_columns: bool = False,
        map_kwargs: dict[str, Any] | None = None,
    ):
        self.processor, self.map_kwargs = processor, map_kwargs or {}
        self.fn_kwargs = {"output_column": output_column, "token_columns": token_columns}

    def __call__(self, ds):
        return self.processor(ds).map(finish_row, fn_kwargs=self.fn_kwargs, **self.map_kwargs)


def processor_transform(engine: ProcessorEngine, stage: Stage) -> ChatTransform:
    """The transform of a chat engine's stage: checks first (the engine's preflight), then its processor."""
    task = ChatTask.from_dict(stage.predictor_kwargs["task"])
    config = EngineConfig(**stage.predictor_kwargs["engine"])
    engine.preflight(config, stage)
    processor, map_kwargs = build_engine_processor(
        engine,
        stage,
        engine.processor_config(task, config, stage),
        ChatRequest(task, config, engine),
        ChatAnswer(task, config, engine),
    )
    return ChatTransform(processor, task.output_column, task.token_columns, map_kwargs)


def build_engine_processor(
    engine: ProcessorEngine, stage: Stage, processor_config: Any, preprocess: Any, postprocess: Any
) -> tuple[Any, dict[str, Any]]:
    """The engine's ``ray.data.llm`` processor (its row mappings given the engine's ``map_kwargs``,
    its engine stage the replicas' reservations), and those ``map_kwargs``."""
    from ray.data.llm import build_processor

    map_kwargs = engine.map_kwargs(stage)
    processor = build_processor(
        processor_config,
        preprocess=preprocess,
        postprocess=postprocess,
        preprocess_map_kwargs=map_kwargs,
        postprocess_map_kwargs=map_kwargs,
    )
    reserve(processor, engine, stage)
    return processor, map_kwargs


def reserve(processor: Any, engine: ProcessorEngine, resources: ReplicaResources) -> None:
    """Have the processor's engine stage reserve the replicas' ``memory`` and custom ``resources``
    (Ray's processor configs take neither)."""
    reserved = {"memory": resources.memory, "resources": resources.resources}
    processor.get_stage_by_name(engine.engine_stage).map_batches_kwargs.update({k: v for k, v in reserved.items() if v})


class EmbeddingRequest:
    """Preprocess of an embedding engine's processor: the engine's request for the row's text; a
    row without text, or rejected earlier, skips the processor (its reject kept)."""

    def __init__(self, task: EmbeddingTask, config: EngineConfig, engine: VLLMEmbeddingEngine):
        self.task, self.config, self.engine = task, config, engine

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if row.get(REJECT_COLUMN):
            return {INFERENCE_ERROR: SKIPPED}
        text = row.get(self.task.text_column)
        if text is None:
            reason = f"{self.task.text_column} is null"
            return {REJECT_COLUMN: reason, REJECT_KIND_COLUMN: INVALID_INPUT, INFERENCE_ERROR: reason}
        return {**self.engine.embedding_request(self.config, self.task.prefix + str(text)), INFERENCE_ERROR: ""}


class EmbeddingAnswer:
    """Postprocess of an embedding engine's processor: the row's vector, tokens and truncation
    (as the engine reads them), and the internal columns."""

    def __init__(self, engine: VLLMEmbeddingEngine):
        self.engine = engine

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        out = {k: v for k, v in row.items() if k.startswith(INTERNAL_PREFIX)}
        vector, tokens, truncated = self.engine.embedding_answer(row)
        out[VECTOR_KEY] = np.asarray(vector, dtype=np.float32).tobytes()
        out[TOKENS_KEY], out[TRUNCATED_KEY] = tokens, truncated
        return out


def finish_embeddings(batch: pa.Table, task: dict[str, Any], dimension: int) -> pa.Table:
    """After an embedding processor: the internal columns, and what
    :func:`~airflow_provider_raybatch.llm.vectors.embedding_output` makes of the vectors; an
    engine failure becomes the row's reject, a reject made before (a null text) keeps its kind.

    :param dimension: the vectors' dimension, for a batch in which no row was embedded.
    """
    import numpy as np
    import pyarrow as pa

    from airflow_provider_raybatch.pipeline.execution.tensors import output_to_table

    embedding = EmbeddingTask.from_dict(task)
    rows = batch.num_rows

    def column(name: str) -> list[Any]:
        return batch.column(name).to_pylist() if name in batch.column_names else [None] * rows

    earlier, kinds, errors = column(REJECT_COLUMN), column(REJECT_KIND_COLUMN), column(INFERENCE_ERROR)
    reasons = [reason or (str(error) if error else None) for reason, error in zip(earlier, errors, strict=True)]
    vectors = [None if r else np.frombuffer(v, np.float32) for r, v in zip(reasons, column(VECTOR_KEY), strict=True)]
    dimension = next((len(v) for v in vectors if v is not None), dimension)
    # A rejected row's vector is never written (the row goes to the rejects): zeros keep the shape.
    matrix = np.stack([np.zeros(dimension, np.float32) if v is None else v for v in vectors]) if rows else None
    out = embedding_output(
        embedding,
        np.zeros((0, dimension), np.float32) if matrix is None else matrix,
        [None if r else t for r, t in zip(reasons, column(TOKENS_KEY), strict=True)],
        [None if r else t for r, t in zip(reasons, column(TRUNCATED_KEY), strict=True)],
        reasons,
    )
    out[REJECT_KIND_COLUMN] = [
        kind if before else (ENGINE_ERROR if reason else None)
        for before, kind, reason in zip(earlier, kinds, reasons, strict=True)
    ]
    table = output_to_table(out, "vllm", rows)
    carried = [n for n in batch.column_names if n.startswith(INTERNAL_PREFIX) and n not in table.column_names]
    return pa.table({**{n: batch.column(n) for n in carried}, **{n: table.column(n) for n in table.column_names}})


class EmbeddingTransform:
    """``ds -> ds``: the embedding processor, then :func:`finish_embeddings`.

    :param map_kwargs: Ray Data ``map_batches`` arguments of :func:`finish_embeddings` (its resources).
    """

    def __init__(
        self, processor: Callable[[Any], Any], task: EmbeddingTask, dimension: int, map_kwargs: dict[str, Any]
    ):
        self.processor, self.map_kwargs = processor, map_kwargs
        self.fn_kwargs = {"task": task.to_dict(), "dimension": dimension}

    def __call__(self, ds):
        return self.processor(ds).map_batches(
            finish_embeddings, batch_format="pyarrow", fn_kwargs=self.fn_kwargs, **self.map_kwargs
        )


def embedding_transform(engine: VLLMEmbeddingEngine, stage: Stage) -> EmbeddingTransform:
    """The transform of an embedding engine's stage: the engine's preflight, its settings settled
    on the driver (:meth:`~airflow_provider_raybatch.llm.engines.vllm_embedding.VLLMEmbeddingEngine.settled`),
    then its processor."""
    task = EmbeddingTask.from_dict(stage.predictor_kwargs["task"])
    config = EngineConfig(**stage.predictor_kwargs["engine"])
    engine.preflight(config, stage)
    config, dimension = engine.settled(config)
    processor, map_kwargs = build_engine_processor(
        engine,
        stage,
        engine.processor_config(task, config, stage),
        EmbeddingRequest(task, config, engine),
        EmbeddingAnswer(engine),
    )
    return EmbeddingTransform(processor, task, dimension, map_kwargs)


# The built-in engines' factories live here, not beside their classes: outputs record these
# import paths in their job signature, so moving them would make those outputs refuse to resume.
def build_vllm_transform(stage: Stage) -> ChatTransform:
    """Transform-stage factory of :class:`~airflow_provider_raybatch.llm.engines.vllm.VLLMEngine`."""
    return processor_transform(VLLMEngine(), stage)


def build_openai_transform(stage: Stage) -> ChatTransform:
    """Transform-stage factory of :class:`~airflow_provider_raybatch.llm.engines.openai.OpenAIEngine`."""
    return processor_transform(OpenAIEngine(), stage)


def build_vllm_embedding_transform(stage: Stage) -> EmbeddingTransform:
    """Transform-stage factory of :class:`~airflow_provider_raybatch.llm.engines.vllm_embedding.VLLMEmbeddingEngine`."""
    return embedding_transform(VLLMEmbeddingEngine(), stage)
