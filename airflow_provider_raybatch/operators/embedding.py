"""Text embeddings over Parquet: each row's text turned into a vector by an embedding model, written as a column."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.llm.build import DEFAULT_BATCH_SIZE
from airflow_provider_raybatch.llm.config import DEFAULT_API_KEY_ENV, EmbeddingTask, EngineConfig
from airflow_provider_raybatch.llm.embedding import build_embedding_stage
from airflow_provider_raybatch.llm.engines import EMBEDDING, find_engine, get_engine
from airflow_provider_raybatch.operators.arguments import RESOURCE_ARGUMENTS, resource_param_docs, resource_values
from airflow_provider_raybatch.operators.endpoint import EndpointConnection
from airflow_provider_raybatch.operators.ray_pipeline import RayPipelineOperator
from airflow_provider_raybatch.operators.rendered import as_kind, rendered_replica_resources
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.resources import ReplicaResources

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_raybatch.pipeline.config import Stage


class EmbeddingOperator(EndpointConnection, RayPipelineOperator):
    """Embed the text (or the image) of every row of a Parquet input with an embedding model, on Ray
    Data; write the vectors as a ``FixedSizeList<float32>`` (or ``float16``) column of the model's dimension.

    Rows run in the checkpointed ranges of :class:`RayPipelineOperator` (paths, ``keep_columns``,
    ``id_column``, ``mode``, outputs as a Parquet folder, Delta or Iceberg table... are its
    parameters), so a retry resumes and writes each row exactly once. The model is part of the
    output's recorded settings and its dimension of the output's recorded schema: resuming an
    output with another model (or a model of another dimension at the same path) is refused,
    naming both, and nothing of it is committed; ``mode="overwrite"`` starts afresh. A row without
    text (or whose image is missing or unreadable) goes to ``<output_path>/_rejects/``. Each row's input tokens are counted in the output's
    totals (summary, status, the UI), as the LLM operators count theirs. The resource arguments
    (``batch_size`` to ``max_concurrent_batches``, last below) are those of the engine's replicas.

    :param text_column: the column holding the text to embed (templated); or give ``image_column``.
    :param image_column: instead of ``text_column``, the column holding the image to embed: encoded
        bytes (PNG, JPEG...), a local path, ``s3://``/``https://`` URL, or a ``{"bytes", "path"}``
        struct as Hugging Face datasets write them (templated). For the ``transformers`` engine with
        a model of texts and images (CLIP, SigLIP), which embeds texts into the same space: texts
        embedded by it find the images. An image is neither truncated nor counted in tokens.
    :param model: a model id or a local folder (``transformers``: a Hugging Face encoder, such as a
        sentence-transformers model folder) (templated).
    :param engine: ``"transformers"`` (``AutoModel`` in a Ray Data actor, CPU or GPU; mean or CLS
        pooling as the model folder's sentence-transformers config says, else mean), ``"vllm"``
        (vLLM's embedding task through ``ray.data.llm``, on GPUs or, with ``num_gpus=0``, vLLM's CPU
        build; the same vectors, texts cut and counted the same way), ``"openai"`` (an
        OpenAI-compatible ``/embeddings`` endpoint, from the ``openai_conn_id`` connection) or
        another registered embedding engine (templated).
    :param prefix: put before every text, for models trained with an instruction, e.g. E5's
        ``"query: "`` (templated).
    :param output_column: the column holding the vectors (templated).
    :param normalize: scale every vector to unit L2 norm (cosine similarity is then a dot product).
    :param dtype: ``"float32"`` or ``"float16"`` (half the storage; a Parquet folder only: Delta and
        Iceberg have no float16 type).
    :param truncated_column: a boolean column saying whether the row's text (prefix included) was
        longer than the model's maximum length and cut to it (templated); None: not written.
    :param token_columns: also write each row's input tokens (after truncation) as the column
        ``num_input_tokens``.
    :param engine_kwargs: engine arguments: transformers ``max_model_len`` (the length texts are cut
        to), ``pooling`` (``"mean"`` or ``"cls"``), ``device``, ``dtype``, ``num_threads``; vllm: vLLM's
        engine arguments (``max_model_len``, the length texts are cut to; ``pooler_config``...); openai
        ``max_retries``, ``retry_wait_s``, ``qps``, ``timeout_s``, ``dimensions`` (templated).
    :param openai_conn_id: for an endpoint engine (``openai``): a connection whose host is the
        endpoint's base URL (``https://api.openai.com/v1``) and whose password is the API key.
    :param api_key_env: the environment variable through which the key reaches the pipeline's
        driver: set by this operator for an embedded Ray; on a Ray cluster it must be set in the
        cluster's environment (the key never travels with the job).
    """

    template_fields: Sequence[str] = (
        *RayPipelineOperator.template_fields,
        "text_column",
        "image_column",
        "model",
        "engine",
        "prefix",
        "output_column",
        "truncated_column",
        "engine_kwargs",
        "batch_size",
        "max_concurrent_batches",
        "concurrency",
        "num_cpus",
        "num_gpus",
    )
    template_fields_renderers = {"engine_kwargs": "json"}
    ui_color = "#dcf0f7"
    #: The replicas' resources it takes: all.
    resource_arguments = tuple(RESOURCE_ARGUMENTS)

    def __init__(
        self,
        *,
        text_column: str | None = None,
        image_column: str | None = None,
        model: str,
        engine: str = "transformers",
        prefix: str = "",
        output_column: str = "embedding",
        normalize: bool = False,
        dtype: str = "float32",
        truncated_column: str | None = "truncated",
        token_columns: bool = False,
        engine_kwargs: dict[str, Any] | None = None,
        # As the chat operators': a CPU engine, its read task and the writer fit on 2 CPUs.
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
        self.text_column = text_column
        self.image_column = image_column
        self.model = model
        self.engine = engine
        self.prefix = prefix
        self.output_column = output_column
        self.normalize = normalize
        self.dtype = dtype
        self.truncated_column = truncated_column
        self.token_columns = token_columns
        self.engine_kwargs = engine_kwargs or {}
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

    def embedding_task(self) -> EmbeddingTask:
        """What to embed, from the rendered arguments."""
        return EmbeddingTask(
            text_column=_column(self.text_column),
            image_column=_column(self.image_column),
            prefix=self.prefix or "",
            output_column=self.output_column,
            normalize=bool(self.normalize),
            dtype=self.dtype,
            truncated_column=_column(self.truncated_column),
            token_columns=bool(self.token_columns),
        )

    def engine_config(self) -> EngineConfig:
        """Which engine embeds, from the rendered arguments."""
        return EngineConfig(
            engine=self.engine,
            model=self.model,
            engine_kwargs=as_kind(self.engine_kwargs, dict, "engine_kwargs"),
            base_url=self.endpoint_url(get_engine(self.engine, EMBEDDING)),
            api_key_env=self.api_key_env,
        )

    def build_stages(self, context: Context) -> list[Stage]:
        if self.dtype == "float16" and self.output_format != "parquet":
            raise ConfigError(
                f"dtype='float16' is for a Parquet folder: a {self.output_format} table has no float16 type; "
                "give dtype='float32'"
            )
        resources = rendered_replica_resources(**resource_values(self))
        return [build_embedding_stage(self.embedding_task(), self.engine_config(), resources)]

    def execute(self, context: Context) -> dict[str, Any]:
        with self.api_key_in_environment(find_engine(self.engine, EMBEDDING)):
            return super().execute(context)


def _column(name: str | None) -> str | None:
    """A column argument as rendered: None where a template rendered nothing."""
    return None if name in (None, "", "None") else name


EmbeddingOperator.__doc__ = (EmbeddingOperator.__doc__ or "").rstrip() + resource_param_docs(
    EmbeddingOperator, notes={}
)
