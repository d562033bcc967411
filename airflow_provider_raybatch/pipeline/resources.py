"""What each replica of a stage reserves on Ray, and the check that the cluster can give it.

:class:`ReplicaResources` is the one type for a stage's replicas: a pipeline
:class:`~airflow_provider_raybatch.pipeline.config.Stage` is one, an LLM engine's stage is
built from one, and the operators build one from their arguments. Ray is imported only inside
what runs on Ray.
"""

from __future__ import annotations

import logging
import numbers
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from airflow_provider_raybatch.pipeline import ray_compat
from airflow_provider_raybatch.pipeline.described import described, param_docs
from airflow_provider_raybatch.pipeline.errors import ConfigError, ResourcesUnavailableError
from airflow_provider_raybatch.pipeline.store.retries import seconds_from_env

log = logging.getLogger(__name__)

#: CPUs Ray Data's read tasks need beside the stages' replicas.
READ_CPUS = 1
#: ``concurrency=None``: replicas on CPUs only as many as the cluster's CPUs hold (:func:`auto_replicas`).
AUTO = None
#: How long a try waits for resources the cluster had or may get (seconds; default :data:`RESOURCE_WAIT_S`).
RESOURCE_WAIT_ENV = "RAYBATCH_RESOURCE_WAIT_S"
RESOURCE_WAIT_S = 120.0
#: Ray's reasons of a node's death (``NodeDeathInfo.Reason``) that mean lost, not removed on purpose:
#: UNEXPECTED_TERMINATION, AUTOSCALER_DRAIN_PREEMPTED.
_LOST = (2, 3)


@dataclass(kw_only=True)
class ReplicaResources:
    """How many replicas run a stage, how big their batches are and what each one reserves.

    Each field is described once, here: the operators that take them as arguments quote it
    (:mod:`~airflow_provider_raybatch.operators.arguments`).
    """

    batch_size: int | None = described("rows per call.", default=256)
    concurrency: int | tuple[int, int] | None = described(
        "replicas: a fixed number, ``(min, max)`` for an autoscaling pool, or None "
        "(:data:`~airflow_provider_raybatch.pipeline.resources.AUTO`): on CPUs only, as many replicas as the Ray "
        "cluster's CPUs hold when the run starts, beside what other tasks on a shared local Ray hold "
        "(:func:`~airflow_provider_raybatch.pipeline.resources.auto_replicas`); with ``num_gpus`` or "
        "``accelerator_type``, one.",
        default=1,
    )
    num_cpus: float = described("CPUs reserved per replica (fractions allowed).", default=1)
    num_gpus: float | None = described(
        "GPUs reserved per replica. None only for an LLM engine's replicas: the engine decides (vLLM: its tensor x "
        "pipeline parallel size; transformers and openai: 0).",
        default=0,
    )
    memory: int | None = described("bytes of memory reserved per replica.", default=None)
    accelerator_type: str | None = described(
        'the Ray accelerator type each replica is scheduled on, e.g. ``"A10G"``.', default=None
    )
    resources: dict[str, float] | None = described(
        'custom Ray resources per replica, e.g. ``{"big_memory_node": 1}``: the replicas run only on nodes that '
        "offer them.",
        default=None,
    )
    max_concurrent_batches: int | None = described(
        "batches each replica works on at once, for an engine that overlaps them (``ray.data.llm``'s offline "
        "processors: the ``vllm`` engine); None: the engine's default (8 for vLLM).",
        default=None,
    )

    @property
    def min_replicas(self) -> int:
        """Replicas a run starts with (1 for :data:`AUTO` before :func:`auto_replicas` decided)."""
        if self.concurrency is AUTO:
            return 1
        return self.concurrency[0] if isinstance(self.concurrency, tuple) else self.concurrency

    @property
    def max_replicas(self) -> int:
        if self.concurrency is AUTO:
            return 1
        return self.concurrency[1] if isinstance(self.concurrency, tuple) else self.concurrency

    def resource_kwargs(self) -> dict[str, Any]:
        """These fields alone, as keyword arguments (to build a stage from them)."""
        return {f.name: getattr(self, f.name) for f in fields(ReplicaResources)}

    def validate(self, where: str) -> None:
        """Refuse values Ray would reject late or misread; a ``[min, max]`` list becomes a tuple.

        :param where: what the errors name, e.g. ``"stage 'Embedder'"``.
        """
        if self.concurrency is AUTO:
            pass
        elif isinstance(self.concurrency, (list, tuple)):
            if len(self.concurrency) != 2 or not 1 <= self.concurrency[0] <= self.concurrency[1]:
                raise ConfigError(
                    f"{where}: concurrency must be an int >= 1 or (min, max) with 1 <= min <= max, got {self.concurrency!r}"
                )
            self.concurrency = (int(self.concurrency[0]), int(self.concurrency[1]))
        elif not is_int(self.concurrency) or self.concurrency < 1:
            raise ConfigError(f"{where}: concurrency must be an int >= 1 or (min, max), got {self.concurrency!r}")
        if self.batch_size is not None and (not is_int(self.batch_size) or self.batch_size < 1):
            raise ConfigError(f"{where}: batch_size must be an integer >= 1 or None, got {self.batch_size!r}")
        if self.max_concurrent_batches is not None and (
            not is_int(self.max_concurrent_batches) or self.max_concurrent_batches < 1
        ):
            raise ConfigError(
                f"{where}: max_concurrent_batches must be an integer >= 1 or None, got {self.max_concurrent_batches!r}"
            )
        if not (is_number(self.num_cpus) and is_number(self.num_gpus)):
            raise ConfigError(
                f"{where}: num_cpus and num_gpus must be numbers, got {self.num_cpus!r}, {self.num_gpus!r}"
            )
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ConfigError(f"{where}: num_cpus and num_gpus must be >= 0")
        if self.memory is not None and (not is_number(self.memory) or self.memory < 0):
            raise ConfigError(f"{where}: memory must be a number of bytes or None, got {self.memory!r}")
        if self.resources is not None and (
            not isinstance(self.resources, dict)
            or not all(isinstance(k, str) and is_number(v) and v >= 0 for k, v in self.resources.items())
        ):
            raise ConfigError(f"{where}: resources must be a dict of resource name to amount, got {self.resources!r}")

    @property
    def cpus_only(self) -> bool:
        """Whether a replica reserves no GPU or accelerator, only what a read or write task could use."""
        return not self.num_gpus and not self.accelerator_type

    def reservation(self) -> dict[str, Any]:
        """What one replica reserves, as Ray Data's ``map_batches`` and ``read_datasource`` take it.

        What is not set is left out, not passed as None: Ray 2.55's operator fusion fails on a
        None-valued remote argument (``are_remote_args_compatible``), later releases ignore it.
        """
        reservation = {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "memory": self.memory,
            "accelerator_type": self.accelerator_type,
            "resources": self.resources,
        }
        return {name: value for name, value in reservation.items() if value is not None}

    def map_batches_kwargs(self) -> dict[str, Any]:
        """Ray Data ``map_batches`` arguments for an actor pool of these replicas."""
        from ray.data import ActorPoolStrategy

        if isinstance(self.concurrency, tuple):
            compute = ActorPoolStrategy(min_size=self.min_replicas, max_size=self.max_replicas)
        else:
            compute = ActorPoolStrategy(size=self.min_replicas)
        return {"batch_size": self.batch_size, "compute": compute, **self.reservation()}


