"""What a writer finds committed, by its scope: the whole output (plan recorded, ``mode`` applied) or
one shard's ranges (planned by the planning task, checked only).

Both are given the output's ledger and the plan it holds, read once under the writer's lease.
"""

from __future__ import annotations

import logging

from airflow_provider_raybatch.pipeline.commit.commit_log import PER_RANGE_RECORDS, PLAN_VERSION, SEGMENT_FANOUT
from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.commit.plan_record import PlanRecord
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.errors import ConfigError, InputChangedError
from airflow_provider_raybatch.pipeline.planning.planner import Plan
from airflow_provider_raybatch.pipeline.prepare.checks import differences, refuse_foreign, settings_text

log = logging.getLogger(__name__)

#: Segments found at the start of a whole-output run above which they are folded into the manifest
#: before it starts (a finished run folds its own at the end).
MAX_SEGMENTS_AT_START = 4 * SEGMENT_FANOUT


def open_whole_output(
    config: BatchInferenceConfig, plan: Plan, ledger: OutputLedger, recorded: PlanRecord | None
) -> dict[str, CommitRecord]:
    """Check the output against the plan (recording it if new, resetting it for ``mode="overwrite"``)
    and return its committed ranges.

    :param recorded: the plan ``ledger`` holds (None: none recorded).
    """
    if recorded is not None:
        changes, job_diff = differences(config, plan, recorded)
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
                f"output {config.output_path!r} was started with different settings {settings_text(job_diff)}. "
                "Mixing results is refused: use mode='overwrite' (which starts the output afresh) "
                "or another output path."
            )
    else:
        refuse_foreign(config, ledger)
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


def open_shard_ranges(
    config: BatchInferenceConfig, plan: Plan, ledger: OutputLedger, recorded: PlanRecord | None
) -> dict[str, CommitRecord]:
    """Check an output planned by ``plan_shards``; return this shard's committed ranges.

    Never writes the plan nor resets the output (``mode`` was applied by the planning step):
    tasks of other shards may be writing to the same folder at the same time.

    :param recorded: the plan ``ledger`` holds (None: none recorded).
    """
    if recorded is None:
        raise ConfigError(
            f"output {config.output_path!r} has not been planned: run plan_shards (the planning task) "
            "on it before the tasks of its shards"
        )
    changes, job_diff = differences(config, plan, recorded)
    if changes:
        raise InputChangedError(
            f"input {config.input_path!r} changed since the shards of {config.output_path!r} were planned "
            f"({changes}); rerun the planning task"
        )
    if job_diff:
        raise ConfigError(
            f"output {config.output_path!r} was planned with different settings {settings_text(job_diff)}. "
            "The planning task and the shards' tasks must be given the same arguments."
        )
    wanted = set(config.range_ids or ())
    committed = {range_id: r for range_id, r in ledger.committed().items() if range_id in wanted}
    return _reconcile(ledger, committed, config.range_ids)


def _reconcile(
    ledger: OutputLedger, committed: dict[str, CommitRecord], range_ids: list[str] | None
) -> dict[str, CommitRecord]:
    """The records that stand (their files are there); files of uncommitted ranges removed."""
    standing, removed = ledger.reconcile(committed, range_ids)
    if removed:
        log.info("Removed %d file(s) of uncommitted ranges", len(removed))
    return standing
