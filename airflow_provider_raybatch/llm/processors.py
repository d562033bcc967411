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

from airflow_provider_raybatch.llm.config import PREPARED_IMAGE_COLUMN, TOKEN_OUTPUT_COLUMNS, ChatTask, EngineConfig
from airflow_provider_raybatch.llm.engines.openai import OpenAIEngine
from airflow_provider_raybatch.llm.engines.vllm import VLLMEngine
from airflow_provider_raybatch.llm.prompts import chat_messages
from airflow_provider_raybatch.pipeline.columns import (
    ENGINE_ERROR,
    INTERNAL_PREFIX,
    REJECT_COLUMN,
    REJECT_KIND_COLUMN,
    TOKEN_COLUMNS,
)

if TYPE_CHECKING:
    from airflow_provider_raybatch.llm.engines.base import ProcessorEngine
    from airflow_provider_raybatch.pipeline.config import Stage
    from airflow_provider_raybatch.pipeline.resources import ReplicaResources

#: ray.data.llm's per-row error column: rows where it is non-empty skip every stage and postprocess.
INFERENCE_ERROR = "__inference_error__"
SKIPPED = "rejected by an earlier stage"


class ChatRequest:
    """Preprocess of the processor: one row in, the engine's request fields out."""

    def __init__(self, task: ChatTask, config: EngineConfig, engine: ProcessorEngine):
        self.task, self.config, self.engine = task, config, engine

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if row.get(REJECT_COLUMN):
            return {INFERENCE_ERROR: SKIPPED}
        image = row.get(PREPARED_IMAGE_COLUMN) if self.task.image_column else None
        return self.engine.request(self.task, self.config, chat_messages(self.task, row, image))


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
    """The transform of an engine's stage: checks first (the engine's preflight), then its processor."""
    from ray.data.llm import build_processor

    task = ChatTask.from_dict(stage.predictor_kwargs["task"])
    config = EngineConfig(**stage.predictor_kwargs["engine"])
    engine.preflight(config, stage)
    map_kwargs = engine.map_kwargs(stage)
    processor = build_processor(
        engine.processor_config(task, config, stage),
        preprocess=ChatRequest(task, config, engine),
        postprocess=ChatAnswer(task, config, engine),
        preprocess_map_kwargs=map_kwargs,
        postprocess_map_kwargs=map_kwargs,
    )
    reserve(processor, engine, stage)
    return ChatTransform(processor, task.output_column, task.token_columns, map_kwargs)


def reserve(processor: Any, engine: ProcessorEngine, resources: ReplicaResources) -> None:
    """Have the processor's engine stage reserve the replicas' ``memory`` and custom ``resources``
    (Ray's processor configs take neither)."""
    reserved = {"memory": resources.memory, "resources": resources.resources}
    processor.get_stage_by_name(engine.engine_stage).map_batches_kwargs.update({k: v for k, v in reserved.items() if v})


# The built-in engines' factories live here, not beside their classes: outputs record these
# import paths in their job signature, so moving them would make those outputs refuse to resume.
def build_vllm_transform(stage: Stage) -> ChatTransform:
    """Transform-stage factory of :class:`~airflow_provider_raybatch.llm.engines.vllm.VLLMEngine`."""
    return processor_transform(VLLMEngine(), stage)


def build_openai_transform(stage: Stage) -> ChatTransform:
    """Transform-stage factory of :class:`~airflow_provider_raybatch.llm.engines.openai.OpenAIEngine`."""
    return processor_transform(OpenAIEngine(), stage)