ReplicaResources.__doc__ += param_docs(ReplicaResources)


def auto_replicas(
    stages: Sequence[ReplicaResources], cpus: float, read_cpus: float = READ_CPUS, work_units: int | None = None
) -> list[int | tuple[int, int]]:
    """Each stage's concurrency, with :data:`AUTO` decided for ``cpus`` CPUs.

    A stage on CPUs only gets as many replicas as fit in the CPUs that reading and the other
    stages' minimum replicas leave (shared evenly among such stages, at least one; at most
    ``work_units``, the read tasks there are to share). One replica on 2 CPUs left a CPU idle and
    ran a light model at 0.36x a plain loop's speed (benchmarks/RESULTS.md 1g). A stage on a GPU
    or another accelerator, or that reserves no CPU, gets one. The resource check then applies
    as to any concurrency: a read task's CPU is left where the replicas do not read.

    :param stages: the stages, in order.
    :param cpus: the CPUs the run may use (the cluster's, or what other tasks leave on a shared Ray).
    :param read_cpus: CPUs reading needs beside the replicas (as :func:`check_cluster_resources`).
    :param work_units: the most replicas that could get work (None: no such bound).
    """
    auto = [i for i, s in enumerate(stages) if s.concurrency is AUTO and s.cpus_only and s.num_cpus > 0]
    fixed = sum(s.num_cpus * s.min_replicas for i, s in enumerate(stages) if i not in auto)
    share = (cpus - read_cpus - fixed) / len(auto) if auto else 0
    decided: list[int | tuple[int, int]] = []
    for i, stage in enumerate(stages):
        if stage.concurrency is not AUTO:
            decided.append(stage.concurrency)
        elif i not in auto:
            decided.append(1)
        else:
            replicas = max(1, int(share / stage.num_cpus + 1e-9))
            decided.append(max(1, min(replicas, work_units)) if work_units else replicas)
    return decided


