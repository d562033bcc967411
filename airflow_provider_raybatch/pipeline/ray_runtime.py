"""Connecting to Ray: an embedded local instance by default, or a cluster by address."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


@contextmanager
def ray_session(address: str | None = None, namespace: str | None = None) -> Iterator[None]:
    """Use the Ray already initialised in this process, or start one and shut it down after.

    With no address, Ray starts embedded in this process (its workers are local processes).
    The workers get this process's ``sys.path``, so predictors importable here (a DAG folder
    module, a test module) are importable there too.
    """
    import ray

    if ray.is_initialized():
        yield
        return
    if address is None:
        log.info("Starting an embedded local Ray")
        python_path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        ray.init(
            include_dashboard=False,
            runtime_env={"env_vars": {"PYTHONPATH": python_path}},
            configure_logging=False,
            namespace=namespace,
        )
    else:
        log.info("Connecting to Ray at %s", address)
        ray.init(address=address, configure_logging=False, namespace=namespace)
    try:
        yield
    finally:
        ray.shutdown()
