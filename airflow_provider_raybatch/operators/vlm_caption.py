"""Image captioning over Parquet with a vision-language model, as in Ray's multimodal batch inference guide."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_raybatch.llm.config import ChatTask
from airflow_provider_raybatch.operators.chat import ChatOperator

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant that generates accurate and descriptive captions for images."
DEFAULT_PROMPT = "Describe this image in detail. Focus on the main subjects, actions, and setting."


class VLMCaptionOperator(ChatOperator):
    """Caption every image of a Parquet input with a VLM on Ray Data; write the captions as Parquet.

    A CPU stage first decodes, checks and resizes each image: invalid ones (corrupt bytes,
    unreadable files, missing values) never reach the model; they are written with their row key
    and the reason to ``<output_path>/_rejects/`` and counted in the summary (``rows_rejected``).
    Valid images go to the engine as chat messages (``system_prompt``, then the image and
    ``prompt``). The model, engine, resources and connection are the parameters of
    :class:`~airflow_provider_raybatch.operators.chat.ChatOperator`; paths, checkpointing and
    ``max_error_fraction`` those of
    :class:`~airflow_provider_raybatch.operators.ray_pipeline.RayPipelineOperator`.

    :param image_column: the column holding each image: encoded bytes (JPEG, PNG...), a
        ``{"bytes", "path"}`` struct as Hugging Face datasets write, or a path / URL string
        (local, ``http(s)://``, ``s3://`` with the environment's credentials) (templated).
    :param image_size: ``(width, height)`` each image is resized to before the model; None keeps
        the size.
    :param system_prompt: the system message (templated).
    :param prompt: the user message beside the image (templated).
    :param output_column: the column holding the captions (templated).
    :param keep_columns: input columns copied to the output; default none besides the row key
        (``id_column`` or ``_row_id``), so image bytes are not copied unless listed (templated).
    """

    template_fields: Sequence[str] = (*ChatOperator.template_fields, "image_column")
    ui_color = "#e8dcf7"

    def __init__(
        self,
        *,
        image_column: str = "image",
        image_size: tuple[int, int] | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        prompt: str = DEFAULT_PROMPT,
        output_column: str = "generated_caption",
        keep_columns: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            system_prompt=system_prompt,
            prompt=prompt,
            output_column=output_column,
            keep_columns=[] if keep_columns is None else keep_columns,
            **kwargs,
        )
        self.image_column = image_column
        self.image_size = image_size

    def chat_task(self) -> ChatTask:
        task = super().chat_task()
        task.image_column = self.image_column
        task.image_size = tuple(self.image_size) if self.image_size else None
        return task
