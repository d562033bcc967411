"""Run a batch inference: plan ranges, skip committed ones, stream the rest through Ray Data.

Ray Data reads one task per pending range and runs each stage as an actor pool. This driver
consumes the stream, writes one Parquet file per range and commits a range as soon as all its
rows have arrived, so a crash loses at most the ranges in flight.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.config import ROW_ID_COLUMN, BatchInferenceConfig, Stage, TransformStage
from airflow_provider_raybatch.pipeline.errors import (
    ConfigError,
    InputChangedError,
    InputError,
    RayBatchError,
    StageError,
    TooManyErrorsError,
)
from airflow_provider_raybatch.pipeline.faults import crash_point
from airflow_provider_raybatch.pipeline.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.planner import Plan, input_changes, limit_rows, plan_input, select_ranges
from airflow_provider_raybatch.pipeline.ray_runtime import ray_session
from airflow_provider_raybatch.pipeline.resources import READ_CPUS, check_cluster_resources
from airflow_provider_raybatch.pipeline.stages import (
    ENGINE_ERROR,
    INTERNAL_PREFIX,
    RANGE_COLUMN,
    StageWorker,
    output_columns,
    rejects_table,
    resolve_predictor,
    split_by_range,
    split_rejected,
)
from airflow_provider_raybatch.pipeline.storage import (
    is_within,
    read_json,
    resolve,
    same_filesystem,
    static_prefix,
    write_json,
)

log = logging.getLogger(__name__)

#: Rows buffered per output row group: small Ray blocks must not become tiny row groups.
ROW_GROUP_ROWS = 65_536
PROGRESS_INTERVAL_S = 10.0


def run_batch_inference(
    config: BatchInferenceConfig,
    *,
    ray_address: str | None = None,
    namespace: str | None = None,
    plan_only: bool = False,
) -> dict[str, Any]:
    """Run ``config`` to completion and return its summary (JSON-serialisable).

    Everything that can be checked without Ray is checked first: settings, predictors, input
    files and columns, the output folder. A finished output returns at once, without Ray.

    :param ray_address: None starts an embedded local Ray (unless one is running in this
        process); ``"auto"`` joins the cluster this process runs on (a Ray Job's driver).
    :param namespace: the Ray namespace to join.
    :param plan_only: stop after the output is prepared (plan recorded, ``overwrite`` applied)
        and return the ranges instead (see :mod:`~airflow_provider_raybatch.pipeline.partitions`).
    """
    started = time.monotonic()
    config.validate()
    for stage in config.stages:
        resolve_predictor(stage)
    in_fs, in_path = resolve(config.input_path, config.storage_options)
    out_fs, out_path = resolve(config.output_path, config.storage_options)
    for fs in (in_fs, out_fs):
        fs.invalidate_cache()  # listings cached by an earlier run in this process may be stale
    in_root = static_prefix(in_path)
    if same_filesystem(in_fs, out_fs) and (is_within(out_path, in_root) or is_within(in_root, out_path)):
        raise ConfigError(
            f"output path {config.output_path!r} overlaps input path {config.input_path!r}: "
            "the output would be read back as input; choose a folder outside the input"
        )

    plan = plan_input(in_fs, in_path, config.input_path, config.columns, config.rows_per_range)
    plan = limit_rows(plan, config.max_rows)
    keep = _keep_columns(config, plan)
    _check_stage_inputs(config.stages[0], plan)
    ledger = OutputLedger(out_fs, out_path, config.output_path)
    committed = _open_output(config, plan, ledger)
    if plan_only:
        return {"ranges": [{"id": r.id, "rows": r.rows} for r in plan.ranges], "committed": sorted(committed)}
    plan = select_ranges(plan, config.range_ids)

    pending = [i for i, r in enumerate(plan.ranges) if r.id not in committed]
    progress = _Progress(plan, committed)
    for index in [i for i in pending if plan.ranges[i].rows == 0]:
        _commit_empty_range(ledger, plan, index, keep, config)
        progress.committed(index)
    pending = [i for i in pending if plan.ranges[i].rows > 0]
    if pending:
        log.info(
            "%d of %d ranges to process (%d rows); %d already committed",
            len(pending),
            len(plan.ranges),
            sum(plan.ranges[i].rows for i in pending),
            len(committed),
        )
        with ray_session(ray_address, namespace):
            # Transforms are built on the driver before anything is scheduled; a factory checks what it
            # needs first (the vLLM one: vllm importable here, GPUs in the cluster).
            transforms = {
                i: resolve_predictor(s)(s) for i, s in enumerate(config.stages) if isinstance(s, TransformStage)
            }
            check_cluster_resources([(s.display_name, s) for s in config.stages])
            _stream(config, plan, ledger, pending, keep, in_fs, progress, transforms)
    summary = progress.summary(config.output_path, time.monotonic() - started)
    _check_errors(config, progress)
    return summary


def _check_stage_inputs(stage: Stage, plan: Plan) -> None:
    missing = [c for c in stage.input_columns or [] if c not in plan.schema.names]
    if missing:
        raise InputError(
            f"stage {stage.display_name!r} reads column(s) {missing}, which the input does not have; "
            f"columns read: {plan.schema.names}"
        )


def _check_errors(config: BatchInferenceConfig, progress: _Progress) -> None:
    """Fail when more rows failed in a model than ``max_error_fraction`` allows (over the whole output)."""
    reached = progress.rows_out + progress.engine_errors
    if progress.engine_errors and progress.engine_errors > config.max_error_fraction * reached:
        raise TooManyErrorsError(_too_many_errors(config, progress.engine_errors, reached))


def _too_many_errors(config: BatchInferenceConfig, errors: int, reached: int) -> str:
    return (
        f"{errors} of {reached} rows that reached a model failed ({errors / max(reached, 1):.1%}), more than "
        f"max_error_fraction={config.max_error_fraction:g}; the errors are in {config.output_path.rstrip('/')}/_rejects/. "
        "A retry would count the same committed errors: fix the cause and rerun with mode='overwrite'."
    )


def write_job_summary(config: BatchInferenceConfig, submission_id: str, summary: dict[str, Any]) -> None:
    """Leave a Ray Job's summary in its output, where the task that submitted it reads it."""
    fs, path = resolve(config.output_path, config.storage_options)
    write_json(fs, OutputLedger(fs, path, config.output_path).job_summary_path(submission_id), summary)


def read_job_summary(config: BatchInferenceConfig, submission_id: str) -> dict[str, Any] | None:
    fs, path = resolve(config.output_path, config.storage_options)
    summary_path = OutputLedger(fs, path, config.output_path).job_summary_path(submission_id)
    fs.invalidate_cache()
    return read_json(fs, summary_path) if fs.exists(summary_path) else None


def _keep_columns(config: BatchInferenceConfig, plan: Plan) -> list[str]:
    names = plan.schema.names
    keep = list(names if config.keep_columns is None else config.keep_columns)
    if config.id_column is not None:
        if config.id_column not in names:
            raise InputError(f"id_column {config.id_column!r} is not an input column; columns read: {names}")
        if config.id_column not in keep:
            keep.insert(0, config.id_column)
    elif ROW_ID_COLUMN in names:
        raise InputError(
            f"the input already has a column {ROW_ID_COLUMN!r}; pass id_column={ROW_ID_COLUMN!r} to use it"
        )
    missing = [c for c in keep if c not in names]
    if missing:
        raise InputError(f"keep_columns {missing} are not input columns; columns read: {names}")
    return keep


def _open_output(config: BatchInferenceConfig, plan: Plan, ledger: OutputLedger) -> dict[str, dict[str, Any]]:
    """Check the output folder against the plan and return its committed ranges."""
    if config.range_ids is not None:
        return _open_partition(config, plan, ledger)
    recorded = ledger.load_plan()
    if recorded is not None:
        changes, job_diff = _differences(config, plan, recorded)
        same_run = config.run_key is not None and recorded.get("run_key") == config.run_key
        if config.mode == "overwrite" and (changes or job_diff or not same_run):
            log.info("mode='overwrite': removing %s", config.output_path)
            ledger.reset()
            recorded = None
        elif changes:
            raise InputChangedError(
                f"input {config.input_path!r} changed since the ranges of {config.output_path!r} were planned "
                f"({changes}). Results from the old and new input would be mixed; "
                "rerun with mode='overwrite' to start afresh."
            )
        elif job_diff:
            raise ConfigError(
                f"output {config.output_path!r} was started with different settings ({', '.join(job_diff)}); "
                "mixing results is refused. Use mode='overwrite' or another output path."
            )
    elif config.mode == "resume" and (foreign := ledger.foreign_entries()):
        raise ConfigError(
            f"output path {config.output_path!r} is not empty and was not written by raybatch "
            f"(found {foreign[:5]}); choose an empty folder or mode='overwrite'"
        )
    elif config.mode == "overwrite":
        ledger.reset()

    if recorded is None:
        ledger.write_plan(
            {
                "input_path": config.input_path,
                "input": plan.describe(),
                "job": config.job_signature(),
                "run_key": config.run_key,
            }
        )
        committed: dict[str, dict[str, Any]] = {}
    else:
        committed = ledger.committed()
    _remove_uncommitted(ledger, committed, None)
    return committed


def _open_partition(config: BatchInferenceConfig, plan: Plan, ledger: OutputLedger) -> dict[str, dict[str, Any]]:
    """Check an output planned by ``plan_partitions``; return this partition's committed ranges.

    Never writes the plan nor resets the output (``mode`` was applied by the planning step):
    tasks of other partitions may be writing to the same folder at the same time.
    """
    recorded = ledger.load_plan()
    if recorded is None:
        raise ConfigError(
            f"output {config.output_path!r} has not been planned: run plan_partitions (the planning task) "
            "on it before the tasks of its partitions"
        )
    changes, job_diff = _differences(config, plan, recorded)
    if changes:
        raise InputChangedError(
            f"input {config.input_path!r} changed since the partitions of {config.output_path!r} were planned "
            f"({changes}); rerun the planning task"
        )
    if job_diff:
        raise ConfigError(
            f"output {config.output_path!r} was planned with different settings ({', '.join(job_diff)}): "
            "the planning task and the partitions' tasks must be given the same arguments"
        )
    wanted = set(config.range_ids or ())
    committed = {range_id: r for range_id, r in ledger.committed().items() if range_id in wanted}
    _remove_uncommitted(ledger, committed, config.range_ids)
    return committed


def _differences(config: BatchInferenceConfig, plan: Plan, recorded: dict[str, Any]) -> tuple[Any, list[str]]:
    """How the input, and which settings of the job signature, differ from the recorded plan."""
    changes = input_changes(recorded["input"], plan)
    job_diff = sorted(k for k, v in config.job_signature().items() if recorded["job"].get(k) != v)
    return changes, job_diff


def _remove_uncommitted(
    ledger: OutputLedger, committed: dict[str, dict[str, Any]], range_ids: list[str] | None
) -> None:
    removed = ledger.remove_uncommitted(committed, range_ids)
    if removed:
        log.info("Removed %d file(s) of uncommitted ranges", len(removed))


def _commit_empty_range(
    ledger: OutputLedger, plan: Plan, index: int, keep: list[str], config: BatchInferenceConfig
) -> None:
    row_range = plan.ranges[index]
    tmp = None
    if plan.input_rows == 0 and row_range.file_index == 0:
        # An output with no rows still gets one (empty) file so that any Parquet reader opens it.
        fields = [pa.field(ROW_ID_COLUMN, pa.int64())] if config.id_column is None else []
        schema = pa.schema(fields + [plan.schema.field(c) for c in keep])
        tmp = ledger.tmp_file(row_range.id)
        with ledger.fs.open(tmp, "wb") as f:
            pq.write_table(schema.empty_table(), f)
    ledger.commit(row_range.id, tmp, 0)


def _stream(
    config: BatchInferenceConfig,
    plan: Plan,
    ledger: OutputLedger,
    pending: list[int],
    keep: list[str],
    in_fs: AbstractFileSystem,
    progress: _Progress,
    transforms: dict[int, Any],
) -> None:
    import ray
    from ray.data import DataContext

    from airflow_provider_raybatch.pipeline.datasource import RangeDatasource

    DataContext.get_current().enable_progress_bars = False  # progress goes to the log, see _Progress
    datasource = RangeDatasource(in_fs, plan, pending, keep, derive_row_id=config.id_column is None)
    # One block per range: left to itself, Ray Data splits each read task's output into many
    # small blocks (20 x 5,000 rows for 10 ranges), and the per-block task overhead halved the
    # pipeline's throughput in benchmarks/throughput.py. Ranges are split only when there are
    # fewer than replicas, so that every replica still gets work.
    replicas = max(s.max_replicas for s in config.stages)
    ds = ray.data.read_datasource(datasource, num_cpus=READ_CPUS, override_num_blocks=max(len(pending), replicas))
    for index, stage in enumerate(config.stages):
        if index in transforms:
            ds = transforms[index](ds)
            continue
        ds = ds.map_batches(
            StageWorker,
            fn_constructor_kwargs={"stage": stage},
            batch_format="pyarrow",
            zero_copy_batch=True,
            udf_modifying_row_count=False,
            **stage.map_batches_kwargs(),
        )
    writers = _RangeWriters(ledger, plan, progress, config)
    try:
        for block in ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2):
            if block.num_rows and RANGE_COLUMN not in block.column_names:
                raise StageError(
                    f"a transform stage dropped the internal columns (got {block.column_names}); "
                    f"its output must carry every column starting with {INTERNAL_PREFIX!r}"
                )
            for index, rows in split_by_range(block):
                accepted, rejected = split_rejected(rows)
                writers.write(index, output_columns(accepted), rejected)
        writers.check_done()
    finally:
        writers.abort()


