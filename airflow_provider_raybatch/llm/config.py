"""Typed configuration of an LLM / VLM stage and the one function that turns it into pipeline stages.

Plain dataclasses, no heavy import: the operators build them at execute time, and the stages they
produce travel as JSON (``Stage.to_spec``) to wherever the pipeline runs. Nothing secret goes in
them: the OpenAI-compatible engine names the environment variable holding its key instead.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from airflow_provider_raybatch.pipeline.config import Stage
from airflow_provider_raybatch.pipeline.errors import ConfigError

ENGINES = ("vllm", "transformers", "openai")
#: The column the image stage writes (a PNG, resized) and the engines read.
PREPARED_IMAGE_COLUMN = "raybatch_image_png"
DEFAULT_API_KEY_ENV = "RAYBATCH_OPENAI_API_KEY"
#: Sampling parameters the transformers engine maps onto ``generate``; vLLM and OpenAI take theirs.
RESOURCE_FIELDS = ("batch_size", "concurrency", "num_cpus", "num_gpus", "accelerator_type")
TRANSFORMERS_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty")


@dataclass
class ChatTask:
    """What to ask the model, the same for every engine.

    :param prompt: the user message; ``{column}`` fields are filled from each row.
    :param system_prompt: an optional system message (fields filled the same way).
    :param output_column: where the answer is written.
    :param sampling_params: vLLM-style sampling parameters (``temperature``, ``max_tokens``...).
    :param choices: constrain each answer to exactly one of these strings.
    :param image_column: for a VLM: the column holding the image (bytes, a ``{"bytes", "path"}``
        struct, or a path / URL string).
    :param image_size: ``(width, height)`` the image is resized to before the model; None keeps it.
    """

    prompt: str
    system_prompt: str | None = None
    output_column: str = "generated_text"
    sampling_params: dict[str, Any] = field(default_factory=dict)
    choices: list[str] | None = None
    image_column: str | None = None
    image_size: tuple[int, int] | None = None

    def prompt_fields(self) -> list[str]:
        """Row columns the prompts refer to, in order of first use."""
        names: list[str] = []
        for template in (self.system_prompt or "", self.prompt):
            for _, name, _, _ in string.Formatter().parse(template):
                if name is not None and name not in names:
                    names.append(name)
        return names

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["image_size"] = list(self.image_size) if self.image_size else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatTask:
        task = cls(**data)
        if task.image_size is not None:
            task.image_size = (int(task.image_size[0]), int(task.image_size[1]))
        return task


@dataclass
class EngineConfig:
    """Which engine answers, and with what resources.

    :param engine: ``"vllm"`` (``ray.data.llm`` with vLLM, GPUs), ``"transformers"`` (Hugging Face
        ``generate`` in a Ray Data actor, CPU or GPU) or ``"openai"`` (any OpenAI-compatible endpoint).
    :param model: a model id or a local folder; for ``"openai"``, the model name the endpoint serves.
    :param engine_kwargs: passed to the engine: vLLM engine args (``max_model_len``,
        ``tensor_parallel_size``...); for transformers ``max_model_len``, ``device``, ``dtype``,
        ``num_threads``, ``trust_remote_code``; for openai ``max_retries``, ``qps``, ``timeout_s``.
    :param batch_size: rows per engine call.
    :param concurrency: engine replicas (``(min, max)`` to autoscale).
    :param num_cpus: CPUs per replica.
    :param num_gpus: GPUs per replica; None: the engine's default (vLLM: tensor x pipeline
        parallel size; others 0).
    :param accelerator_type: Ray accelerator type, e.g. ``"L4"``.
    :param base_url: ``"openai"`` only: the endpoint's base URL (``.../v1``).
    :param api_key_env: ``"openai"`` only: the environment variable holding the API key where
        the pipeline's driver runs (never the key itself).
    """

    engine: Literal["vllm", "transformers", "openai"]
    model: str
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 16
    concurrency: int | tuple[int, int] = 1
    num_cpus: float = 1
    num_gpus: float | None = None
    accelerator_type: str | None = None
    base_url: str | None = None
    api_key_env: str | None = DEFAULT_API_KEY_ENV

    def gpus_per_replica(self) -> float:
        if self.engine == "vllm":
            return float(
                self.engine_kwargs.get("tensor_parallel_size", 1) * self.engine_kwargs.get("pipeline_parallel_size", 1)
            )
        return float(self.num_gpus or 0)

    def to_dict(self) -> dict[str, Any]:
        """What decides the answers, for a stage's ``predictor_kwargs``: resources (batch size,
        replicas, CPUs, GPUs) are the stage's own fields, so changing them does not make a
        resumed output refuse the new settings."""
        return {k: v for k, v in asdict(self).items() if k not in RESOURCE_FIELDS}

    @classmethod
    def from_stage(cls, stage: Stage) -> EngineConfig:
        """The engine of a stage built by :func:`build_stages`: its kwargs plus the stage's resources."""
        config = cls(**stage.predictor_kwargs["engine"])
        config.batch_size = stage.batch_size or config.batch_size
        config.concurrency = stage.concurrency
        config.num_cpus = stage.num_cpus
        config.num_gpus = None if config.engine == "vllm" or not stage.num_gpus else stage.num_gpus
        config.accelerator_type = stage.accelerator_type
        return config


