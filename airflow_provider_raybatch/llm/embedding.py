"""From an embedding task, an engine and the replicas' resources to the pipeline's stage.

The checks every engine shares are here; what differs is asked of the engine's class
(:class:`~airflow_provider_raybatch.llm.engines.base.EmbeddingEngine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.llm.build import default_resources
from airflow_provider_raybatch.llm.config import EMBEDDING_DTYPES, TOKEN_OUTPUT_COLUMNS, EmbeddingTask, EngineConfig
from airflow_provider_raybatch.llm.engines import EMBEDDING, engine_names, get_engine
from airflow_provider_raybatch.pipeline.config import Stage
from airflow_provider_raybatch.pipeline.errors import ConfigError

if TYPE_CHECKING:
    from airflow_provider_raybatch.pipeline.resources import ReplicaResources


def build_embedding_stage(
    task: EmbeddingTask, config: EngineConfig, resources: ReplicaResources | None = None
) -> Stage:
    """The pipeline stage that embeds ``task``'s texts on ``config``'s embedding engine (settings checked
    first, without importing anything heavy; errors name the setting).

    :param resources: the engine replicas' resources; None: one replica, one CPU.
    """
    engine = get_engine(config.engine, EMBEDDING)
    resources = engine.replica_resources(config, default_resources() if resources is None else resources)
    if not config.model:
        raise ConfigError("model is empty: give a model id or a local model folder")
    if (task.text_column is None) == (task.image_column is None):
        raise ConfigError(
            f"give text_column or image_column, the column to embed, not {'both' if task.text_column else 'neither'}"
        )
    if task.image_column is not None and not engine.embeds_images:
        images = [n for n in engine_names(EMBEDDING) if get_engine(n, EMBEDDING).embeds_images]
        raise ConfigError(
            f"image_column={task.image_column!r}: engine {engine.name!r} embeds texts only; images need one of {images}"
        )
    if task.image_column is not None and task.prefix:
        raise ConfigError(f"prefix is put before texts; image_column={task.image_column!r} embeds images: leave it ''")
    for name in ("text_column" if task.text_column is not None else "image_column", "output_column"):
        if not _plain_name(getattr(task, name)):
            raise ConfigError(f"{name} must be a plain column name, got {getattr(task, name)!r}")
    if task.truncated_column is not None and not _plain_name(task.truncated_column):
        raise ConfigError(f"truncated_column must be a plain column name or None, got {task.truncated_column!r}")
    outputs = [task.output_column, task.truncated_column, *(TOKEN_OUTPUT_COLUMNS[:1] if task.token_columns else [])]
    if len({c for c in outputs if c}) < len([c for c in outputs if c]):
        raise ConfigError(f"the output columns must differ, got {[c for c in outputs if c]}")
    if not isinstance(task.prefix, str):
        raise ConfigError(f"prefix must be a string, got {type(task.prefix).__name__}")
    if task.dtype not in EMBEDDING_DTYPES:
        raise ConfigError(f"dtype must be one of {EMBEDDING_DTYPES}, got {task.dtype!r}")
    if not isinstance(config.engine_kwargs, dict):
        raise ConfigError(f"engine_kwargs must be a dict, got {type(config.engine_kwargs).__name__}")
    resources.validate(f"engine {engine.name!r}")
    engine.validate(task, config, resources)  # type: ignore[arg-type]
    return engine.build_stage(task, config, resources, [task.input_column])  # type: ignore[arg-type]


def _plain_name(name: Any) -> bool:
    return isinstance(name, str) and bool(name) and not name.startswith("__")
