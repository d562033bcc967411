"""Loading the user's predictors: by import path or object, checked before any work starts."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from airflow_provider_raybatch.pipeline.config import Stage, TransformStage
from airflow_provider_raybatch.pipeline.errors import ConfigError


def import_object(path: str) -> Any:
    """Import ``"package.module:Name"`` (or ``"package.module.Name"``)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ImportError(f"{path!r} is not an import path like 'package.module:Name'")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_predictor(stage: Stage) -> Callable[..., Any]:
    """Import the stage's predictor if given by path, and check that it can be called."""
    target = stage.predictor
    where = f"stage {stage.display_name!r}"
    if isinstance(target, str):
        try:
            target = import_object(target)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"{where}: cannot import predictor {stage.predictor!r}: {e}") from e
    if inspect.isclass(target):
        if "__call__" not in dir(target):  # dir() of a class leaves out type.__call__
            raise ConfigError(f"{where}: predictor class {target.__qualname__} has no __call__(batch) method")
    elif not callable(target):
        raise ConfigError(f"{where}: predictor {stage.predictor!r} is not callable")
    return target


def warm_imports(stages: Sequence[Stage]) -> list[str]:
    """Modules a warm worker imports ahead for these stages' replicas: Ray Data, the stage worker's
    and the block writer's modules, each predictor's module, and the modules a predictor names in its
    ``warm_imports`` attribute (the heavy ones it imports when built, such as ``torch``)."""
    names = [
        "ray.data",
        "airflow_provider_raybatch.pipeline.execution.stages",
        "airflow_provider_raybatch.pipeline.execution.block_writer",
    ]
    for stage in stages:
        if isinstance(stage, TransformStage):
            continue
        target = resolve_predictor(stage)
        names += [getattr(target, "__module__", None) or "", *getattr(target, "warm_imports", ())]
    return [n for n in dict.fromkeys(names) if n and n != "__main__"]
