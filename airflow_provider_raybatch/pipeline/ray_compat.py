"""Every private Ray API the pipeline touches, in one place, and what happens without it.

The pipeline runs on the Ray releases the provider supports (see docs/compatibility.md), whose
private parts differ. Each use here is an optimisation or a better report, never what a run's
correctness rests on: when a call is missing or fails on the installed Ray, it is logged once
(with the Ray version) and turned off for the rest of the process, and the run goes on without it.

| what | private API | without it |
|---|---|---|
| workers started ahead (:func:`prestart_workers`) | the raylet's ``PrestartWorkers`` gRPC | workers start when the first task needs them (~1.5 s later) |
| a local Ray kept on loopback (:func:`local_cluster_flag`) | ``ray_constants.ENABLE_RAY_CLUSTER`` | only the environment variables that Ray reads at import |
| the autoscaler's limits (:func:`autoscaler_limits`) | ``ray._private.state`` | resources are judged by the live nodes alone |
| re-reading token auth settings (:func:`reload_auth_settings`) | ``ray._raylet`` token loader | a shared head with token auth is joined only by a task that imports Ray after the token is set |
| the running executor (:func:`streaming_executor`, :func:`executor_operators`) | Ray Data's ``StreamingExecutor`` | a stalled run still fails, without naming the stage that stalled |
| rows scored so far (:func:`put_count`, :func:`sum_counts`, :func:`delete_counts`) | the GCS key-value store (``ray.experimental.internal_kv``) | progress lines count the rows written, not those scored within a range |

Ray Data's public API has its own differences, handled where they arise: remote arguments that
are None are left out (:meth:`.resources.ReplicaResources.reservation`), as Ray 2.55's operator
fusion fails on them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

#: Features turned off in this process, after their private API failed once.
_disabled: set[str] = set()


def ray_version() -> str:
    import ray

    return ray.__version__


def _turn_off(feature: str, error: BaseException, without: str) -> None:
    if feature not in _disabled:
        _disabled.add(feature)
        log.warning(
            "Ray %s: %s is not available (%s: %s); %s",
            ray_version(),
            feature,
            type(error).__name__,
            error,
            without,
        )


def prestart_workers(count: int, keep_alive_s: float | None) -> bool:
    """Ask the local raylet to start ``count`` Python workers with this driver's ``runtime_env`` now.

    :param keep_alive_s: None: workers of this job. Otherwise workers for no job yet, which the
        next job with an equal ``runtime_env`` gets, kept this long while unused.
    :return: whether the raylet took the request.
    """
    feature = "starting workers ahead (the raylet's PrestartWorkers)"
    if feature in _disabled:
        return False
    try:
        import ray
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc

        worker, node = ray._private.worker.global_worker, ray._private.worker._global_node
        job = worker.current_job_id if keep_alive_s is None else ray.JobID.nil()
        channel = init_grpc_channel(f"{node.node_ip_address}:{node.node_manager_port}")
        try:
            request = node_manager_pb2.PrestartWorkersRequest(
                language=common_pb2.PYTHON,
                job_id=job.binary(),
                runtime_env_info=worker.core_worker.get_job_config().runtime_env_info,
                # Unused workers of a job end with it anyway.
                keep_alive_duration_secs=int(keep_alive_s or 60),
                num_workers=count,
            )
            node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(request, timeout=5)
        finally:
            channel.close()
    except (ImportError, AttributeError, TypeError, ValueError) as e:  # the API differs on this Ray
        _turn_off(feature, e, "workers start when the first task needs them")
        return False
    except Exception as e:  # noqa: BLE001 - the call itself failed (a busy raylet): only this time
        log.info("Could not start Ray workers ahead of the pipeline (%s: %s)", type(e).__name__, e)
        return False
    return True


@contextmanager
def local_cluster_flag(enabled: bool) -> Iterator[None]:
    """Set Ray's ``ENABLE_RAY_CLUSTER`` flag (read at import from its environment variable) meanwhile."""
    try:
        from ray._private import ray_constants

        saved = ray_constants.ENABLE_RAY_CLUSTER
    except (ImportError, AttributeError) as e:
        _turn_off("Ray's ENABLE_RAY_CLUSTER flag", e, "the local Ray's address follows its environment variables")
        yield
        return
    ray_constants.ENABLE_RAY_CLUSTER = enabled
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def autoscaler_limits() -> dict[str, float]:
    """The most of each resource the cluster's autoscaler could add nodes for; empty without an autoscaler."""
    try:  # Ray's own view of the autoscaler's node types (private, as Ray Data uses it)
        from ray._private.state import state

        return dict(state.get_max_resources_from_cluster_config() or {})
    except Exception as e:  # noqa: BLE001
        _turn_off("the autoscaler's limits (ray._private.state)", e, "resources are judged by the live nodes alone")
        return {}


