"""A Delta or Iceberg table output: the writer's leases in its folder, its rows staged in a generation
(:mod:`..tables.staging`) whose ledger is kept as a folder output's is."""

from __future__ import annotations

import dataclasses

from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.commit.lease import LeaseHolder
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger, read_plan
from airflow_provider_raybatch.pipeline.commit.plan_record import PlanRecord
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.planning.planner import Plan
from airflow_provider_raybatch.pipeline.prepare.checks import differences
from airflow_provider_raybatch.pipeline.prepare.prepared_run import OpenedOutput
from airflow_provider_raybatch.pipeline.prepare.scopes import open_shard_ranges, open_whole_output
from airflow_provider_raybatch.pipeline.prepare.writer_lease import take_lease
from airflow_provider_raybatch.pipeline.tables.staging import (
    Generation,
    open_generation,
    planned_generation,
    writer_folder,
)
from airflow_provider_raybatch.pipeline.tables.table_commits import check_table_output


def open_table(
    config: BatchInferenceConfig, plan: Plan, fs: AbstractFileSystem, root: str, holder: LeaseHolder
) -> OpenedOutput:
    """Take the writer's lease on its partition of the table at ``root`` (or a mapped partition's
    task's lease on its ranges) and open the ledger of the generation it writes.

    :param plan: the input's plan, checked against the generation's recorded one.
    :param holder: who takes the lease.
    """
    table = config.table
    assert table is not None
    check_table_output(config)
    what = f"{table.format} table {config.output_path}, partition {table.partition}, writer {table.writer!r}"
    # The writer's folder holds its leases as an output folder holds its own.
    lease = take_lease(config, fs, f"{root}/{writer_folder(table)}", holder, what)
    try:
        if config.range_ids is None:
            generation, recorded = _whole_output_generation(config, plan, fs, root)
            # mode applies to the generation (:func:`_whole_output_generation`): within one, a run
            # resumes. Resetting it could delete files that the table's commits name.
            scope, scope_config = open_whole_output, dataclasses.replace(config, mode="resume")
        else:
            generation = planned_generation(fs, root, table)
            recorded = read_plan(fs, f"{root}/{generation.relpath}", _display(config, generation))
            scope, scope_config = open_shard_ranges, config
        ledger = OutputLedger(
            fs,
            f"{root}/{generation.relpath}",
            _display(config, generation),
            plan=recorded,
            range_ids=config.range_ids,
            fence=lease.check,
        )
        committed = scope(scope_config, plan, ledger, recorded)
    except BaseException:
        lease.release()
        raise
    return OpenedOutput(ledger, lease, committed, generation)


def _whole_output_generation(
    config: BatchInferenceConfig, plan: Plan, fs: AbstractFileSystem, root: str
) -> tuple[Generation, PlanRecord | None]:
    """The generation a whole-output writer writes, and the plan recorded in it.

    An overwrite continues its own run's generation unless that was planned on another input or
    other settings: then, as a folder would be reset, it starts the next generation (the one it
    leaves may have rows in the table already, so it is never reset). The next one is new: were
    anything left in it, the run would reset it as it would a folder without a plan.
    """
    assert config.table is not None
    generation = open_generation(fs, root, config.table, config.mode, config.run_key)
    recorded = read_plan(fs, f"{root}/{generation.relpath}", _display(config, generation))
    if config.mode == "overwrite" and recorded is not None and any(differences(config, plan, recorded)):
        return open_generation(fs, root, config.table, config.mode, config.run_key, new=True), None
    return generation, recorded


def _display(config: BatchInferenceConfig, generation: Generation) -> str:
    return f"{config.output_path.rstrip('/')}/{generation.relpath}"
