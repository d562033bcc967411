"""The checks every output kind shares: the input's columns, a table's, and the output against its recorded plan."""

from __future__ import annotations

from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.commit.plan_record import PlanRecord
from airflow_provider_raybatch.pipeline.config import ROW_ID_COLUMN, BatchInferenceConfig
from airflow_provider_raybatch.pipeline.errors import ConfigError, InputError
from airflow_provider_raybatch.pipeline.planning.planner import Plan, input_changes
from airflow_provider_raybatch.pipeline.prepare.settings import setting_changes


def keep_columns(config: BatchInferenceConfig, plan: Plan) -> list[str]:
    """The input columns carried to the output, the row key first; each must be an input column."""
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


def check_stage_columns(config: BatchInferenceConfig, plan: Plan) -> None:
    """The first stage reads only columns the input has."""
    missing = [c for c in config.stages[0].input_columns or [] if c not in plan.schema.names]
    if missing:
        raise InputError(
            f"stage {config.stages[0].display_name!r} reads column(s) {missing}, which the input does not have; "
            f"columns read: {plan.schema.names}"
        )


def check_partition_columns(config: BatchInferenceConfig, keep: list[str]) -> None:
    """The table's partition columns are added to every row: no input column kept may have their names."""
    assert config.table is not None
    clash = [c for c in config.table.partition if c in keep]
    if clash:
        raise ConfigError(
            f"input column(s) {clash} would be written to table {config.output_path!r}, whose partition column "
            f"{'they are' if len(clash) > 1 else 'it is'} (set to {config.table.partition}): leave "
            f"{'them' if len(clash) > 1 else 'it'} out of keep_columns"
        )


def differences(config: BatchInferenceConfig, plan: Plan, recorded: PlanRecord) -> tuple[str, list[str]]:
    """How the input differs from the recorded plan, and each setting of the job signature that does
    (:func:`.settings.setting_changes`: ``where: recorded -> new``, secrets masked)."""
    return input_changes(recorded.input, plan), setting_changes(recorded.job, config.job_signature())


def settings_text(job_diff: list[str]) -> str:
    """The settings' differences as the refusals print them (recorded value first)."""
    return f"(recorded -> this run's): {'; '.join(job_diff)}"


def refuse_foreign(config: BatchInferenceConfig, ledger: OutputLedger) -> None:
    """A folder without our plan that holds anything else is someone else's: never write or delete there."""
    if foreign := ledger.foreign_entries():
        raise ConfigError(
            f"output path {config.output_path!r} is not empty and was not written by raybatch "
            f"(found {foreign[:5]}); choose an empty folder"
        )
