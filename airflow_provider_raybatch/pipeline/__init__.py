"""Code that runs where Ray runs: planning, the commit protocol, execution on Ray Data, the runner.

Nothing in this package imports Airflow, so a Ray cluster image needs only Ray and the models.
Ray itself is imported lazily, so the config objects can be imported anywhere. The map of its
sub-packages is ``STRUCTURE.md`` beside this file.
"""

from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, Stage, TransformStage
from airflow_provider_raybatch.pipeline.errors import (
    ConfigError,
    InputChangedError,
    InputError,
    NotRetryableError,
    RayBatchError,
    StageError,
    TooManyErrorsError,
)
from airflow_provider_raybatch.pipeline.resources import ReplicaResources

__all__ = [
    "BatchInferenceConfig",
    "ConfigError",
    "InputChangedError",
    "InputError",
    "NotRetryableError",
    "RayBatchError",
    "ReplicaResources",
    "Stage",
    "StageError",
    "TooManyErrorsError",
    "TransformStage",
]