def check_cluster_resources(
    stages: Sequence[tuple[str, ReplicaResources]], resources: Mapping[str, float], read_cpus: float = READ_CPUS
) -> dict[str, float]:
    """Refuse what the cluster cannot run: Ray Data would otherwise wait silently, forever.

    Counts each stage's minimum replicas, and ``read_cpus`` for reading. Call it where the
    pipeline runs, after Ray is up. Returns that minimum, the CPUs and GPUs the pipeline needs at
    once to make progress.

    :param stages: each stage's name (for the errors) and resources, in order.
    :param resources: what the cluster offers (``ray.cluster_resources()``).
    :param read_cpus: CPUs that read tasks need beside the replicas (none when the first stage's
        replicas read).
    """
    cpus, gpus = resources.get("CPU", 0), resources.get("GPU", 0)
    for name, stage in stages:
        where = f"stage {name!r}"
        if stage.num_gpus > gpus:
            raise ConfigError(
                f"{where} asks for num_gpus={stage.num_gpus} per replica but the Ray cluster has {gpus:g} GPU(s)"
            )
        if stage.accelerator_type and f"accelerator_type:{stage.accelerator_type}" not in resources:
            raise ConfigError(
                f"{where} asks for accelerator_type={stage.accelerator_type!r}, which no node of the Ray cluster has"
            )
        missing = [name for name, amount in (stage.resources or {}).items() if amount > resources.get(name, 0)]
        if missing:
            raise ConfigError(
                f"{where} asks for resources {stage.resources}, but the Ray cluster offers {missing} "
                f"in smaller amounts or not at all"
            )
        if stage.memory and stage.memory > resources.get("memory", 0):
            raise ConfigError(
                f"{where} asks for memory={stage.memory} bytes per replica, more than the Ray cluster has"
            )
    gpu_need = sum(s.num_gpus * s.min_replicas for _, s in stages)
    if gpu_need > gpus:
        raise ConfigError(f"the stages need {gpu_need:g} GPUs (replicas x num_gpus) but the Ray cluster has {gpus:g}")
    cpu_need = sum(s.num_cpus * s.min_replicas for _, s in stages)
    if cpu_need + read_cpus > cpus:
        detail = ", ".join(f"{name}: {s.min_replicas} x {s.num_cpus:g}" for name, s in stages)
        reading = f" and reading needs {read_cpus:g}" if read_cpus else ""
        raise ConfigError(
            f"the stages reserve {cpu_need:g} CPUs (replicas x num_cpus: {detail}){reading}, "
            f"but the Ray cluster has {cpus:g} CPUs: the pipeline would stall waiting for a CPU. "
            "Lower concurrency or num_cpus (fractions such as 0.5 are allowed)."
        )
    return {"CPU": cpu_need + read_cpus, "GPU": gpu_need}


def wait_for_cluster_resources(
    stages: Sequence[tuple[str, ReplicaResources]], read_cpus: float = READ_CPUS
) -> tuple[dict[str, float], dict[str, float]]:
    """:func:`check_cluster_resources` on the Ray cluster this process is connected to.

    What the cluster lacks now but may have again is waited for, up to ``RAYBATCH_RESOURCE_WAIT_S``
    seconds, then fails the try with a retryable :class:`ResourcesUnavailableError` (right when the
    node comes back): the cluster may have it again when its autoscaler's node types offer it, or
    when it lost a node (crashed or preempted; Ray no longer reports what a dead node had, so any
    shortfall may be the lost node's). Otherwise no node could ever give it: a :class:`ConfigError` at once.

    :returns: the minimum the pipeline needs at once (as :func:`check_cluster_resources`), and
        the cluster's resources when it was met.
    """
    import ray

    resources = ray.cluster_resources()
    try:
        return check_cluster_resources(stages, resources, read_cpus), resources
    except ConfigError as now:
        lost = _lost_nodes()
        if not lost:
            check_cluster_resources(stages, {**resources, **_autoscaler_limits(resources)}, read_cpus)
        why = f"{len(lost)} node(s) lost ({lost[0]})" if lost else "its autoscaler may add a node that has it"
        wait = seconds_from_env(RESOURCE_WAIT_ENV, RESOURCE_WAIT_S)
        log.warning("Waiting up to %g s for the Ray cluster's resources (%s): %s", wait, why, now)
    deadline = time.monotonic() + wait
    while True:
        time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
        resources = ray.cluster_resources()
        try:
            return check_cluster_resources(stages, resources, read_cpus), resources
        except ConfigError as e:
            if time.monotonic() >= deadline:
                raise ResourcesUnavailableError(
                    f"{str(e).rstrip('.')}. The cluster may have it again ({why}) but did not within {wait:g} s "
                    f"({RESOURCE_WAIT_ENV}); a retry of the task tries again"
                ) from None


def _lost_nodes() -> list[str]:
    """The nodes the cluster lost (crashed, or preempted), each as ``<ip>: <Ray's reason>``."""
    import ray

    return [
        f"{node.get('NodeManagerAddress')}: {node.get('DeathReasonMessage') or 'no reason given'}"
        for node in ray.nodes()
        if not node.get("Alive") and node.get("DeathReason") in _LOST
    ]


def _autoscaler_limits(resources: Mapping[str, float]) -> dict[str, float]:
    """The most each resource could reach under the cluster's autoscaler (none without one)."""
    return {name: max(amount, resources.get(name, 0)) for name, amount in ray_compat.autoscaler_limits().items()}


def is_int(value: Any) -> bool:
    # A templated value rendered as text ("8") is refused rather than compared with ints.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