def reload_auth_settings() -> None:
    """Make an already imported Ray read its ``RAY_AUTH_*`` settings and token again.

    Ray caches them (``RayConfig``, the token loader) when it is imported; this is what ``ray.init``
    itself does when it turns token auth on for a new local cluster.
    """
    try:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError) as e:
        _turn_off(
            "re-reading Ray's token auth settings (ray._raylet)",
            e,
            "Ray keeps the auth settings it read when it was imported",
        )


def streaming_executor(dataset: Any) -> Any:
    """The running Ray Data executor of ``dataset``, or None.

    It is the thread that runs the dataset's scheduling loop, found by the dataset's id:
    ``Dataset._current_executor`` is set only once the first batch has arrived, too late for a
    run stalled on its first batch.
    """
    if dataset is None:
        return None
    try:
        from ray.data._internal.execution.streaming_executor import StreamingExecutor

        dataset_id = dataset.get_dataset_id()
    except (ImportError, AttributeError) as e:
        _turn_off("Ray Data's executor state", e, "a stalled run is stopped without naming the stage that stalled")
        return None
    for thread in threading.enumerate():
        if isinstance(thread, StreamingExecutor) and getattr(thread, "_dataset_id", None) == dataset_id:
            return thread
    return None


def executor_operators(executor: Any) -> list[tuple[Any, Any]] | None:
    """The executor's operators and their states, in pipeline order; None where this Ray keeps them otherwise."""
    try:
        return list(executor._topology.items())
    except AttributeError as e:
        _turn_off("Ray Data's executor topology", e, "a stall is reported without the stage that holds it")
        return None


#: The GCS key-value namespace of the counts (:func:`put_count`).
COUNTS_NAMESPACE = "raybatch"
_COUNTS = "counts in Ray's key-value store (ray.experimental.internal_kv)"


def put_count(key: str, count: int) -> None:
    """Store ``count`` under ``key`` in the cluster's key-value store (from a worker or the driver)."""
    if _COUNTS in _disabled:
        return
    try:
        from ray.experimental.internal_kv import _internal_kv_initialized, _internal_kv_put

        if _internal_kv_initialized():
            _internal_kv_put(key, str(count).encode(), overwrite=True, namespace=COUNTS_NAMESPACE)
    except (ImportError, AttributeError, TypeError) as e:
        _turn_off(_COUNTS, e, "progress counts the rows written only")
    except Exception as e:  # noqa: BLE001 - a busy GCS: this count only; progress is a report
        log.debug("Could not store count %s: %s", key, e)


def sum_counts(prefix: str) -> int:
    """The sum of the counts stored under keys starting with ``prefix`` (0 when there are none)."""
    if _COUNTS in _disabled:
        return 0
    try:
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

        total = 0
        for key in _internal_kv_list(prefix, namespace=COUNTS_NAMESPACE):
            value = _internal_kv_get(key, namespace=COUNTS_NAMESPACE)
            total += int(value or 0)
        return total
    except (ImportError, AttributeError, TypeError) as e:
        _turn_off(_COUNTS, e, "progress counts the rows written only")
    except Exception as e:  # noqa: BLE001 - a busy GCS: the next line counts again
        log.debug("Could not read the counts under %s: %s", prefix, e)
    return 0


def delete_counts(prefix: str) -> None:
    """Remove the counts stored under keys starting with ``prefix``."""
    if _COUNTS in _disabled:
        return
    try:
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(prefix, del_by_prefix=True, namespace=COUNTS_NAMESPACE)
    except Exception as e:  # noqa: BLE001 - a few bytes left in the GCS until the Ray stops
        log.debug("Could not remove the counts under %s: %s", prefix, e)
