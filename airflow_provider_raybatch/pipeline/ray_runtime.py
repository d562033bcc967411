"""Connecting to Ray: an embedded local instance by default, or a cluster by address."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow_provider_raybatch.pipeline.reaper import start_reaper

log = logging.getLogger(__name__)


def python_path_runtime_env() -> dict[str, Any]:
    """A runtime_env giving Ray's workers this process's ``sys.path``, so what imports here imports there."""
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))}}


@contextmanager
def ray_session(address: str | None = None, namespace: str | None = None) -> Iterator[None]:
    """Use the Ray already initialised in this process, or start one and shut it down after.

    With no address, Ray starts embedded in this process (its workers are local processes).
    The workers get this process's ``sys.path``, so predictors importable here (a DAG folder
    module, a test module) are importable there too. On Linux a reaper process (see
    :mod:`~airflow_provider_raybatch.pipeline.reaper`) ends every process of the embedded Ray
    within seconds if this process is killed before it can shut Ray down (SIGKILL, the OOM
    killer); elsewhere that guarantee is absent and nothing else changes.
    """
    import ray

    if ray.is_initialized():
        yield
        return
    reaper = None
    if address is None:
        log.info("Starting an embedded local Ray")
        # Before ray.init: a kill during the start (seconds) must not leave processes either.
        reaper = start_reaper()
        try:
            ray.init(
                include_dashboard=False,
                runtime_env=python_path_runtime_env(),
                configure_logging=False,
                namespace=namespace,
            )
        except BaseException:
            if reaper is not None:
                reaper.fire()  # what a failed start left running goes too
            raise
    else:
        log.info("Connecting to Ray at %s", address)
        ray.init(address=address, configure_logging=False, namespace=namespace)
    try:
        yield
    finally:
        try:
            ray.shutdown()
        finally:
            if reaper is not None:
                reaper.disarm()
