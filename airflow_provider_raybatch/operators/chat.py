"""What the chat-model operators share: the model, its engine and prompts, the engine replicas'
resources, and an endpoint engine's connection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.llm.build import DEFAULT_BATCH_SIZE, build_stages
from airflow_provider_raybatch.llm.config import DEFAULT_API_KEY_ENV, ChatTask, EngineConfig
from airflow_provider_raybatch.llm.engines import find_engine, get_engine
from airflow_provider_raybatch.operators.arguments import RESOURCE_ARGUMENTS, resource_param_docs, resource_values
from airflow_provider_raybatch.operators.endpoint import EndpointConnection
from airflow_provider_raybatch.operators.ray_pipeline import RayPipelineOperator
from airflow_provider_raybatch.operators.rendered import as_kind, rendered_replica_resources
from airflow_provider_raybatch.pipeline.config import Stage
from airflow_provider_raybatch.pipeline.resources import ReplicaResources

if TYPE_CHECKING:
    from airflow.sdk import Context


class ChatOperator(EndpointConnection, RayPipelineOperator):
    """Base of the operators that ask a chat model about every row (:meth:`chat_task` says what).

    Rows run in the checkpointed ranges of :class:`RayPipelineOperator` (paths, ``keep_columns``,
    ``id_column``, ``mode``, ``max_error_fraction``, ``ray_conn_id``... are its parameters), so a
    retry resumes and writes each row exactly once. A row the engine fails on goes to
    ``<output_path>/_rejects/`` with the error. The resource arguments (``batch_size`` to
    ``max_concurrent_batches``, last below) are those of the engine's replicas.

    :param prompt: the user message; ``{column}`` fields are filled from each row (templated).
    :param model: a model id or local folder (``vllm``, ``transformers``); the served model name
        (``openai``) (templated).
    :param engine: ``"vllm"`` (``ray.data.llm`` with vLLM, on GPUs), ``"transformers"`` (Hugging
        Face ``generate`` in a Ray Data actor, CPU or GPU), ``"openai"`` (any OpenAI-compatible
        endpoint, from the ``openai_conn_id`` connection) or another registered engine (templated).
    :param system_prompt: an optional system message, with ``{column}`` fields too (templated).
    :param sampling_params: vLLM-style sampling parameters, e.g. ``{"temperature": 0.3,
        "max_tokens": 256}`` (templated).
    :param engine_kwargs: engine arguments: vLLM engine args (``max_model_len``,
        ``tensor_parallel_size``, ``quantization``, ``max_num_seqs``...); transformers
        ``max_model_len``, ``device``, ``dtype``, ``num_threads``; openai ``max_retries``, ``qps``
        (templated).
    :param output_column: the column holding the answers (templated).
    :param token_columns: also write each row's prompt and generated tokens as the columns
        ``num_input_tokens`` and ``num_generated_tokens``. The output's totals (summary, status,
        the UI) are counted either way.
    :param openai_conn_id: for an endpoint engine (``openai``): a connection whose host is the
        endpoint's base URL (``https://api.openai.com/v1``) and whose password is the API key.
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
        "output_column",
        "batch_size",
        "max_concurrent_batches",
        "concurrency",
        "num_cpus",
        "num_gpus",
    )
    template_fields_renderers = {"sampling_params": "json", "engine_kwargs": "json"}
    #: The replicas' resources it takes: all.
    resource_arguments = tuple(RESOURCE_ARGUMENTS)

    def __init__(
        self,
        *,
        prompt: str,
        model: str,
        engine: str = "vllm",
        system_prompt: str | None = None,
        sampling_params: dict[str, Any] | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        output_column: str = "generated_text",
        token_columns: bool = False,
        # An engine's own: the LLM stages' batch size (llm.build's), half a CPU per replica (a CPU engine,
        # its processor's stages and a read task fit on 2 CPUs), the engine's own GPU count.
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_concurrent_batches: int | None = ReplicaResources.max_concurrent_batches,
        concurrency: int | tuple[int, int] = ReplicaResources.concurrency,
        num_cpus: float = 0.5,
        num_gpus: float | None = None,
        memory: int | None = ReplicaResources.memory,
        accelerator_type: str | None = ReplicaResources.accelerator_type,
        ray_resources: dict[str, float] | None = ReplicaResources.resources,
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
        self.output_column = output_column
        self.token_columns = token_columns
        self.batch_size = batch_size
        self.max_concurrent_batches = max_concurrent_batches
        self.concurrency = concurrency
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.memory = memory
        self.accelerator_type = accelerator_type
        self.ray_resources = ray_resources
        self.openai_conn_id = openai_conn_id
        self.api_key_env = api_key_env

    def chat_task(self) -> ChatTask:
        """What to ask, from the rendered arguments (a subclass adds its own)."""
        return ChatTask(
            prompt=self.prompt,
            system_prompt=self.system_prompt or None,
            output_column=self.output_column,
            sampling_params=as_kind(self.sampling_params, dict, "sampling_params"),
            token_columns=bool(self.token_columns),
        )

    def engine_config(self) -> EngineConfig:
        """Which engine answers, from the rendered arguments (and the connection for an endpoint)."""
        return EngineConfig(
            engine=self.engine,
            model=self.model,
            engine_kwargs=as_kind(self.engine_kwargs, dict, "engine_kwargs"),
            base_url=self.endpoint_url(get_engine(self.engine)),
            api_key_env=self.api_key_env,
        )

    def replica_resources(self) -> ReplicaResources:
        """The engine replicas' resources, from the rendered arguments."""
        return rendered_replica_resources(**resource_values(self))

    def build_stages(self, context: Context) -> list[Stage]:
        return build_stages(self.chat_task(), self.engine_config(), self.replica_resources())

    def execute(self, context: Context) -> dict[str, Any]:
        with self.api_key_in_environment(find_engine(self.engine)):
            return super().execute(context)


ChatOperator.__doc__ = (ChatOperator.__doc__ or "").rstrip() + resource_param_docs(
    ChatOperator,
    notes={
        "max_concurrent_batches": "With ``vllm``, keep ``batch_size x max_concurrent_batches`` at least vLLM's "
        "``max_num_seqs``, or the engine waits for rows.",
    },
)