@dataclass
class _OpenRange:
    path: str | None = None
    file: Any = None
    writer: pq.ParquetWriter | None = None
    buffered: list[pa.Table] = field(default_factory=list)
    buffered_rows: int = 0
    rows: int = 0
    rejects: list[pa.Table] = field(default_factory=list)
    rejected: int = 0


class _RangeWriters:
    """One Parquet file per range (and one of its rejects, if any), committed when its last row arrives."""

    def __init__(self, ledger: OutputLedger, plan: Plan, progress: _Progress, config: BatchInferenceConfig):
        self.ledger, self.plan, self.progress, self.config = ledger, plan, progress, config
        self.open: dict[int, _OpenRange] = {}

    def write(self, index: int, table: pa.Table, rejected: pa.Table) -> None:
        row_range = self.plan.ranges[index]
        current = self.open.setdefault(index, _OpenRange())
        if table.num_rows:
            if current.file is None:
                current.path = self.ledger.tmp_file(row_range.id)
                current.file = self.ledger.fs.open(current.path, "wb")
            current.buffered.append(table)
            current.buffered_rows += table.num_rows
            current.rows += table.num_rows
        if rejected.num_rows:
            current.rejects.append(rejects_table(rejected))  # rejects are few: kept in memory until commit
            current.rejected += rejected.num_rows
        received = current.rows + current.rejected
        if received > row_range.rows:
            raise RayBatchError(f"range {row_range.id} received {received} rows but holds {row_range.rows}")
        if received == row_range.rows:
            self._commit(index, current)
        elif current.buffered_rows >= ROW_GROUP_ROWS:
            self._flush(current)

    def _commit(self, index: int, current: _OpenRange) -> None:
        row_range = self.plan.ranges[index]
        if current.file is not None:
            if current.buffered:
                self._flush(current)
            current.writer.close()
            current.file.close()
        rejects_path, errors = None, 0
        if current.rejects:
            rejects = pa.concat_tables(current.rejects, promote_options="permissive")
            errors = int(pc.sum(pc.equal(rejects.column("kind"), ENGINE_ERROR)).as_py() or 0)
            rejects_path = self.ledger.tmp_file(f"rejects-{row_range.id}")
            with self.ledger.fs.open(rejects_path, "wb") as f:
                pq.write_table(rejects, f)
        del self.open[index]
        self.ledger.commit(row_range.id, current.path, current.rows, rejects_path, current.rejected, errors)
        crash_point("committed")
        self.progress.committed(index, current.rows, current.rejected, errors)
        # Past this many errors the fraction is over the limit whatever the remaining rows do: stop now.
        if self.progress.engine_errors > self.config.max_error_fraction * self.plan.total_rows:
            raise TooManyErrorsError(
                _too_many_errors(self.config, self.progress.engine_errors, self.progress.rows_reached)
            )

    def _flush(self, current: _OpenRange) -> None:
        try:
            table = pa.concat_tables(current.buffered, promote_options="permissive")
        except pa.ArrowInvalid as e:
            raise StageError(f"the stages returned batches with incompatible schemas: {e}") from e
        if current.writer is None:
            current.writer = pq.ParquetWriter(current.file, table.schema)
        elif table.schema != current.writer.schema:
            try:
                table = table.cast(current.writer.schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
                raise StageError(f"the stages returned batches with incompatible schemas: {e}") from e
        current.writer.write_table(table, row_group_size=max(table.num_rows, 1))
        current.buffered, current.buffered_rows = [], 0

    def check_done(self) -> None:
        if self.open:
            short = [self.plan.ranges[i].id for i in self.open]
            raise RayBatchError(f"the stream ended before ranges {short} were complete")

    def abort(self) -> None:
        for current in self.open.values():
            for closeable in (current.writer, current.file):
                try:
                    if closeable is not None:
                        closeable.close()
                except Exception:  # noqa: BLE001 - already failing; the next run removes the file
                    pass
        self.open.clear()


class _Progress:
    """Counts committed ranges and logs progress at most every PROGRESS_INTERVAL_S seconds."""

    def __init__(self, plan: Plan, committed: dict[str, dict[str, Any]]):
        self.plan = plan
        self.started = time.monotonic()
        self.last_log = self.started
        self.skipped = len(committed)
        self.rows_out = sum(r["rows"] for r in committed.values())
        self.rows_rejected = sum(r.get("rejected", 0) for r in committed.values())
        self.engine_errors = sum(r.get("engine_errors", 0) for r in committed.values())
        self.done = 0
        self.rows_processed = 0

    @property
    def rows_reached(self) -> int:
        """Rows that reached a model: written, or rejected with an engine error."""
        return self.rows_out + self.engine_errors

    def committed(self, index: int, rows: int | None = None, rejected: int = 0, engine_errors: int = 0) -> None:
        rows = self.plan.ranges[index].rows if rows is None else rows
        self.done += 1
        self.rows_processed += rows + rejected
        self.rows_out += rows
        self.rows_rejected += rejected
        self.engine_errors += engine_errors
        now = time.monotonic()
        if now - self.last_log >= PROGRESS_INTERVAL_S or self.skipped + self.done == len(self.plan.ranges):
            self.last_log = now
            rate = self.rows_processed / max(now - self.started, 1e-9)
            done_rows = self.rows_out + self.rows_rejected
            left = self.plan.total_rows - done_rows
            rejected = f" ({self.rows_rejected} rejected)" if self.rows_rejected else ""
            log.info(
                "Committed %d/%d ranges, %d/%d rows%s, %.0f rows/s, about %.0fs left",
                self.skipped + self.done,
                len(self.plan.ranges),
                done_rows,
                self.plan.total_rows,
                rejected,
                rate,
                left / rate if rate else 0,
            )

    def summary(self, output_path: str, seconds: float) -> dict[str, Any]:
        return {
            "output_path": output_path,
            "rows_in": self.plan.total_rows,
            "rows_out": self.rows_out,
            "rows_rejected": self.rows_rejected,
            "engine_errors": self.engine_errors,
            "rows_processed": self.rows_processed,
            "ranges_total": len(self.plan.ranges),
            "ranges_done": self.done,
            "ranges_skipped": self.skipped,
            "seconds": round(seconds, 3),
            "rows_per_second": round(self.rows_processed / seconds, 1) if seconds > 0 else 0.0,
        }
