"""Everything a run checks and prepares before Ray starts: settings, the input's plan, the output folder.

Running (:mod:`.runner`) and planning the shards of a mapped run (:mod:`.shards`) both
start here, so an output is always prepared the same way: the plan recorded (or checked against
the recorded one), ``mode="overwrite"`` applied once per run, the committed ranges read, and the
files of uncommitted ranges removed.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.commit.commit_log import PER_RANGE_RECORDS, PLAN_VERSION, SEGMENT_FANOUT
from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord
from airflow_provider_raybatch.pipeline.commit.lease import Lease, LeaseHolder
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.commit.plan_record import PlanRecord
from airflow_provider_raybatch.pipeline.config import ROW_ID_COLUMN, BatchInferenceConfig
from airflow_provider_raybatch.pipeline.errors import ConfigError, InputChangedError, InputError
from airflow_provider_raybatch.pipeline.execution.predictors import resolve_predictor
from airflow_provider_raybatch.pipeline.output_location import check_output_location
from airflow_provider_raybatch.pipeline.planning.planner import (
    Plan,
    input_changes,
    limit_rows,
    plan_input,
    select_ranges,
)
from airflow_provider_raybatch.pipeline.store.files import resolve

if TYPE_CHECKING:
    from airflow_provider_raybatch.pipeline.tables.staging import Generation

log = logging.getLogger(__name__)

#: Segments found at the start of a whole-output run above which they are folded into the manifest
#: before it starts (a finished run folds its own at the end).
MAX_SEGMENTS_AT_START = 4 * SEGMENT_FANOUT


@dataclass
class PreparedRun:
    """A run ready to start: what is left to do is ``plan``'s ranges not in ``committed``.

    :param plan: the input's plan (limited by ``max_rows``; restricted to ``range_ids`` for a partition).
    :param ledger: the output's bookkeeping.
    :param committed: range id -> commit record of the ranges (of the partition) already committed.
    :param keep: input columns carried to the output (the row key first).
    :param in_fs: the input's filesystem.
    :param lease: this writer's lease on the output (or on the partition's ranges), held until
        :meth:`release`; every commit and removal of ``ledger`` checks it first.
    :param generation: a table output's generation, whose staging output ``ledger`` keeps.
    """

    plan: Plan
    ledger: OutputLedger
    committed: dict[str, CommitRecord]
    keep: list[str]
    in_fs: AbstractFileSystem
    lease: Lease
    generation: Generation | None = None

    def release(self) -> None:
        """Fold this writer's commit records together (:meth:`OutputLedger.finish`), then give the lease back.

        Best effort: the records are durable already, and a failure here (often the very one the
        run is ending on) must not hide the run's own error.
        """
        try:
            self.ledger.finish()
        except Exception as e:  # noqa: BLE001 - see above; the next whole-output run folds them
            log.warning("Could not fold the commit records of %s together: %s", self.ledger.display_path, e)
        self.lease.release()


def prepare(config: BatchInferenceConfig, *, ray_job: str | None = None) -> PreparedRun:
    """Check ``config`` against its input and output, take the writer lease and prepare the output.

    Raises :class:`ConfigError` / :class:`InputError` (naming the setting, path or column at
    fault) before anything is written, and :class:`OutputBusyError` when another writer holds
    the output. Nothing runs on Ray. The caller releases the lease (:meth:`PreparedRun.release`).

    :param ray_job: the Ray Job whose driver this is, named in the lease.
    """
    config.validate()
    for stage in config.stages:
        resolve_predictor(stage)
    in_fs, in_path = resolve(config.input_path, config.storage_options)
    out_fs, out_path = resolve(config.output_path, config.storage_options)
    for fs in (in_fs, out_fs):
        fs.invalidate_cache()  # listings cached by an earlier run in this process may be stale
    check_output_location(config, in_fs, in_path, out_fs, out_path)
    plan = limit_rows(
        plan_input(in_fs, in_path, config.input_path, config.columns, config.rows_per_range, config.id_column),
        config.max_rows,
    )
    keep = _keep_columns(config, plan)
    missing = [c for c in config.stages[0].input_columns or [] if c not in plan.schema.names]
    if missing:
        raise InputError(
            f"stage {config.stages[0].display_name!r} reads column(s) {missing}, which the input does not have; "
            f"columns read: {plan.schema.names}"
        )
    holder = LeaseHolder(config.run_key, config.try_number, ray_job)
    generation = None
    if config.table is None:
        ledger = OutputLedger(out_fs, out_path, config.output_path)
        ledger.set_scope(config.range_ids)
        # Read-only checks first: a folder that is not ours, or an output of a newer layout, is refused
        # before the lease writes anything into it.
        if ledger.load_plan() is None:
            _refuse_foreign(config, ledger)
        lease = _take_lease(config, ledger, holder)
    else:
        _check_partition_columns(config, keep)
        ledger, lease, generation = _open_staging(config, plan, out_fs, out_path, holder)
    try:
        if generation is not None and config.range_ids is None:
            # mode applies to the generation (:func:`.tables.staging.open_generation`): within one, a
            # run resumes. Resetting it could delete files that the table's commits name.
            committed = _open_output(dataclasses.replace(config, mode="resume"), plan, ledger)
        elif config.range_ids is None:
            committed = _open_output(config, plan, ledger)
        else:
            committed = _open_partition(config, plan, ledger)
            plan = select_ranges(plan, config.range_ids)
    except BaseException:
        lease.release()
        raise
    return PreparedRun(plan, ledger, committed, keep, in_fs, lease, generation)


def _open_staging(
    config: BatchInferenceConfig, plan: Plan, fs: AbstractFileSystem, root: str, holder: LeaseHolder
) -> tuple[OutputLedger, Lease, Generation]:
    """A table output: the writer's lease on its partition (or a mapped partition's task's lease on
    its ranges), and the ledger of the generation it writes.

    An overwrite continues its own run's generation unless that was planned on another input or
    other settings: then, as a folder would be reset, it starts the next generation (the one it
    leaves may have rows in the table already, so it is never reset). A mapped partition's task
    writes the generation its planning task chose.
    """
    from airflow_provider_raybatch.pipeline.tables.staging import open_generation, planned_generation, writer_folder
    from airflow_provider_raybatch.pipeline.tables.table_commits import check_table_output

    table = config.table
    assert table is not None
    check_table_output(config)
    # The writer's folder holds its leases as an output folder holds its own (:func:`_take_lease`).
    writer = OutputLedger(fs, f"{root}/{writer_folder(table)}", config.output_path)
    what = f"{table.format} table {config.output_path}, partition {table.partition}, writer {table.writer!r}"
    lease = _take_lease(config, writer, holder, what)
    try:
        if config.range_ids is not None:
            generation = planned_generation(fs, root, table)
            ledger = _staging_ledger(config, fs, root, generation, lease)
            ledger.set_scope(config.range_ids)
            return ledger, lease, generation
        generation = open_generation(fs, root, table, config.mode, config.run_key)
        ledger = _staging_ledger(config, fs, root, generation, lease)
        recorded = ledger.load_plan()
        if config.mode == "overwrite" and recorded is not None and any(_differences(config, plan, recorded)):
            generation = open_generation(fs, root, table, config.mode, config.run_key, new=True)
            ledger = _staging_ledger(config, fs, root, generation, lease)
    except BaseException:
        lease.release()
        raise
    return ledger, lease, generation


def _staging_ledger(
    config: BatchInferenceConfig, fs: AbstractFileSystem, root: str, generation: Generation, lease: Lease
) -> OutputLedger:
    ledger = OutputLedger(fs, f"{root}/{generation.relpath}", f"{config.output_path.rstrip('/')}/{generation.relpath}")
    ledger.fence = lease.check
    return ledger


def _check_partition_columns(config: BatchInferenceConfig, keep: list[str]) -> None:
    """The table's partition columns are added to every row: no input column kept may have their names."""
    assert config.table is not None
    clash = [c for c in config.table.partition if c in keep]
    if clash:
        raise ConfigError(
            f"input column(s) {clash} would be written to table {config.output_path!r}, whose partition column "
            f"{'they are' if len(clash) > 1 else 'it is'} (set to {config.table.partition}): leave "
            f"{'them' if len(clash) > 1 else 'it'} out of keep_columns"
        )


