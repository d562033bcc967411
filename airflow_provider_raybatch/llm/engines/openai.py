"""The ``openai`` engine: any OpenAI-compatible ``/chat/completions`` endpoint, through Ray's
``HttpRequestProcessorConfig`` (CPU only).

The API key goes into a header of the HTTP stage's actors only: never into the stage's spec, the
output's bookkeeping or a log line. The stage names the environment variable holding it
(``api_key_env``), read on the driver when the processor is built.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.llm.engines.base import ProcessorEngine, register

if TYPE_CHECKING:
    from airflow_provider_raybatch.llm.config import ChatTask, EngineConfig
    from airflow_provider_raybatch.pipeline.resources import ReplicaResources

#: OpenAI sampling fields taken from vLLM-style sampling_params as they are.
OPENAI_SAMPLING = ("temperature", "top_p", "max_tokens", "seed", "stop", "presence_penalty", "frequency_penalty", "n")


@register
class OpenAIEngine(ProcessorEngine):
    """An OpenAI-compatible endpoint; ``engine_kwargs``: ``max_retries``, ``qps``, ``retry_wait_s``."""

    name = "openai"
    # The factory stays where outputs planned before engine classes recorded it (their job signature).
    predictor = "airflow_provider_raybatch.llm.processors:build_openai_transform"
    engine_stage = "HttpRequestStage"
    needs_endpoint = True

    def processor_config(self, task: ChatTask, config: EngineConfig, resources: ReplicaResources) -> Any:
        """The ``HttpRequestProcessorConfig`` for ``{base_url}/chat/completions``, the key read from
        ``api_key_env`` here, on the driver (set by the operator for an embedded Ray, by the
        cluster's environment otherwise)."""
        from ray.data.llm import HttpRequestProcessorConfig

        api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
        kwargs = config.engine_kwargs
        return HttpRequestProcessorConfig(
            url=config.base_url.rstrip("/") + "/chat/completions",
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
            batch_size=resources.batch_size,
            concurrency=resources.concurrency,
            qps=kwargs.get("qps"),
            max_retries=int(kwargs.get("max_retries", 3)),
            base_retry_wait_time_in_s=float(kwargs.get("retry_wait_s", 1.0)),
            http_request_stage={"num_cpus": resources.num_cpus},
        )

    def request(self, task: ChatTask, config: EngineConfig, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {"payload": payload(task, config.model, messages)}

    def answer(self, task: ChatTask, config: EngineConfig, row: dict[str, Any]) -> tuple[str | None, str | None]:
        return parse_response(row.get("http_response"), task)

    def tokens(self, row: dict[str, Any]) -> tuple[int | None, int | None]:
        """The response's ``usage`` (an endpoint that reports none: not counted)."""
        response = row.get("http_response")
        usage = response.get("usage") if isinstance(response, dict) else None
        if not isinstance(usage, dict):
            return None, None
        counts = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
        return tuple(int(c) if isinstance(c, int) and not isinstance(c, bool) else None for c in counts)


def payload(task: ChatTask, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``/chat/completions`` request body. ``choices`` become a JSON schema with an enum, which
    OpenAI and vLLM's server both enforce; the answer is still checked against the choices."""
    body: dict[str, Any] = {"model": model, "messages": messages}
    body.update({k: v for k, v in task.sampling_params.items() if k in OPENAI_SAMPLING})
    if task.choices:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": "choice",
                "strict": True,
                "schema": {
                    "type": "object",
                    "properties": {"answer": {"type": "string", "enum": list(task.choices)}},
                    "required": ["answer"],
                    "additionalProperties": False,
                },
            },
        }
    return body


def parse_response(response: Any, task: ChatTask) -> tuple[str | None, str | None]:
    """(answer, None) or (None, error) from a ``/chat/completions`` response body."""
    if not isinstance(response, dict):
        return None, f"the endpoint returned {type(response).__name__}, not a JSON object"
    if response.get("error"):
        error = response["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        return None, f"the endpoint returned an error: {message}"
    try:
        content = response["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None, f"the endpoint's response has no choices[0].message.content (keys: {sorted(response)})"
    if content is None:
        return None, "the endpoint returned no content"
    if task.choices:
        try:
            content = json.loads(content)["answer"]
        except (ValueError, KeyError, TypeError):
            return None, f"the answer is not JSON with an 'answer' field: {str(content)[:200]!r}"
    return content, None