def validate(task: ChatTask, engine: EngineConfig) -> None:
    """Check the settings without importing anything heavy; errors name the setting."""
    if engine.engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {engine.engine!r}")
    if not engine.model:
        raise ConfigError("model is empty: give a model id or a local model folder")
    if not task.prompt:
        raise ConfigError("prompt is empty")
    if not task.output_column or task.output_column.startswith("__"):
        raise ConfigError(f"output_column must be a plain column name, got {task.output_column!r}")
    try:
        fields = task.prompt_fields()
    except ValueError as e:
        raise ConfigError(f"prompt or system_prompt is not a valid template: {e}") from e
    bad = [f for f in fields if not f.isidentifier() and not f.replace(" ", "_").isidentifier()]
    if bad or any(not f for f in fields):
        raise ConfigError(f"prompt fields must name columns, like {{Company}}; got {bad or ['{}']}")
    if not isinstance(task.sampling_params, dict):
        raise ConfigError(f"sampling_params must be a dict, got {type(task.sampling_params).__name__}")
    if not isinstance(engine.engine_kwargs, dict):
        raise ConfigError(f"engine_kwargs must be a dict, got {type(engine.engine_kwargs).__name__}")
    if task.choices is not None:
        if (
            not task.choices
            or not all(isinstance(c, str) and c for c in task.choices)
            or len(set(task.choices)) != len(task.choices)
        ):
            raise ConfigError(f"choices must be a non-empty list of distinct non-empty strings, got {task.choices!r}")
        if task.image_column is not None:
            raise ConfigError("choices are supported for text prompts only, not with an image_column")
        if "structured_outputs" in task.sampling_params:
            raise ConfigError("give either choices or sampling_params['structured_outputs'], not both")
    if task.image_size is not None and (
        len(task.image_size) != 2 or not all(isinstance(v, int) and v > 0 for v in task.image_size)
    ):
        raise ConfigError(f"image_size must be (width, height) in pixels or None, got {task.image_size!r}")
    if engine.batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {engine.batch_size}")
    if engine.engine == "transformers":
        unknown = sorted(set(task.sampling_params) - set(TRANSFORMERS_SAMPLING))
        if unknown:
            raise ConfigError(
                f"sampling_params {unknown} are not supported by engine='transformers' "
                f"(supported: {list(TRANSFORMERS_SAMPLING)})"
            )
    if engine.engine == "vllm" and engine.num_gpus is not None:
        parallel = engine.gpus_per_replica()
        if engine.num_gpus != parallel:
            raise ConfigError(
                f"engine='vllm' uses tensor_parallel_size x pipeline_parallel_size = {parallel:g} GPU(s) per replica; "
                f"num_gpus={engine.num_gpus:g} disagrees (leave num_gpus unset, or set engine_kwargs)"
            )
    if engine.engine == "openai" and not engine.base_url:
        raise ConfigError("engine='openai' needs base_url (the connection's host, e.g. https://api.openai.com/v1)")


def build_stages(task: ChatTask, engine: EngineConfig) -> list[Stage]:
    """The pipeline stages for ``task`` on ``engine``: an image stage first for a VLM, then the engine.

    The image stage (CPU) decodes, checks and resizes each image and rejects invalid ones, so the
    engine never sees them. ``transformers`` is a batch predictor; ``vllm`` and ``openai`` are
    ``ray.data.llm`` processors, applied as dataset transforms.
    """
    validate(task, engine)
    kwargs = {"task": task.to_dict(), "engine": engine.to_dict()}
    stages = []
    if task.image_column is not None:
        stages.append(
            Stage(
                "airflow_provider_raybatch.llm.images:PrepareImages",
                {"task": task.to_dict()},
                name="prepare_images",
                batch_size=engine.batch_size,
                num_cpus=min(engine.num_cpus, 0.5),
                batch_format="pyarrow",
                input_columns=[task.image_column, *task.prompt_fields()],
            )
        )
    resources = {
        "batch_size": engine.batch_size,
        "concurrency": engine.concurrency,
        "num_cpus": engine.num_cpus,
        "num_gpus": engine.gpus_per_replica(),
        "accelerator_type": engine.accelerator_type,
    }
    input_columns = None if stages else task.prompt_fields()
    if engine.engine == "transformers":
        stages.append(
            Stage(
                "airflow_provider_raybatch.llm.transformers_engine:TransformersChat",
                kwargs,
                name="transformers",
                input_columns=input_columns,
                **resources,
            )
        )
    else:
        factory = "build_vllm_transform" if engine.engine == "vllm" else "build_openai_transform"
        stages.append(
            Stage(
                f"airflow_provider_raybatch.llm.processors:{factory}",
                kwargs,
                name=engine.engine,
                transform=True,
                input_columns=input_columns,
                **resources,
            )
        )
    return stages
