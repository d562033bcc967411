"""The ``vllm`` and ``openai`` engines: ``ray.data.llm`` processors, applied as dataset transforms.

Each factory (``build_vllm_transform``, ``build_openai_transform``) is the ``predictor`` of a
transform :class:`~airflow_provider_raybatch.pipeline.config.Stage`: the runner calls it once on
the driver and applies what it returns to the dataset. Around Ray's processor:

- :class:`ChatRequest` (the processor's preprocess) builds the same chat messages for every
  engine; a row an earlier stage rejected gets ``__inference_error__`` set instead, which makes
  every ``ray.data.llm`` stage pass it by untouched.
- :class:`ChatAnswer` (its postprocess, which returns only what it returns) carries the
  ``__raybatch_`` columns through explicitly and turns a failed or out-of-choices answer into a
  reject.
- :func:`finish_row` runs after the processor: rows that bypassed postprocess (pre-rejected rows,
  and engine failures under ``should_continue_on_error``) come out with every column of the
  processor's row; it keeps the internal columns, records the engine error, and gives every row
  the same columns.

The vLLM path cannot run on a machine without a GPU and vllm: :func:`vllm_preflight` refuses
it with a clear error instead of Ray's silent 30-minute wait for a GPU.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Callable
from typing import Any

from airflow_provider_raybatch.llm.config import PREPARED_IMAGE_COLUMN, ChatTask, EngineConfig
from airflow_provider_raybatch.llm.prompts import chat_messages
from airflow_provider_raybatch.pipeline.config import Stage
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.stages import ENGINE_ERROR, INTERNAL_PREFIX, REJECT_COLUMN, REJECT_KIND_COLUMN

#: ray.data.llm's per-row error column: rows where it is non-empty skip every stage and postprocess.
INFERENCE_ERROR = "__inference_error__"
SKIPPED = "rejected by an earlier stage"
#: OpenAI sampling fields taken from vLLM-style sampling_params as they are.
OPENAI_SAMPLING = ("temperature", "top_p", "max_tokens", "seed", "stop", "presence_penalty", "frequency_penalty", "n")


def vllm_sampling_params(task: ChatTask) -> dict[str, Any]:
    """vLLM sampling parameters; ``choices`` become structured outputs (vLLM only emits one of them)."""
    params = dict(task.sampling_params)
    if task.choices:
        params["structured_outputs"] = {"choice": list(task.choices)}
    return params


def openai_payload(task: ChatTask, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``/chat/completions`` request body. ``choices`` become a JSON schema with an enum, which
    OpenAI and vLLM's server both enforce; the answer is still checked against the choices."""
    payload: dict[str, Any] = {"model": model, "messages": messages}
    payload.update({k: v for k, v in task.sampling_params.items() if k in OPENAI_SAMPLING})
    if task.choices:
        payload["response_format"] = {
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
    return payload


def parse_openai_response(response: Any, task: ChatTask) -> tuple[str | None, str | None]:
    """(answer, None) or (None, error) from a ``/chat/completions`` response body."""
    import json

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


class ChatRequest:
    """Preprocess of the processor: one row in, the engine's request fields out.

    :param task: ``ChatTask.to_dict()``.
    :param engine: ``"vllm"`` or ``"openai"``.
    :param model: the model name sent to an OpenAI-compatible endpoint.
    """

    def __init__(self, task: dict[str, Any], engine: str, model: str | None = None):
        self.task, self.engine, self.model = ChatTask.from_dict(task), engine, model

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if row.get(REJECT_COLUMN):
            return {INFERENCE_ERROR: SKIPPED}
        image = row.get(PREPARED_IMAGE_COLUMN) if self.task.image_column else None
        messages = chat_messages(self.task, row, image)
        if self.engine == "vllm":
            return {"messages": messages, "sampling_params": vllm_sampling_params(self.task)}
        return {"payload": openai_payload(self.task, self.model, messages)}


class ChatAnswer:
    """Postprocess of the processor: the answer (or a reject), and the internal columns."""

    def __init__(self, task: dict[str, Any], engine: str):
        self.task, self.engine = ChatTask.from_dict(task), engine

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in row.items() if k.startswith(INTERNAL_PREFIX)}
        if self.engine == "vllm":
            answer, error = row.get("generated_text"), None
        else:
            answer, error = parse_openai_response(row.get("http_response"), self.task)
        if error is None and self.task.choices is not None and answer not in self.task.choices:
            error = f"the answer {str(answer)[:200]!r} is not one of the choices"
        out[self.task.output_column] = None if error else answer
        out[REJECT_COLUMN] = error
        out[REJECT_KIND_COLUMN] = ENGINE_ERROR if error else None
        return out


