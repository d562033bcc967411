"""What every operator of this provider shares: build a pipeline config, run it on Ray.

With no cluster configured the pipeline runs in the task on an embedded local Ray; with a
cluster, as a Ray Job that any try of the task finds again (:mod:`airflow_provider_raybatch.runners`).
The planning task of a mapped run goes the same way. This module keeps Airflow's concerns: the
arguments as rendered, the job's link, waiting or deferring, which failures are retried, XCom.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from airflow.sdk import Asset, BaseOperator

from airflow_provider_raybatch.assets import attach_summary, resolve_asset
from airflow_provider_raybatch.hooks.iceberg_catalog import IcebergCatalogHook
from airflow_provider_raybatch.hooks.jobs_types import JobInfo, RayJobsError
from airflow_provider_raybatch.hooks.object_stores import storage_options
from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.lineage import operator_lineage
from airflow_provider_raybatch.links.ray import RayJobLink
from airflow_provider_raybatch.operators.arguments import shared_param_docs
from airflow_provider_raybatch.operators.job_following import RayJobFollowing
from airflow_provider_raybatch.operators.rendered import (
    check_paths,
    rendered_columns,
    rendered_error_fraction,
    rendered_number,
    rendered_seconds,
)
from airflow_provider_raybatch.operators.try_story import told
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, Stage, TableOutput, check_output_format
from airflow_provider_raybatch.pipeline.errors import ConfigError, NotRetryableError
from airflow_provider_raybatch.runners.factory import runner_for
from airflow_provider_raybatch.version_compat import (
    AirflowFailException,
    AirflowProviderDeprecationWarning,
    AirflowTaskTimeout,
    conf,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_raybatch.pipeline.shards import Shard
    from airflow_provider_raybatch.pipeline.summary import RunSummary

#: ``asset`` not given: derive it from the output path.
_DERIVED: Any = object()
#: The defaults of the arguments the operator shares with the config are the config's.
_CONFIG = BatchInferenceConfig


class RayPipelineOperator(RayJobFollowing, BaseOperator):
    """Base of the provider's operators: Parquet in, a chain of stages on Ray Data, Parquet out.

    A subclass says which stages to run (:meth:`build_stages`); this class plans checkpointed
    row ranges and runs them, and returns the run's summary (to XCom). The arguments it shares with
    :class:`~airflow_provider_raybatch.pipeline.config.BatchInferenceConfig` (and ``table_*`` with
    :class:`~airflow_provider_raybatch.pipeline.config.TableOutput`) are described there, once;
    their ``:param:`` lines below are composed from it, with how the operator renders them.

    :param output_format: ``"parquet"`` (default: a folder of Parquet files), ``"delta"`` (a Delta
        Lake table; the ``delta`` extra) or ``"iceberg"`` (an Apache Iceberg table; the ``iceberg``
        extra). A table gets this run's rows exactly once, in table commits naming the ranges they
        add (see docs/tables.md); ``mode="overwrite"`` replaces the run's partition in one commit.
    :param table: the Iceberg table, ``"namespace.table"`` (templated); created on first write.
    :param table_partition: the table partition this task writes, column -> value (templated);
        default ``{"ds": "{{ ds }}"}``: one partition per logical date, a string column ``ds``
        added to every row.
    :param iceberg_conn_id: the Iceberg catalog's connection (:class:`~airflow_provider_raybatch.hooks.iceberg_catalog.IcebergCatalogHook`);
        when it does not exist, the SQL catalog on SQLite under ``$AIRFLOW_HOME/raybatch/iceberg/``.
    :param ray_conn_id: the ``ray`` connection; no such connection (or None): embedded local Ray.
    :param aws_conn_id: an Airflow AWS connection for ``s3://`` paths, resolved by the Amazon
        provider's hook (keys, profile, assumed role, region, endpoint; the ``amazon`` extra);
        None: the environment's credentials.
    :param gcp_conn_id: a ``google_cloud_platform`` connection for ``gs://`` paths (the ``google``
        extra); None: the environment's (application default credentials).
    :param azure_conn_id: an Azure Blob Storage (``wasb``) connection for ``abfs://`` / ``az://``
        paths, resolved by the Azure provider's ``WasbHook`` (the ``azure`` extra); None: the
        environment's (adlfs reads ``AZURE_STORAGE_*`` variables or DefaultAzureCredential).
        Credentials are resolved by the task before any Ray work (a connection that is missing or
        yields none fails the task at once, naming it) and given to fsspec only. A job on a
        cluster never receives them: it uses the cluster's own credentials.
    :param deferrable: on a cluster, wait for the job in the triggerer instead of a worker slot.
    :param poll_interval: seconds between job status checks on a cluster.
    :param asset: the output's Asset, declared as an outlet; its event's ``extra`` holds the summary.
        Default: derived from ``output_path``'s static prefix (``file:///data/preds`` for
        ``/data/preds/{{ ds }}``), none if it has none; an ``Asset`` or URI; None: no outlet.
    :param plan_shards: plan the output into at most this many shards (groups of its ranges) and
        return them (a list, for ``.expand(shard=...)``) instead of running. Use the same other arguments
        as the mapped task. With a cluster the planning is a Ray Job (waited for like a run,
        ``deferrable`` included) that reads the input's Parquet footers on the cluster, with Ray
        tasks for many files; without one, the task reads them.
    :param shard: one item of a planning task's result: process only its ranges. Set by
        dynamic task mapping: ``.partial(...).expand(shard=plan.output)``. Such a task never
        resets the output (``mode`` is applied by the planning task) and touches only its ranges.
        With a table output, the mapped tasks write one partition of the table as their planning
        task's writer (see docs/operators/tables.md).
    :param plan_partitions: deprecated name of ``plan_shards``.
    :param partition: deprecated name of ``shard``.
    """

    template_fields: Sequence[str] = (
        "input_path",
        "output_path",
        "table",
        "table_partition",
        "columns",
        "keep_columns",
        "mode",
        "max_rows",
        "max_error_fraction",
        "progress_timeout",
        # Kept in the task instance's rendered fields, where the UI plugin finds its output and connections.
        "output_format",
        "aws_conn_id",
        "gcp_conn_id",
        "azure_conn_id",
        "iceberg_conn_id",
    )
    operator_extra_links = (RayJobLink(),)

    def __init__(
        self,
        *,
        input_path: str,
        output_path: str,
        columns: list[str] | None = _CONFIG.columns,
        keep_columns: list[str] | None = _CONFIG.keep_columns,
        id_column: str | None = _CONFIG.id_column,
        rows_per_range: int = _CONFIG.rows_per_range,
        mode: Literal["resume", "overwrite"] = _CONFIG.mode,
        ray_conn_id: str | None = RayHook.default_conn_name,
        aws_conn_id: str | None = None,
        gcp_conn_id: str | None = None,
        azure_conn_id: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 5.0,
        max_rows: int | None = _CONFIG.max_rows,
        max_error_fraction: float = _CONFIG.max_error_fraction,
        lease_timeout: float = _CONFIG.lease_timeout,
        progress_timeout: float | timedelta | None = _CONFIG.progress_timeout,
        asset: Asset | str | None = _DERIVED,
        plan_shards: int | None = None,
        shard: dict[str, Any] | None = None,
        output_format: str = "parquet",
        table: str | None = None,
        table_partition: dict[str, str] | None = None,
        iceberg_conn_id: str | None = IcebergCatalogHook.default_conn_name,
        table_commit_interval: float = TableOutput.commit_interval,
        table_add_columns: bool = TableOutput.add_columns,
        plan_partitions: int | None = None,
        partition: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.output_format = output_format
        self.table = table
        self.table_partition = {"ds": "{{ ds }}"} if table_partition is None else table_partition
        self.iceberg_conn_id = iceberg_conn_id
        self.table_commit_interval = table_commit_interval
        self.table_add_columns = table_add_columns
        self.max_rows = max_rows
        self.max_error_fraction = max_error_fraction
        self.lease_timeout = lease_timeout
        self.progress_timeout = progress_timeout
        self.plan_shards = _renamed("plan_shards", plan_shards, "plan_partitions", plan_partitions)
        self.shard = _renamed("shard", shard, "partition", partition)
        # A planning task writes no rows; the tasks of a mapped run would each emit an event for
        # their part: by default neither declares the asset (declare it on a task after them).
        derived_none = asset is _DERIVED and (self.plan_shards is not None or self.shard is not None)
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
        self.gcp_conn_id = gcp_conn_id
        self.azure_conn_id = azure_conn_id
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.submission_id: str | None = None

    @property
    def partition(self) -> dict[str, Any] | None:
        """Deprecated name of :attr:`shard`, which a DAG's ``map_index_template`` may still read."""
        warnings.warn("partition is deprecated: use shard", AirflowProviderDeprecationWarning, stacklevel=2)
        return self.shard

    @cached_property
    def hook(self) -> RayHook:
        return RayHook(ray_conn_id=self.ray_conn_id)

    def build_stages(self, context: Context) -> list[Stage]:
        """The stages to run, in order, from the operator's (rendered) arguments."""
        raise NotImplementedError

    def build_config(self, context: Context) -> BatchInferenceConfig:
        from airflow_provider_raybatch.pipeline.shards import Shard

        ti = context["ti"]
        check_paths(input_path=self.input_path, output_path=self.output_path)
        config = BatchInferenceConfig(
            input_path=self.input_path,
            output_path=self.output_path,
            stages=self.build_stages(context),
            columns=rendered_columns("columns", self.columns),
            keep_columns=rendered_columns("keep_columns", self.keep_columns),
            id_column=self.id_column,
            rows_per_range=self.rows_per_range,
            mode=self.mode,
            run_key=f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{ti.map_index}",
            storage_options=self._storage_options(),
            max_rows=rendered_number("max_rows", self.max_rows, int, "an integer >= 1 or None", optional=True),
            max_error_fraction=rendered_error_fraction(self.max_error_fraction),
            try_number=ti.try_number,
            lease_timeout=self.lease_timeout,
            progress_timeout=rendered_seconds(self.progress_timeout),
            range_ids=None if self.shard is None else Shard.from_dict(self.shard).range_ids,
            table=self._table_output(context),
        )
        # Rendered values are checked before any Ray work: a bad one fails the task without retries.
        config.validate()
        return config

    def _storage_options(self) -> dict[str, Any]:
        """fsspec options for the paths, from the task's store connections."""
        return storage_options(self.aws_conn_id, self.gcp_conn_id, self.azure_conn_id)

    def _table_output(self, context: Context) -> TableOutput | None:
        """The table the output is, from the (rendered) table arguments; None for a Parquet folder."""
        if self.output_format == "parquet":
            return None
        check_output_format(self.output_format)
        ti = context["ti"]
        writer = f"{ti.dag_id}.{ti.task_id}" + (f".{ti.map_index}" if ti.map_index >= 0 else "")
        generation = None
        if self.shard is not None:
            from airflow_provider_raybatch.pipeline.shards import Shard

            # The tasks of a mapped run write as one writer, their planning task, into its generation.
            planned = Shard.from_dict(self.shard)
            if planned.writer is None or planned.generation is None:
                raise ConfigError(
                    f"shard {planned.index} was planned for a Parquet folder: give the planning task "
                    f"output_format={self.output_format!r} too"
                )
            writer, generation = planned.writer, planned.generation
        return TableOutput(
            self.output_format,  # type: ignore[arg-type]
            partition={str(k): str(v) for k, v in (self.table_partition or {}).items()},
            writer=writer,
            identifier=self.table,
            catalog=IcebergCatalogHook(self.iceberg_conn_id).catalog_properties()
            if self.output_format == "iceberg"
            else {},
            commit_interval=self.table_commit_interval,
            add_columns=self.table_add_columns,
            generation=generation,
        )

    def execute(self, context: Context) -> dict[str, Any] | list[dict[str, Any]]:
        with told(context) as story, _fail_without_retry():
            config = self.build_config(context)
            planning = self.plan_shards is not None
            if planning:
                from airflow_provider_raybatch.pipeline.shards import check_shards

                check_shards(config, self.plan_shards)
            runner = runner_for(self.hook, context["ti"], context.get("task_state_store"))
            try:
                outcome = runner.plan(config, self.plan_shards) if planning else runner.run(config)
                if isinstance(outcome, JobInfo):
                    ended = self._follow_job(context, runner, outcome, config)
                    outcome = self._job_result(runner, ended, config.output_path, config.storage_options, planning)
            except RayJobsError as e:
                self._unfollowed(context, str(e))
            return self._done(context, outcome, config.max_rows, story)

    def execute_complete(
        self,
        context: Context,
        event: dict[str, Any],
        output_path: str | None = None,
        planning: bool | None = None,
        max_rows: int | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Resume after the trigger fired: the job ended, timed out, or could not be followed.

        :param output_path: the output the job writes; ``planning``: whether it plans shards;
            ``max_rows``: the run's (rendered) limit. Given by the deferring try; a task deferred by
            an earlier version of the provider, which gave none, takes them from its arguments.
        """
        from airflow_provider_raybatch.hooks.jobs_types import JobStatus, WaitOutcome

        self.submission_id = event["submission_id"]
        # A trigger of an earlier version (a task deferred across an upgrade) put its outcome in ``status``.
        legacy = {"TIMEOUT": WaitOutcome.TIMED_OUT, "ERROR": WaitOutcome.UNREACHABLE}
        outcome = event.get("outcome") or legacy.get(event["status"], WaitOutcome.ENDED)
        if outcome == WaitOutcome.TIMED_OUT:
            raise AirflowTaskTimeout(event["message"])
        if outcome == WaitOutcome.UNREACHABLE:
            self._unfollowed(context, event["message"])
        info = JobInfo(
            self.submission_id, JobStatus(event["status"]), event.get("message", ""), event.get("driver_exit_code")
        )
        if output_path is None:
            output_path, planning = self.output_path, self.plan_shards is not None
            max_rows = rendered_number("max_rows", self.max_rows, int, "an integer >= 1 or None", optional=True)
        runner = runner_for(self.hook, context["ti"], context.get("task_state_store"))
        with told(context) as story, _fail_without_retry():
            result = self._job_result(runner, info, output_path, self._storage_options(), bool(planning))
            return self._done(context, result, max_rows, story)

    def _done(
        self, context: Context, outcome: RunSummary | list[Shard], max_rows: int | None, story: dict[str, Any]
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """The task's XCom result: the run's summary (also on the asset's event, and in the try's
        ``story`` for the UI: :mod:`.try_story`), or the shards."""
        if isinstance(outcome, list):
            self.log.info("Shards: %s", [(p.index, len(p.range_ids), p.rows) for p in outcome])
            return [p.to_dict() for p in outcome]
        story["summary"] = outcome
        summary = outcome.to_dict()
        self.log.info("Batch inference summary: %s", summary)
        if max_rows is not None and self.asset is not None:
            # A smoke run's output is not what the asset stands for: consumers must not run on it.
            # Airflow emits an event for each of the task's outlets once it succeeds.
            self.outlets = [outlet for outlet in self.outlets if outlet != self.asset]
            self.log.info("A smoke run (max_rows=%s): no event on the asset %s", max_rows, self.asset.uri)
        else:
            attach_summary(context, self.asset, summary)
        return summary

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The input folder and the output folder or table as OpenLineage datasets (None without the
        OpenLineage provider)."""
        if self.output_format != "iceberg":
            return operator_lineage(self.input_path, self.output_path)
        catalog = IcebergCatalogHook(self.iceberg_conn_id).catalog_properties()
        return operator_lineage(self.input_path, self.output_path, self.table, catalog)


RayPipelineOperator.__doc__ = (RayPipelineOperator.__doc__ or "").rstrip() + shared_param_docs()


@contextmanager
def _fail_without_retry() -> Iterator[None]:
    """Bad settings or input, a stage that breaks its contract, or committed engine errors: a retry
    would fail the same way.

    Not chained to the error: its message names what is at fault, and a chained traceback would
    print it a second time in the task log.
    """
    try:
        yield
    except NotRetryableError as e:
        raise AirflowFailException(str(e)) from None


def _renamed(name: str, value: Any, old_name: str, old_value: Any) -> Any:
    """The argument ``name``'s value, or that of its deprecated name ``old_name`` (with a warning).

    :raises ConfigError: both are given.
    """
    if old_value is None:
        return value
    if value is not None:
        raise ConfigError(f"{old_name} is the deprecated name of {name}: give {name} only, not both")
    warnings.warn(f"{old_name} is deprecated: use {name}", AirflowProviderDeprecationWarning, stacklevel=3)
    return old_value
