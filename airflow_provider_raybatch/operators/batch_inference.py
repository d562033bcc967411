"""Batch inference over Parquet with any Ray Data predictor, checkpointed by row range."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.operators.arguments import RESOURCE_ARGUMENTS, resource_param_docs, resource_values
from airflow_provider_raybatch.operators.ray_pipeline import RayPipelineOperator
from airflow_provider_raybatch.operators.rendered import rendered_replica_resources
from airflow_provider_raybatch.pipeline.config import Stage
from airflow_provider_raybatch.pipeline.resources import AUTO, ReplicaResources

if TYPE_CHECKING:
    from airflow.sdk import Context


class RayBatchInferenceOperator(RayPipelineOperator):
    """Run one predictor, or a chain of stages, over Parquet input on Ray Data; write Parquet.

    The input is planned into deterministic row ranges; each range's output is committed
    atomically, so a retried or restarted task resumes where it stopped and writes every row
    exactly once. A rerun on a finished output returns its summary at once.

    A predictor is what Ray Data's batch inference guide shows: a class built once per replica
    with ``predictor_kwargs`` whose ``__call__(batch)`` returns a dict of columns, or a function
    ``fn(batch, **predictor_kwargs)``. The output holds ``keep_columns`` plus what the last
    stage returns. Paths, columns, checkpointing and connections are the parameters of
    :class:`~airflow_provider_raybatch.operators.ray_pipeline.RayPipelineOperator`; the resource
    arguments (``batch_size`` to ``ray_resources``, last below) are those of the predictor's replicas
    (each of ``stages`` has its own).

    :param predictor: a class or function, or its import path ``"pkg.module:Name"``.
        Exclusive with ``stages``.
    :param predictor_kwargs: constructor kwargs of a class, extra kwargs of a function (templated).
    :param stages: a chain of :class:`~airflow_provider_raybatch.pipeline.config.Stage`, each with
        its own predictor and resources, e.g. a CPU preprocessing stage then a GPU model (templated).
    :param batch_format: what the predictor receives: ``"numpy"`` (default), ``"pandas"``, ``"pyarrow"``.
    """

    # Resources are templated so that a DAG's Params can set them (with render_template_as_native_obj=True).
    template_fields: Sequence[str] = (
        *RayPipelineOperator.template_fields,
        "predictor_kwargs",
        "stages",
        "batch_size",
        "concurrency",
        "num_cpus",
        "num_gpus",
    )
    template_fields_renderers = {"predictor_kwargs": "json"}
    #: The replicas' resources it takes (a predictor's replica works on one batch at a time).
    resource_arguments = tuple(name for name in RESOURCE_ARGUMENTS if name != "max_concurrent_batches")
    ui_color = "#d7ecfb"

    def __init__(
        self,
        *,
        predictor: str | Callable[..., Any] | type | None = None,
        predictor_kwargs: dict[str, Any] | None = None,
        stages: list[Stage] | None = None,
        batch_size: int | None = ReplicaResources.batch_size,
        # Unlike a Stage's, the operator's replicas fill the cluster's CPUs unless told (a Stage keeps one).
        concurrency: int | tuple[int, int] | None = AUTO,
        num_cpus: float = ReplicaResources.num_cpus,
        num_gpus: float = ReplicaResources.num_gpus,
        memory: int | None = ReplicaResources.memory,
        accelerator_type: str | None = ReplicaResources.accelerator_type,
        ray_resources: dict[str, float] | None = ReplicaResources.resources,
        batch_format: str = "numpy",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (predictor is None) == (stages is None):
            raise ValueError(f"{self.task_id}: pass exactly one of predictor or stages")
        self.predictor = predictor
        self.predictor_kwargs = predictor_kwargs or {}
        self.stages = stages
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.memory = memory
        self.accelerator_type = accelerator_type
        self.ray_resources = ray_resources
        self.batch_format = batch_format

    def replica_resources(self) -> ReplicaResources:
        """The predictor replicas' resources, from the rendered arguments."""
        return rendered_replica_resources(**resource_values(self))

    def build_stages(self, context: Context) -> list[Stage]:
        if self.stages is not None:
            return list(self.stages)
        return [
            Stage(
                self.predictor,
                self.predictor_kwargs,
                batch_format=self.batch_format,
                **self.replica_resources().resource_kwargs(),
            )
        ]


RayBatchInferenceOperator.__doc__ = (RayBatchInferenceOperator.__doc__ or "").rstrip() + resource_param_docs(
    RayBatchInferenceOperator,
    notes={
        "concurrency": "Default here: None (each replica reads, scores and writes its own rows).",
        "num_cpus": "A replica's torch and Arrow use as many threads (whole CPUs, at least one), as Ray's "
        "``OMP_NUM_THREADS`` says; a predictor that sets its own thread count keeps it.",
    },
)
