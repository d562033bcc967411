"""Batch inference over Parquet with any Ray Data predictor, checkpointed by row range."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook, BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.errors import ConfigError, InputError

if TYPE_CHECKING:
    from airflow.sdk import Context


class RayBatchInferenceOperator(BaseOperator):
    """Run one predictor, or a chain of stages, over Parquet input on Ray Data; write Parquet.

    The input is planned into deterministic row ranges; each range's output is committed
    atomically, so a retried or restarted task resumes where it stopped and writes every row
    exactly once. A rerun on a finished output returns its summary at once.

    A predictor is what Ray Data's batch inference guide shows: a class built once per replica
    with ``predictor_kwargs`` whose ``__call__(batch)`` returns a dict of columns, or a function
    ``fn(batch, **predictor_kwargs)``. The output holds ``keep_columns`` plus what the last
    stage returns.

    :param input_path: a Parquet file, folder or glob, local or ``s3://`` (templated).
    :param output_path: the output folder (templated); must not overlap the input.
    :param predictor: a class or function, or its import path ``"pkg.module:Name"``.
        Exclusive with ``stages``.
    :param predictor_kwargs: constructor kwargs of a class, extra kwargs of a function (templated).
    :param stages: a chain of :class:`~airflow_provider_raybatch.pipeline.config.Stage`, each with
        its own predictor and resources, e.g. a CPU preprocessing stage then a GPU model (templated).
    :param batch_size: rows per predictor call.
    :param concurrency: replicas of the predictor: an int, or ``(min, max)`` to autoscale.
    :param num_cpus: CPUs per replica (fractions allowed).
    :param num_gpus: GPUs per replica.
    :param memory: bytes of memory per replica.
    :param accelerator_type: Ray accelerator type per replica, e.g. ``"A10G"``.
    :param batch_format: what the predictor receives: ``"numpy"`` (default), ``"pandas"``, ``"pyarrow"``.
    :param columns: input columns to read (None: all) (templated).
    :param keep_columns: input columns written to the output (None: every column read) (templated).
    :param id_column: a unique row key of the input, always written; None writes ``_row_id``
        derived from (file, row).
    :param rows_per_range: rows per checkpointed range (cut at row-group boundaries).
    :param mode: ``"resume"`` (default) skips committed ranges; ``"overwrite"`` starts the output
        afresh once per DAG run (a retry of the same run resumes) (templated).
    :param ray_conn_id: the ``ray`` connection; no such connection (or None): embedded local Ray.
    :param aws_conn_id: an Airflow AWS connection whose credentials (and ``endpoint_url``,
        ``region_name`` extras) are used for ``s3://`` paths; None: the environment's.
    """

    template_fields: Sequence[str] = (
        "input_path",
        "output_path",
        "predictor_kwargs",
        "stages",
        "columns",
        "keep_columns",
        "mode",
    )
    template_fields_renderers = {"predictor_kwargs": "json"}
    ui_color = "#d7ecfb"

    def __init__(
        self,
        *,
        input_path: str,
        output_path: str,
        predictor: str | Callable[..., Any] | type | None = None,
        predictor_kwargs: dict[str, Any] | None = None,
        stages: list[Stage] | None = None,
        batch_size: int | None = 256,
        concurrency: int | tuple[int, int] = 1,
        num_cpus: float = 1,
        num_gpus: float = 0,
        memory: int | None = None,
        accelerator_type: str | None = None,
        batch_format: str = "numpy",
        columns: list[str] | None = None,
        keep_columns: list[str] | None = None,
        id_column: str | None = None,
        rows_per_range: int = 100_000,
        mode: str = "resume",
        ray_conn_id: str | None = RayHook.default_conn_name,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (predictor is None) == (stages is None):
            raise ValueError(f"{self.task_id}: pass exactly one of predictor or stages")
        self.input_path = input_path
        self.output_path = output_path
        self.predictor = predictor
        self.predictor_kwargs = predictor_kwargs or {}
        self.stages = stages
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.memory = memory
        self.accelerator_type = accelerator_type
        self.batch_format = batch_format
        self.columns = columns
        self.keep_columns = keep_columns
        self.id_column = id_column
        self.rows_per_range = rows_per_range
        self.mode = mode
        self.ray_conn_id = ray_conn_id
        self.aws_conn_id = aws_conn_id

    @cached_property
    def hook(self) -> RayHook:
        return RayHook(ray_conn_id=self.ray_conn_id)

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_raybatch.pipeline.runner import run_batch_inference

        try:
            summary = run_batch_inference(self.build_config(context), ray_address=self.hook.ray_address)
        except (ConfigError, InputError) as e:
            # Bad settings or input: a retry would fail the same way, so fail without retrying.
            raise AirflowFailException(str(e)) from e
        self.log.info("Batch inference summary: %s", summary)
        return summary

    def build_config(self, context: Context) -> BatchInferenceConfig:
        stages = self.stages or [
            Stage(
                predictor=self.predictor,
                predictor_kwargs=self.predictor_kwargs,
                batch_size=self.batch_size,
                concurrency=self.concurrency,
                num_cpus=self.num_cpus,
                num_gpus=self.num_gpus,
                memory=self.memory,
                accelerator_type=self.accelerator_type,
                batch_format=self.batch_format,
            )
        ]
        ti = context["ti"]
        return BatchInferenceConfig(
            input_path=self.input_path,
            output_path=self.output_path,
            stages=list(stages),
            columns=self.columns,
            keep_columns=self.keep_columns,
            id_column=self.id_column,
            rows_per_range=self.rows_per_range,
            mode=self.mode,
            run_key=f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{ti.map_index}",
            storage_options=storage_options(self.aws_conn_id),
        )


def storage_options(aws_conn_id: str | None) -> dict[str, Any]:
    """fsspec (s3fs) options from an Airflow AWS connection; empty: s3fs reads the environment."""
    if aws_conn_id is None:
        return {}
    conn = BaseHook.get_connection(aws_conn_id)
    extra = conn.extra_dejson
    options: dict[str, Any] = {}
    client_kwargs = {k: extra[k] for k in ("endpoint_url", "region_name") if extra.get(k)}
    if client_kwargs:
        options["client_kwargs"] = client_kwargs
    if conn.login:
        options.update(key=conn.login, secret=conn.password)
    if extra.get("aws_session_token"):
        options["token"] = extra["aws_session_token"]
    return options
