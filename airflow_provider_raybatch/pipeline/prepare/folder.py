"""A Parquet folder output: its leases and bookkeeping are in the folder itself."""

from __future__ import annotations

from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.commit.lease import LeaseHolder
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger, read_plan
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.planning.planner import Plan
from airflow_provider_raybatch.pipeline.prepare.checks import refuse_foreign
from airflow_provider_raybatch.pipeline.prepare.prepared_run import OpenedOutput
from airflow_provider_raybatch.pipeline.prepare.scopes import open_shard_ranges, open_whole_output
from airflow_provider_raybatch.pipeline.prepare.writer_lease import take_lease


def open_folder(
    config: BatchInferenceConfig, plan: Plan, fs: AbstractFileSystem, root: str, holder: LeaseHolder
) -> OpenedOutput:
    """Take the writer's lease on the folder ``root`` (or on the shard's ranges in it) and open its ledger.

    :param plan: the input's plan, checked against the recorded one.
    :param holder: who takes the lease.
    """
    display = config.output_path
    # Read-only checks first: a folder that is not ours, or an output of a newer layout, is refused
    # before the lease writes anything into it.
    if read_plan(fs, root, display) is None:
        refuse_foreign(config, OutputLedger(fs, root, display))
    lease = take_lease(config, fs, root, holder)
    try:
        # Read again under the lease: the writer that held it may have recorded or replaced the plan since.
        recorded = read_plan(fs, root, display)
        ledger = OutputLedger(fs, root, display, plan=recorded, range_ids=config.range_ids, fence=lease.check)
        scope = open_whole_output if config.range_ids is None else open_shard_ranges
        committed = scope(config, plan, ledger, recorded)
    except BaseException:
        lease.release()
        raise
    return OpenedOutput(ledger, lease, committed)