def _take_lease(
    config: BatchInferenceConfig, ledger: OutputLedger, holder: LeaseHolder, what: str | None = None
) -> Lease:
    """The lease of the whole output, or of a partition's ranges; the ledger is fenced by it.

    A whole-output writer (a run, or the planning task of a mapped run) and a partition's writer
    exclude each other: each takes its own lease, then fails if the other kind is live.

    :param what: the output, in messages (default: ``output <output_path>``).
    """
    what = what or f"output {config.output_path}"

    def make(folder: str) -> Lease:
        partition = "" if folder == ledger.lease_folder() else f"partition {posixpath.basename(folder)} of "
        return Lease(ledger.fs, folder, f"{partition}{what}", holder, config.lease_timeout)

    whole = config.range_ids is None
    lease = make(ledger.lease_folder() if whole else ledger.lease_folder(config.range_ids))
    lease.acquire()
    try:
        # The other kind is looked for only once this lease is taken: of a whole-output writer and
        # a partition's writer starting together, each creates its lease before it looks for the
        # other's, so the one that looks last sees the other's and stops, in every interleaving.
        # (Listed before, a partition lease created in between was missed, and both wrote.)
        others = [make(folder) for folder in ledger.shard_lease_folders()] if whole else [make(ledger.lease_folder())]
        for other in others:
            if (record := other.live()) is not None:
                raise other.busy_error(record)
    except BaseException:
        lease.release()
        raise
    ledger.fence = lease.check
    return lease


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


