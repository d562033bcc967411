"""Text LLM batch inference over Parquet: chat prompts built from row columns, answers written as a column."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from airflow_provider_raybatch.llm.config import DEFAULT_API_KEY_ENV, ChatTask, EngineConfig, build_stages
from airflow_provider_raybatch.operators.ray_pipeline import RayPipelineOperator
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.errors import ConfigError

if TYPE_CHECKING:
    from airflow.sdk import Connection, Context


class LLMBatchInferenceOperator(RayPipelineOperator):
    """Ask a chat model about every row of a Parquet input, on Ray Data; write the answers as Parquet.

    Each row becomes chat messages (``system_prompt``, then ``prompt`` with ``{column}`` fields
    filled from the row); the answer goes to ``output_column`` beside ``keep_columns``. Rows run
    in the checkpointed ranges of :class:`RayPipelineOperator` (paths, ``keep_columns``,
    ``id_column``, ``mode``, ``ray_conn_id``... are its parameters), so a retry resumes and
    writes each row exactly once. A row the engine fails on goes to ``<output_path>/_rejects/``
    with the error; past ``max_error_fraction`` of such rows the task fails.

    :param prompt: the user message; ``{column}`` fields are filled from each row (templated).
    :param model: a model id or local folder (``vllm``, ``transformers``); the served model name
        (``openai``) (templated).
    :param engine: ``"vllm"`` (``ray.data.llm`` with vLLM, on GPUs), ``"transformers"`` (Hugging
        Face ``generate`` in a Ray Data actor, CPU or GPU) or ``"openai"`` (any OpenAI-compatible
        endpoint, from the ``openai_conn_id`` connection) (templated).
    :param system_prompt: an optional system message, with ``{column}`` fields too (templated).
    :param sampling_params: vLLM-style sampling parameters, e.g. ``{"temperature": 0.3,
        "max_tokens": 256}`` (templated).
    :param engine_kwargs: engine arguments: vLLM engine args (``max_model_len``,
        ``tensor_parallel_size``, ``quantization``, ``max_num_seqs``...); transformers
        ``max_model_len``, ``device``, ``dtype``, ``num_threads``; openai ``max_retries``, ``qps``
        (templated).
    :param choices: constrain every answer to exactly one of these strings: vLLM structured
        outputs, a JSON-schema enum for ``openai``, log-likelihood scoring of each choice for
        ``transformers`` (templated).
    :param output_column: the column holding the answers (templated).
    :param batch_size: rows per engine call (templated).
    :param concurrency: engine replicas, or ``(min, max)`` (templated).
    :param num_cpus: CPUs per engine replica.
    :param num_gpus: GPUs per engine replica; None: the engine's default (vLLM: tensor x pipeline
        parallel size; transformers and openai: 0) (templated).
    :param accelerator_type: Ray accelerator type per replica, e.g. ``"L4"``.
    :param max_error_fraction: the largest share of rows reaching the model that may fail (and go
        to the rejects) before the task fails; such a failure is not retried, as a retry would
        count the same committed errors (templated).
    :param openai_conn_id: for ``engine="openai"``: a connection whose host is the endpoint's base
        URL (``https://api.openai.com/v1``) and whose password is the API key.
    :param api_key_env: the environment variable through which the key reaches the pipeline's
        driver: set by this operator for an embedded Ray; on a Ray cluster it must be set in the
        cluster's environment (the key never travels with the job).
    """

    template_fields: Sequence[str] = (
        *RayPipelineOperator.template_fields,
        "prompt",
        "system_prompt",
        "model",
        "engine",
        "sampling_params",
        "engine_kwargs",
        "choices",
        "output_column",
        "batch_size",
        "concurrency",
        "num_gpus",
        "max_error_fraction",
    )
    template_fields_renderers = {"sampling_params": "json", "engine_kwargs": "json"}
    ui_color = "#e8dcf7"

    def __init__(
        self,
        *,
        prompt: str,
        model: str,
        engine: str = "vllm",
        system_prompt: str | None = None,
        sampling_params: dict[str, Any] | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        choices: list[str] | None = None,
        output_column: str = "generated_text",
        batch_size: int = 16,
        concurrency: int | tuple[int, int] = 1,
        num_cpus: float = 0.5,
        num_gpus: float | None = None,
        accelerator_type: str | None = None,
        max_error_fraction: float = 0.01,
        openai_conn_id: str = "openai_default",
        api_key_env: str = DEFAULT_API_KEY_ENV,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.prompt = prompt
        self.model = model
        self.engine = engine
        self.system_prompt = system_prompt
        self.sampling_params = sampling_params or {}
        self.engine_kwargs = engine_kwargs or {}
        self.choices = choices
        self.output_column = output_column
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.accelerator_type = accelerator_type
        self.max_error_fraction = max_error_fraction
        self.openai_conn_id = openai_conn_id
        self.api_key_env = api_key_env

    def chat_task(self) -> ChatTask:
        """What to ask, from the rendered arguments."""
        return ChatTask(
            prompt=self.prompt,
            system_prompt=self.system_prompt or None,
            output_column=self.output_column,
            sampling_params=_as(self.sampling_params, dict, "sampling_params"),
            choices=_as(self.choices, list, "choices") if self.choices not in (None, "", "None") else None,
        )

    def engine_config(self) -> EngineConfig:
        """Which engine answers, from the rendered arguments (and the connection for ``openai``)."""
        concurrency = _as(self.concurrency, (int, list, tuple), "concurrency")
        if isinstance(concurrency, list):
            concurrency = (int(concurrency[0]), int(concurrency[1]))
        num_gpus = self.num_gpus if self.num_gpus not in ("", "None") else None
        return EngineConfig(
            engine=self.engine,
            model=self.model,
            engine_kwargs=_as(self.engine_kwargs, dict, "engine_kwargs"),
            batch_size=int(self.batch_size),
            concurrency=concurrency,
            num_cpus=float(self.num_cpus),
            num_gpus=None if num_gpus is None else float(num_gpus),
            accelerator_type=self.accelerator_type,
            base_url=self._openai_base_url() if self.engine == "openai" else None,
            api_key_env=self.api_key_env,
        )

    def build_stages(self, context: Context) -> list[Stage]:
        return build_stages(self.chat_task(), self.engine_config())

    def build_config(self, context: Context) -> BatchInferenceConfig:
        config = super().build_config(context)
        config.max_error_fraction = float(self.max_error_fraction)
        return config

    def execute(self, context: Context) -> dict[str, Any]:
        with self._api_key_in_environment():
            return super().execute(context)

    @cached_property
    def openai_connection(self) -> Connection:
        """The ``openai_conn_id`` connection: host = the endpoint's base URL, password = the API key."""
        return BaseHook.get_connection(self.openai_conn_id)

    def _openai_base_url(self) -> str:
        conn = self.openai_connection
        if not conn.host:
            raise ConfigError(f"connection {self.openai_conn_id!r} has no host: set it to the endpoint's base URL")
        host = conn.host.rstrip("/")
        if "://" not in host:
            host = f"{conn.schema or 'https'}://{host}"
        if conn.port and ":" not in host.split("://", 1)[1].split("/", 1)[0]:
            scheme, rest = host.split("://", 1)
            netloc, _, path = rest.partition("/")
            host = f"{scheme}://{netloc}:{conn.port}" + (f"/{path}" if path else "")
        return host

    @contextmanager
    def _api_key_in_environment(self) -> Iterator[None]:
        """For ``openai`` on an embedded Ray: the key reaches the pipeline's driver (this process)
        through ``api_key_env`` only, for the duration of the run."""
        if self.engine != "openai" or self.hook.cluster is not None:
            if self.engine == "openai":
                self.log.info(
                    "Ray cluster: the API key is read from $%s in the cluster's environment", self.api_key_env
                )
            yield
            return
        key = self.openai_connection.password
        previous = os.environ.get(self.api_key_env)
        if key:
            os.environ[self.api_key_env] = key
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(self.api_key_env, None)
            else:
                os.environ[self.api_key_env] = previous


def _as(value: Any, kind: type | tuple[type, ...], name: str) -> Any:
    """A rendered argument as ``kind``: Jinja renders to strings unless ``render_template_as_native_obj``."""
    if isinstance(value, str) and not (isinstance(kind, type) and kind is str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ConfigError(f"{name} must be {kind}, got the string {value!r}") from e
    if not isinstance(value, kind):
        raise ConfigError(f"{name} must be {kind}, got {type(value).__name__}")
    return value
