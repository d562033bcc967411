"""Everything a run checks and prepares before Ray starts: settings, the input's plan, the output.

Running (:mod:`..runner`) and planning the shards of a mapped run (:mod:`..shards`) both
start here (:func:`prepare`, the one door), so an output is always prepared the same way: the plan
recorded (or checked against the recorded one), ``mode="overwrite"`` applied once per run, the
committed ranges read, and the files of uncommitted ranges removed.

Where the output's lease and ledger are depends on its kind (:mod:`.folder`, :mod:`.table`); what a
writer checks and finds committed, on its scope (:mod:`.scopes`: the whole output, or one shard's
ranges). Each reads the recorded plan once under the writer's lease and makes the ledger with it.
"""

from __future__ import annotations

from airflow_provider_raybatch.pipeline.commit.lease import LeaseHolder
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.execution.predictors import resolve_predictor
from airflow_provider_raybatch.pipeline.output_location import check_output_location
from airflow_provider_raybatch.pipeline.planning.planner import limit_rows, plan_input, select_ranges
from airflow_provider_raybatch.pipeline.prepare.checks import check_partition_columns, check_stage_columns, keep_columns
from airflow_provider_raybatch.pipeline.prepare.folder import open_folder
from airflow_provider_raybatch.pipeline.prepare.prepared_run import PreparedRun
from airflow_provider_raybatch.pipeline.prepare.table import open_table
from airflow_provider_raybatch.pipeline.store.files import resolve

__all__ = ["PreparedRun", "prepare"]


def prepare(config: BatchInferenceConfig, *, ray_job: str | None = None) -> PreparedRun:
    """Check ``config`` against its input and output, take the writer lease and prepare the output.

    Raises :class:`ConfigError` / :class:`InputError` (naming the setting, path or column at
    fault) before anything is written, and :class:`OutputBusyError` when another writer holds
    the output. Nothing runs on Ray. The caller releases the lease (:meth:`PreparedRun.release`).

    :param config: the run's settings.
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
    keep = keep_columns(config, plan)
    check_stage_columns(config, plan)
    if config.table is not None:
        check_partition_columns(config, keep)
    holder = LeaseHolder(config.run_key, config.try_number, ray_job)
    open_output = open_folder if config.table is None else open_table
    output = open_output(config, plan, out_fs, out_path, holder)
    if config.range_ids is not None:
        try:
            plan = select_ranges(plan, config.range_ids)
        except BaseException:
            output.lease.release()
            raise
    return PreparedRun(plan, output.ledger, output.committed, keep, in_fs, output.lease, output.generation)
