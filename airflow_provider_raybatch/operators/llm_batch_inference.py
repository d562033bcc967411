"""Text LLM batch inference over Parquet: chat prompts built from row columns, answers written as a column."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_raybatch.llm.config import ChatTask
from airflow_provider_raybatch.operators.chat import ChatOperator
from airflow_provider_raybatch.operators.rendered import as_kind


class LLMBatchInferenceOperator(ChatOperator):
    """Ask a chat model about every row of a Parquet input, on Ray Data; write the answers as Parquet.

    Each row becomes chat messages (``system_prompt``, then ``prompt`` with ``{column}`` fields
    filled from the row); the answer goes to ``output_column`` beside ``keep_columns``. The model,
    engine, prompts, resources and connection are the parameters of
    :class:`~airflow_provider_raybatch.operators.chat.ChatOperator`; paths, checkpointing and
    ``max_error_fraction`` those of
    :class:`~airflow_provider_raybatch.operators.ray_pipeline.RayPipelineOperator`.

    :param choices: constrain every answer to exactly one of these strings: vLLM structured
        outputs, a JSON-schema enum for ``openai``, log-likelihood scoring of each choice for
        ``transformers`` (templated).
    """

    template_fields: Sequence[str] = (*ChatOperator.template_fields, "choices")
    ui_color = "#e8dcf7"

    def __init__(self, *, choices: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.choices = choices

    def chat_task(self) -> ChatTask:
        task = super().chat_task()
        if self.choices not in (None, "", "None"):
            task.choices = as_kind(self.choices, list, "choices")
        return task