def _open_output(config: BatchInferenceConfig, plan: Plan, ledger: OutputLedger) -> dict[str, CommitRecord]:
    """Check the output folder against the plan (recording it if new) and return its committed ranges."""
    recorded = ledger.load_plan()
    if recorded is not None:
        changes, job_diff = _differences(config, plan, recorded)
        same_run = config.run_key is not None and recorded.run_key == config.run_key
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
    else:
        _refuse_foreign(config, ledger)
        ledger.reset()  # leftovers of a run killed before it recorded its plan

    if recorded is None:
        ledger.write_plan(PlanRecord(config.input_path, plan.describe(), config.job_signature(), config.run_key))
        committed: dict[str, CommitRecord] = {}
    elif recorded.version == PER_RANGE_RECORDS:
        # An output of layout 1, checked above against the same input and settings: from now on
        # its records are read from one manifest instead of a file per range.
        log.info("Upgrading the bookkeeping of %s to layout version %d", config.output_path, PLAN_VERSION)
        ledger.upgrade(PlanRecord(config.input_path, plan.describe(), recorded.job, recorded.run_key))
        committed = ledger.committed()
    else:
        committed = ledger.committed()
        if ledger.last_read["segments"] > MAX_SEGMENTS_AT_START:
            # Left by many tries that ended before folding theirs: fold them now, so that the
            # objects read at start stay few whatever happens to the tries.
            ledger.compact()
    committed = _reconcile(ledger, committed, None)
    if not committed:
        # Recorded by a run that then committed nothing: the schema is fixed by the first range committed.
        ledger.forget_schemas()
    return committed


def _refuse_foreign(config: BatchInferenceConfig, ledger: OutputLedger) -> None:
    """A folder without our plan that holds anything else is someone else's: never write or delete there."""
    if foreign := ledger.foreign_entries():
        raise ConfigError(
            f"output path {config.output_path!r} is not empty and was not written by raybatch "
            f"(found {foreign[:5]}); choose an empty folder"
        )


def _open_partition(config: BatchInferenceConfig, plan: Plan, ledger: OutputLedger) -> dict[str, CommitRecord]:
    """Check an output planned by ``plan_shards``; return this partition's committed ranges.

    Never writes the plan nor resets the output (``mode`` was applied by the planning step):
    tasks of other partitions may be writing to the same folder at the same time.
    """
    recorded = ledger.load_plan()
    if recorded is None:
        raise ConfigError(
            f"output {config.output_path!r} has not been planned: run plan_shards (the planning task) "
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
    return _reconcile(ledger, committed, config.range_ids)


def _differences(config: BatchInferenceConfig, plan: Plan, recorded: PlanRecord) -> tuple[str, list[str]]:
    """How the input, and which settings of the job signature, differ from the recorded plan."""
    changes = input_changes(recorded.input, plan)
    job_diff = sorted(k for k, v in config.job_signature().items() if recorded.job.get(k) != v)
    return changes, job_diff


def _reconcile(
    ledger: OutputLedger, committed: dict[str, CommitRecord], range_ids: list[str] | None
) -> dict[str, CommitRecord]:
    """The records that stand (their files are there); files of uncommitted ranges removed."""
    standing, removed = ledger.reconcile(committed, range_ids)
    if removed:
        log.info("Removed %d file(s) of uncommitted ranges", len(removed))
    return standing
