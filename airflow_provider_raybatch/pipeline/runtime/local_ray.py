"""Connecting to Ray: the host's shared local Ray by default, one started for the task, or a cluster."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from airflow_provider_raybatch.pipeline import ray_compat
from airflow_provider_raybatch.pipeline.runtime.reaper import start_reaper
from airflow_provider_raybatch.pipeline.runtime.shared.auth import restore_auth, use_head_token
from airflow_provider_raybatch.pipeline.runtime.shared.client import SharedRayClient
from airflow_provider_raybatch.pipeline.runtime.shared.head import join_shared_head
from airflow_provider_raybatch.pipeline.runtime.shared.head_watch import HeadWatch
from airflow_provider_raybatch.pipeline.runtime.shared.settings import (
    LOOPBACK_ENV,
    LocalRaySettings,
    per_task_ray_dir,
    ray_temp_dir,
)

log = logging.getLogger(__name__)


def python_path_runtime_env() -> dict[str, Any]:
    """A runtime_env giving Ray's workers this process's ``sys.path``, so what imports here imports there."""
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))}}


@contextmanager
def ray_session(
    address: str | None = None,
    namespace: str | None = None,
    local: LocalRaySettings | None = None,
    preload: Sequence[str] = (),
) -> Iterator[SharedRayClient | None]:
    """Use the Ray already initialised in this process, or connect to one and disconnect after.

    With no address the pipeline runs on a local Ray whose workers get this process's
    ``sys.path``, so predictors importable here (a DAG folder module, a test module) are
    importable there too. By default (``shared``, see :mod:`.shared`) that is the host's warm
    shared Ray, started by the first task that needs it and stopped when idle; this task is a
    driver of its own job there, its workers get its environment, and at the end it only
    disconnects (Ray ends its job's workers, also when this process is SIGKILLed).
    ``per-task`` starts a Ray embedded in this process and shuts it down at the end; on Linux a
    reaper process (see :mod:`.reaper`) ends every process of it within seconds if this process
    is killed before it can shut Ray down (SIGKILL, the OOM killer).

    :param address: a cluster to join (``"auto"``: the one this process runs on); None: local.
    :param namespace: the Ray namespace to join.
    :param local: how to get a local Ray; None: from the environment (:meth:`.LocalRaySettings.from_env`).
    :param preload: on the shared Ray, modules its warm workers for this task import ahead
        (see :mod:`.shared.client`).
    :return: on the shared Ray, this task's client, with which it takes its turn for resources
        (:meth:`.SharedRayClient.take_share`); otherwise None.
    """
    # Not imported before it is needed: the shared Ray's token is set in the environment Ray reads at import.
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        yield None
        return
    if address is not None:
        ray = _import_ray()
        log.info("Connecting to Ray at %s", address)
        ray.init(address=address, configure_logging=False, namespace=namespace)
        with _shutdown_after():
            yield None
        return
    local = local or LocalRaySettings.from_env()
    if local.shared:
        with _shared_session(local, namespace, preload) as client:
            yield client
        return
    if local.mode == "shared":
        log.info("A shared local Ray needs Linux: starting one for this task")
    log.info("Starting an embedded local Ray for this task")
    temp_dir = ray_temp_dir(*per_task_ray_dir())  # before anything starts: a folder too long for its sockets
    ray = _import_ray()

    # Before ray.init: a kill during the start (seconds) must not leave processes either.
    reaper = start_reaper()
    try:
        with _on_loopback():
            ray.init(
                include_dashboard=False,
                runtime_env=python_path_runtime_env(),
                configure_logging=False,
                namespace=namespace,
                _temp_dir=str(temp_dir),
            )
    except BaseException:
        if reaper is not None:
            reaper.fire()  # what a failed start left running goes too
        raise
    try:
        with _shutdown_after():
            yield None
    finally:
        if reaper is not None:
            reaper.disarm()


def _import_ray() -> Any:
    """``import ray``, and, on this thread, what Ray's log thread imports later.

    Once connected, Ray prints the cluster's log lines to the driver from a thread of its own, which imports
    ``ray.autoscaler.v2.utils`` at the first autoscaler event; meanwhile this thread's first ``DataContext``
    imports ``ray.util.state``, which imports ``ray.autoscaler`` too. Two threads importing one cycle of modules
    at once fail ("cannot import name 'DictCount' from partially initialized module"; seen on Ray 2.55.1 in a
    retry that started a new head). Imported here, before ``ray.init`` starts that thread, both find them whole.
    """
    import ray

    with contextlib.suppress(ImportError):  # where a later Ray moved it, its thread does not import it either
        import ray.autoscaler.v2.utils  # noqa: F401
    return ray


def prestart_workers(count: int, keep_alive_s: float | None = None) -> bool:
    """Have the local Ray start ``count`` worker processes with this driver's ``runtime_env`` now.

    Ray starts a worker for a job with a ``runtime_env`` (every task's: its ``sys.path``) only
    when an actor or task of the job is scheduled; its start and imports (~1.5 s) then come after
    the driver built the dataset, on the way to the first result. Started here, they overlap it.
    Ray has no public call for this: it is the raylet's ``PrestartWorkers`` request
    (:func:`.ray_compat.prestart_workers`), an optimisation only; if it fails, the run goes on as
    before and the reason is logged.

    :param count: worker processes to start.
    :param keep_alive_s: None: workers of this job, for its replicas, read and write tasks.
        Otherwise warm workers for no job yet, which the next job with an equal ``runtime_env``
        gets (see :mod:`.shared.client`), kept this long while unused.
    :return: whether the local raylet took the request.
    """
    if count < 1:
        return False
    return ray_compat.prestart_workers(count, keep_alive_s)


@contextmanager
def _shared_session(
    local: LocalRaySettings, namespace: str | None, preload: Sequence[str]
) -> Iterator[SharedRayClient]:
    started = time.monotonic()
    client = join_shared_head(local)
    try:
        saved = use_head_token(client.token_path)
        try:
            joined = time.monotonic()
            ray = _import_ray()

            runtime_env = client.runtime_env(python_path_runtime_env(), preload)  # this task's environment alone
            with _on_loopback():
                ray.init(
                    address=client.address,
                    runtime_env=runtime_env,
                    configure_logging=False,
                    namespace=namespace,
                )
            log.info(
                "Connected to the shared local Ray at %s in %.2f s (%.2f s to find or start it)",
                client.address,
                time.monotonic() - started,
                joined - started,
            )
            # Ray's shutdown inside the watch: without a GCS it may wait for it too (see .shared.head_watch).
            with HeadWatch(client), _shutdown_after():
                yield client
        finally:
            restore_auth(saved)
    finally:
        client.release()


@contextmanager
def _on_loopback() -> Iterator[None]:
    """While a local Ray starts or is joined here: this host's node, and the address to reach it, stay 127.0.0.1.

    Without this, Ray turns 127.0.0.1 into the host's outward address and a per-task Ray listens on every
    interface; a shared head on 127.0.0.1 is not even reached (see :data:`.settings.LOOPBACK_ENV`). Ray read that
    variable when it was imported, maybe before this task came: its flag is set here for this process, and the
    variable for the processes a per-task Ray starts now (its workers inherit it from its raylet). Once started or
    joined, Ray takes the node's address from the node itself, so both are restored after.
    """
    saved_env = {name: os.environ.get(name) for name in LOOPBACK_ENV}
    os.environ.update(LOOPBACK_ENV)
    try:
        with ray_compat.local_cluster_flag(False):
            yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _shutdown_after() -> Iterator[None]:
    import ray

    try:
        yield
    finally:
        ray.shutdown()  # connected to a running Ray: disconnects only