def finish_row(row: dict[str, Any], output_column: str) -> dict[str, Any]:
    """After the processor: the same columns for every row, engine failures as rejects."""
    out = {k: v for k, v in row.items() if k.startswith(INTERNAL_PREFIX)}
    error = row.get(INFERENCE_ERROR) or None
    if not out.get(REJECT_COLUMN) and error:
        out[REJECT_COLUMN], out[REJECT_KIND_COLUMN] = str(error), ENGINE_ERROR
    out.setdefault(REJECT_COLUMN, None)
    out.setdefault(REJECT_KIND_COLUMN, None)
    out[output_column] = None if out[REJECT_COLUMN] else row.get(output_column)
    return out


class ChatTransform:
    """``ds -> ds``: the processor, then :func:`finish_row`."""

    def __init__(self, processor: Callable[[Any], Any], output_column: str):
        self.processor, self.output_column = processor, output_column

    def __call__(self, ds):
        return self.processor(ds).map(finish_row, fn_kwargs={"output_column": self.output_column})


def _task_engine(stage: Stage) -> tuple[ChatTask, EngineConfig]:
    return ChatTask.from_dict(stage.predictor_kwargs["task"]), EngineConfig.from_stage(stage)


# --- vLLM -------------------------------------------------------------------------------------


def vllm_preflight(engine: EngineConfig, find_spec: Callable[[str], Any] = importlib.util.find_spec) -> None:
    """Refuse what would otherwise wait silently: no vllm where the job runs, or too few GPUs."""
    import ray

    if find_spec("vllm") is None:
        raise ConfigError(
            f"engine='vllm' needs the vllm package where the job runs, and it cannot be imported on "
            f"{socket.gethostname()}: install airflow-provider-raybatch[vllm] there (CUDA only), or use "
            "engine='transformers' (CPU or GPU) or engine='openai'"
        )
    needed = engine.gpus_per_replica() * (
        engine.concurrency[0] if isinstance(engine.concurrency, tuple) else engine.concurrency
    )
    gpus = ray.cluster_resources().get("GPU", 0)
    if needed > gpus:
        raise ConfigError(
            f"engine='vllm' needs {needed:g} GPU(s) (num_gpus / tensor x pipeline parallel size x concurrency) "
            f"but the Ray cluster has {gpus:g}; vLLM would wait for them silently"
        )


def vllm_processor_config(task: ChatTask, engine: EngineConfig):
    """The ``vLLMEngineProcessorConfig`` for a task: what :func:`build_vllm_transform` builds from."""
    from ray.data.llm import vLLMEngineProcessorConfig

    return vLLMEngineProcessorConfig(
        model_source=engine.model,
        engine_kwargs=dict(engine.engine_kwargs),
        batch_size=engine.batch_size,
        concurrency=engine.concurrency,
        accelerator_type=engine.accelerator_type,
        # Per-row failures become rejects (bounded by max_error_fraction), not a failed job.
        should_continue_on_error=True,
        # Images arrive as OpenAI image_url parts holding a base64 data URL.
        prepare_multimodal_stage={"enabled": task.image_column is not None},
        chat_template_stage=True,
        tokenize_stage=True,
        detokenize_stage=True,
    )


def build_vllm_transform(stage: Stage) -> ChatTransform:
    """Transform-stage factory for ``engine="vllm"`` (checks first: vllm importable, GPUs present)."""
    from ray.data.llm import build_processor

    task, engine = _task_engine(stage)
    vllm_preflight(engine)
    processor = build_processor(
        vllm_processor_config(task, engine),
        preprocess=ChatRequest(task.to_dict(), "vllm"),
        postprocess=ChatAnswer(task.to_dict(), "vllm"),
    )
    return ChatTransform(processor, task.output_column)


# --- OpenAI-compatible endpoints ------------------------------------------------------------------


def openai_processor_config(task: ChatTask, engine: EngineConfig, api_key: str | None):
    """The ``HttpRequestProcessorConfig`` for ``{base_url}/chat/completions``.

    The key goes into a header of the HTTP stage's actors only: never into the stage's spec, the
    output's bookkeeping or a log line.
    """
    from ray.data.llm import HttpRequestProcessorConfig

    kwargs = engine.engine_kwargs
    return HttpRequestProcessorConfig(
        url=engine.base_url.rstrip("/") + "/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
        batch_size=engine.batch_size,
        concurrency=engine.concurrency,
        qps=kwargs.get("qps"),
        max_retries=int(kwargs.get("max_retries", 3)),
        base_retry_wait_time_in_s=float(kwargs.get("retry_wait_s", 1.0)),
        http_request_stage={"num_cpus": engine.num_cpus},
    )


def build_openai_transform(stage: Stage) -> ChatTransform:
    """Transform-stage factory for ``engine="openai"``; the key is read from ``api_key_env`` here,
    on the driver (set by the operator for an embedded Ray, by the cluster's environment otherwise)."""
    from ray.data.llm import build_processor

    task, engine = _task_engine(stage)
    api_key = os.environ.get(engine.api_key_env) if engine.api_key_env else None
    processor = build_processor(
        openai_processor_config(task, engine, api_key),
        preprocess=ChatRequest(task.to_dict(), "openai", engine.model),
        postprocess=ChatAnswer(task.to_dict(), "openai"),
    )
    return ChatTransform(processor, task.output_column)
