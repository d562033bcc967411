"""Checks of rendered arguments that Airflow cannot make at trigger time.

A DAG's ``Param`` schemas refuse bad values when a run is triggered (the REST API answers 400,
the trigger form shows the error). Values that arrive another way (a DAG without schemas, a
template, ``dag.test()``) are checked here before any Ray work; the operator fails the task
without retries, with a message naming the argument.
"""

from __future__ import annotations

from airflow_provider_raybatch.pipeline.errors import ConfigError


def check_paths(**paths: object) -> None:
    """Each path must be absolute (``/data/in``) or a URL (``s3://bucket/in``).

    A relative path would depend on the worker's current folder.
    """
    for name, value in paths.items():
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{name} must be a non-empty path, got {value!r}")
        if not (value.startswith("/") or "://" in value):
            raise ConfigError(f"{name} must be an absolute path or a URL such as s3://bucket/prefix, got {value!r}")
