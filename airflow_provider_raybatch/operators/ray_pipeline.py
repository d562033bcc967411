"""What every operator of this provider shares: build a pipeline config, run it on Ray."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseHook, BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.operators.assets import attach_summary, resolve_asset
from airflow_provider_raybatch.operators.lineage import operator_lineage
from airflow_provider_raybatch.operators.params import check_paths
from airflow_provider_raybatch.operators.partitions import run_plan_partitions
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.errors import ConfigError, InputError

if TYPE_CHECKING:
    from airflow.sdk import Context


#: ``asset`` not given: derive it from the output path.
_DERIVED: Any = object()


class RayPipelineOperator(BaseOperator):
    """Base of the provider's operators: Parquet in, a chain of stages on Ray Data, Parquet out.

    A subclass says which stages to run (:meth:`build_stages`); this class plans checkpointed
    row ranges and runs them, and returns the run's summary (to XCom).

    :param input_path: a Parquet file, folder or glob, local or ``s3://`` (templated).
    :param output_path: the output folder (templated); must not overlap the input.
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
    :param max_rows: a smoke run: process only the input's first ``max_rows`` rows (templated).
        Recorded with the output, so a limited output is never resumed by a full run: give smoke
        runs their own output path.
    :param asset: the output's Asset, declared as an outlet; its event's ``extra`` holds the summary.
        Default: derived from ``output_path``'s static prefix (``file:///data/preds`` for
        ``/data/preds/{{ ds }}``), none if it has none; an ``Asset`` or URI; None: no outlet.
    :param plan_partitions: plan the output into at most this many partitions and return them
        (a list, for ``.expand(partition=...)``) instead of running. Use the same other arguments
        as the mapped task.
    :param partition: one item of a planning task's result: process only its ranges. Set by
        dynamic task mapping: ``.partial(...).expand(partition=plan.output)``. Such a task never
        resets the output (``mode`` is applied by the planning task) and touches only its ranges.
    """

    template_fields: Sequence[str] = ("input_path", "output_path", "columns", "keep_columns", "mode", "max_rows")

    def __init__(
        self,
        *,
        input_path: str,
        output_path: str,
        columns: list[str] | None = None,
        keep_columns: list[str] | None = None,
        id_column: str | None = None,
        rows_per_range: int = 100_000,
        mode: str = "resume",
        ray_conn_id: str | None = RayHook.default_conn_name,
        aws_conn_id: str | None = None,
        max_rows: int | None = None,
        asset: Asset | str | None = _DERIVED,
        plan_partitions: int | None = None,
        partition: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_rows = max_rows
        self.plan_partitions = plan_partitions
        self.partition = partition
        # A planning task writes no rows; the tasks of a mapped run would each emit an event for
        # their part: by default neither declares the asset (declare it on a task after them).
        derived_none = asset is _DERIVED and (plan_partitions is not None or partition is not None)
        self.asset = None if derived_none else resolve_asset(asset, output_path, _DERIVED)
        if self.asset is not None:
            self.outlets = [*self.outlets, self.asset]
        self.input_path = input_path
        self.output_path = output_path
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

    def build_stages(self, context: Context) -> list[Stage]:
        """The stages to run, in order, from the operator's (rendered) arguments."""
        raise NotImplementedError

    def build_config(self, context: Context) -> BatchInferenceConfig:
        from airflow_provider_raybatch.pipeline.partitions import partition_range_ids

        ti = context["ti"]
        check_paths(input_path=self.input_path, output_path=self.output_path)
        return BatchInferenceConfig(
            input_path=self.input_path,
            output_path=self.output_path,
            stages=self.build_stages(context),
            columns=self.columns,
            keep_columns=self.keep_columns,
            id_column=self.id_column,
            rows_per_range=self.rows_per_range,
            mode=self.mode,
            run_key=f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{ti.map_index}",
            storage_options=storage_options(self.aws_conn_id),
            max_rows=self.max_rows,
            range_ids=None if self.partition is None else partition_range_ids(self.partition),
        )

    def execute(self, context: Context) -> dict[str, Any] | list[dict[str, Any]]:
        from airflow_provider_raybatch.pipeline.runner import run_batch_inference

        if self.plan_partitions is not None:
            return run_plan_partitions(self, context)
        try:
            summary = run_batch_inference(self.build_config(context), ray_address=self.hook.ray_address)
        except (ConfigError, InputError) as e:
            # Bad settings or input: a retry would fail the same way, so fail without retrying.
            raise AirflowFailException(str(e)) from e
        self.log.info("Batch inference summary: %s", summary)
        attach_summary(context, self.asset, summary)
        return summary

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The input and output folders as OpenLineage datasets (None without the OpenLineage provider)."""
        return operator_lineage(self.input_path, self.output_path)


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
