"""Chat messages from rows: one recipe for every engine (OpenAI-style content parts)."""

from __future__ import annotations

import base64
from typing import Any

from airflow_provider_raybatch.llm.config import ChatTask


class _Row(dict):
    def __missing__(self, key: str) -> Any:
        raise ValueError(f"the prompt refers to column {key!r}, which the row does not have")


def render(template: str, row: dict[str, Any]) -> str:
    """Fill ``{column}`` fields from the row (``None`` renders as an empty string)."""
    return template.format_map(_Row({k: "" if v is None else v for k, v in row.items()}))


def image_data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def chat_messages(task: ChatTask, row: dict[str, Any], image: bytes | None = None) -> list[dict[str, Any]]:
    """OpenAI chat messages for one row; the image, if any, as a base64 data URL before the text.

    vLLM's multimodal stage and any OpenAI-compatible endpoint read this form as it is.
    """
    messages: list[dict[str, Any]] = []
    if task.system_prompt:
        messages.append({"role": "system", "content": render(task.system_prompt, row)})
    text = render(task.prompt, row)
    if image is None:
        messages.append({"role": "user", "content": text})
    else:
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image_data_url(image)}},
                    {"type": "text", "text": text},
                ],
            }
        )
    return messages


def hf_messages(task: ChatTask, row: dict[str, Any], with_image: bool) -> list[dict[str, Any]]:
    """The same messages for a Hugging Face chat template: the image is a placeholder part."""
    messages: list[dict[str, Any]] = []
    if task.system_prompt:
        messages.append({"role": "system", "content": render(task.system_prompt, row)})
    text = render(task.prompt, row)
    if with_image:
        messages.append({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]})
    else:
        messages.append({"role": "user", "content": text})
    return messages
