"""From a chat task, an engine and the replicas' resources to pipeline stages.

The checks every engine shares are here; what differs is asked of the engine's class
(:mod:`~airflow_provider_raybatch.llm.engines`).
"""

from __future__ import annotations

from airflow_provider_raybatch.llm.config import ChatTask, EngineConfig
from airflow_provider_raybatch.llm.engines import get_engine
from airflow_provider_raybatch.pipeline.config import Stage
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.resources import ReplicaResources

#: Rows per engine call when no resources are given.
DEFAULT_BATCH_SIZE = 16
#: The image stage decodes and resizes on CPU: it never needs a whole CPU per replica.
IMAGE_STAGE_CPUS = 0.5


def default_resources() -> ReplicaResources:
    """One replica, one CPU, the engine's own GPU count (``num_gpus=None``)."""
    return ReplicaResources(batch_size=DEFAULT_BATCH_SIZE, num_gpus=None)


def validate(task: ChatTask, config: EngineConfig, resources: ReplicaResources | None = None) -> None:
    """Check the settings without importing anything heavy; errors name the setting.

    :param resources: the engine replicas' resources; None: :func:`default_resources`.
    """
    engine = get_engine(config.engine)
    if not config.model:
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
    if not isinstance(config.engine_kwargs, dict):
        raise ConfigError(f"engine_kwargs must be a dict, got {type(config.engine_kwargs).__name__}")
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
    resources = engine.replica_resources(config, default_resources() if resources is None else resources)
    resources.validate(f"engine {engine.name!r}")
    engine.validate(task, config, resources)


def build_stages(task: ChatTask, config: EngineConfig, resources: ReplicaResources | None = None) -> list[Stage]:
    """The pipeline stages for ``task`` on ``config``'s engine: an image stage first for a VLM, then the engine.

    The image stage (CPU) decodes, checks and resizes each image and rejects invalid ones, so the
    engine never sees them. The engine's stage is built by its class: a batch predictor
    (``transformers``) or a ``ray.data.llm`` processor applied as a transform (``vllm``, ``openai``).

    :param resources: the engine replicas' resources; None: :func:`default_resources`.
    """
    engine = get_engine(config.engine)
    resources = engine.replica_resources(config, default_resources() if resources is None else resources)
    validate(task, config, resources)
    stages: list[Stage] = []
    if task.image_column is not None:
        stages.append(
            Stage(
                "airflow_provider_raybatch.llm.images:PrepareImages",
                {"task": task.to_dict()},
                name="prepare_images",
                batch_size=resources.batch_size,
                num_cpus=min(resources.num_cpus, IMAGE_STAGE_CPUS),
                batch_format="pyarrow",
                input_columns=[task.image_column, *task.prompt_fields()],
            )
        )
    input_columns = None if stages else task.prompt_fields()
    stages.append(engine.build_stage(task, config, resources, input_columns))
    return stages
