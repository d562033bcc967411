"""Run a batch inference: prepare, skip committed ranges, stream the rest through Ray Data.

Ray Data reads one task per pending range, runs each stage as an actor pool, and writes each
block's rows where they are (:func:`.block_writer.write_block`). This driver receives only the
written files' metadata and commits a range (:class:`.range_commits.RangeCommits`) as soon as its
files hold all its rows.

Stages whose replicas reserve only CPUs also read and write: the first one's replicas read
their ranges (Ray Data fuses a read into the next operator when both reserve the same), and the
last one's write their rows (:class:`.block_writer.WritingStageWorker`). A light model then runs
like a plain loop in each replica, with no rows crossing the object store and no worker
processes besides the replicas. A replica that holds a GPU leaves reading and writing to tasks on
CPUs, so that the GPU does not wait for storage, and gets its batches from Ray Data, full across
blocks.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging
import time
import traceback
from contextlib import nullcontext, suppress
from typing import TYPE_CHECKING, Any

from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, TransformStage
from airflow_provider_raybatch.pipeline.errors import LeaseLostError, StoreUnavailableError, provider_error_in
from airflow_provider_raybatch.pipeline.execution.block_writer import (
    WritingStageWorker,
    write_block,
    write_step_resources,
)
from airflow_provider_raybatch.pipeline.execution.predictors import resolve_predictor, warm_imports
from airflow_provider_raybatch.pipeline.execution.range_commits import RangeCommits
from airflow_provider_raybatch.pipeline.execution.scored_rows import ScoredRows
from airflow_provider_raybatch.pipeline.execution.stages import StageWorker
from airflow_provider_raybatch.pipeline.execution.watchdog import Watchdog
from airflow_provider_raybatch.pipeline.planning.planner import Plan
from airflow_provider_raybatch.pipeline.prepare import PreparedRun, prepare
from airflow_provider_raybatch.pipeline.resources import AUTO, READ_CPUS, auto_replicas, wait_for_cluster_resources
from airflow_provider_raybatch.pipeline.runtime.driver_logs import route_ray_data_logs
from airflow_provider_raybatch.pipeline.runtime.local_ray import prestart_workers, ray_session
from airflow_provider_raybatch.pipeline.runtime.stderr_levels import ray_stderr_at_level
from airflow_provider_raybatch.pipeline.summary import Progress, RunSummary

if TYPE_CHECKING:
    from airflow_provider_raybatch.pipeline.tables.table_commits import TableCommits

log = logging.getLogger(__name__)


def run_batch_inference(
    config: BatchInferenceConfig,
    *,
    ray_address: str | None = None,
    namespace: str | None = None,
    ray_job: str | None = None,
) -> RunSummary:
    """Run ``config`` to completion and return its summary.

    Everything that can be checked without Ray is checked first (:func:`.prepare.prepare`):
    settings, predictors, input files and columns, the output folder. A finished output returns
    at once, without Ray. The output's writer lease is held from before anything is written or
    removed until the end.

    :param ray_address: None starts an embedded local Ray (unless one is running in this
        process); ``"auto"`` joins the cluster this process runs on (a Ray Job's driver).
    :param namespace: the Ray namespace to join.
    :param ray_job: the submission id of the Ray Job whose driver this is (named in the lease).
    """
    started = time.monotonic()
    run = prepare(config, ray_job=ray_job)
    table_version = None
    try:
        progress, table = _process(config, run, ray_address, namespace)
        run.ledger.clear_tmp()  # every range is recorded: the write steps' receipts have served
        # Errors over the limit fail the run before a replacing table commit makes its rows current.
        progress.check_errors(config.max_error_fraction, run.ledger.display_path, final=True)
        if table is not None:
            table.commit(final=True)
            table_version = table.version()
    except BaseException as e:
        _release_frames(e)
        if isinstance(e, Exception) and (lost := _takeover(run, e)) is not None:
            raise lost from e
        raise
    finally:
        run.release()
    return progress.summary(config.output_path, time.monotonic() - started, table_version)


def _process(
    config: BatchInferenceConfig, run: PreparedRun, ray_address: str | None, namespace: str | None
) -> tuple[Progress, TableCommits | None]:
    """Commit every pending range of ``run``; a table output's ranges join the table as they go."""
    progress = Progress(run.plan, run.committed)
    # Each record names this try; its stages' start (the commit rate's) replaces this once known.
    run.ledger.writer = run.lease.holder.writer(time.time())
    commits = RangeCommits(run.ledger, run.plan, progress, config, run.committed)
    table = None
    if run.generation is not None:
        from airflow_provider_raybatch.pipeline.tables.table_commits import TableCommits

        table = TableCommits(run.ledger, config, run.generation, commits.recorded)
        table.catch_up()  # commits that an earlier try decided and may not have applied
    with commits, table or nullcontext():
        _commit_pending(config, run, commits, ray_address, namespace)
    return progress, table


def _commit_pending(
    config: BatchInferenceConfig,
    run: PreparedRun,
    commits: RangeCommits,
    ray_address: str | None,
    namespace: str | None,
) -> None:
    """Commit the ranges of ``run`` not committed yet: empty ones at once, the others through Ray Data."""
    plan = run.plan
    pending = [i for i, r in enumerate(plan.ranges) if r.id not in run.committed]
    if not pending:
        writers = commits.progress.skipped_by
        by = ", ".join(f"{w['writer']} ({w['ranges']} ranges)" for w in writers) if len(writers) > 1 else ""
        by = by or (writers[0]["writer"] if writers else "earlier tries")
        log.info("nothing to do: all %d ranges were committed by %s", len(plan.ranges), by)
        return
    for index in [i for i in pending if plan.ranges[i].rows == 0]:
        commits.commit_empty(index, run.keep)
    commits.flush()
    pending = [i for i in pending if plan.ranges[i].rows > 0]
    if not pending:
        return
    log.info(
        "%d of %d ranges to process (%d rows); %d already committed",
        len(pending),
        len(plan.ranges),
        sum(plan.ranges[i].rows for i in pending),
        len(run.committed),
    )
    with ray_session(ray_address, namespace, preload=warm_imports(config.stages)) as shared:
        # Transforms are built on the driver before anything is scheduled; a factory checks what it
        # needs first (the vLLM one: vllm importable here, GPUs in the cluster).
        transforms = {i: resolve_predictor(s)(s) for i, s in enumerate(config.stages) if isinstance(s, TransformStage)}
        last = len(config.stages) - 1
        reads_in_stage = 0 not in transforms and config.stages[0].cpus_only
        writes_in_stage = last not in transforms and config.stages[last].cpus_only
        config = _decide_auto_replicas(config, shared, 0 if reads_in_stage else READ_CPUS, len(pending))
        need, resources = wait_for_cluster_resources(
            [(s.display_name, s) for s in config.stages], read_cpus=0 if reads_in_stage else READ_CPUS
        )
        if shared is not None:
            shared.take_share(need, resources, config.progress_timeout)
        # The worker processes the first rows need; transforms (ray.data.llm) start their own.
        replicas = sum(s.min_replicas for i, s in enumerate(config.stages) if i not in transforms)
        workers = replicas + (not reads_in_stage) + (not writes_in_stage)
        if ray_address is None:
            prestart_workers(workers - (shared.take_warm(workers) if shared is not None else 0))
        try:
            _stream(config, plan, commits, pending, run.keep, run.in_fs, transforms, reads_in_stage, writes_in_stage)
        finally:
            if shared is not None:
                shared.leave_warm(workers, resources.get("CPU", 0), prestart_workers)


def _decide_auto_replicas(
    config: BatchInferenceConfig, shared: Any, read_cpus: float, work_units: int
) -> BatchInferenceConfig:
    """``config`` with each stage's ``concurrency=None`` decided (:func:`.resources.auto_replicas`)
    for the CPUs this run may use: the cluster's, less what other tasks hold on a shared local Ray."""
    if not any(s.concurrency is AUTO for s in config.stages):
        return config
    import ray

    cpus = ray.cluster_resources().get("CPU", 0)
    if shared is not None:
        cpus -= shared.held_by_others().get("CPU", 0)
    stages = []
    for stage, concurrency in zip(
        config.stages, auto_replicas(config.stages, cpus, read_cpus, work_units), strict=True
    ):
        if stage.concurrency is AUTO:
            stage = copy.copy(stage)
            stage.concurrency = concurrency
            log.info(
                "Stage %r: %s replica(s) of %g CPU (concurrency=None)", stage.display_name, concurrency, stage.num_cpus
            )
        stages.append(stage)
    return dataclasses.replace(config, stages=stages)


def _stream(
    config: BatchInferenceConfig,
    plan: Plan,
    commits: RangeCommits,
    pending: list[int],
    keep: list[str],
    in_fs: AbstractFileSystem,
    transforms: dict[int, Any],
    reads_in_stage: bool,
    writes_in_stage: bool,
) -> None:
    import ray
    from ray.data import DataContext

    from airflow_provider_raybatch.pipeline.execution.datasource import RangeDatasource

    DataContext.get_current().enable_progress_bars = False  # progress goes to the log (Progress.clock)
    route_ray_data_logs()  # Ray Data's messages into the task log at their level, not as stderr
    scored = ScoredRows()
    replicas = max(s.max_replicas for s in config.stages)
    datasource = RangeDatasource(in_fs, plan, pending, keep, config.id_column is None, replicas)
    # One block per read task: left to itself, Ray Data splits each read task's output into many
    # small blocks (20 x 5,000 rows for 10 ranges), and the per-block task overhead halved the
    # pipeline's throughput in benchmarks/throughput.py. Blocks are split only when there are
    # fewer than replicas, so that every replica still gets work.
    last = len(config.stages) - 1
    # Reserving what the first stage's replicas reserve lets Ray Data fuse the read into them.
    reservation = config.stages[0].reservation() if reads_in_stage else {"num_cpus": READ_CPUS}
    ds = ray.data.read_datasource(datasource, override_num_blocks=max(len(datasource.groups), replicas), **reservation)
    for index, stage in enumerate(config.stages):
        if index in transforms:
            ds = transforms[index](ds)
            continue
        kwargs = stage.map_batches_kwargs()
        if stage.cpus_only:
            # Whole blocks, scored batch_size rows at a time by the replica (StageWorker): with a
            # batch size, Ray Data would not fuse the read into the replicas, and a writing
            # replica would write a file per batch.
            kwargs["batch_size"] = None
        writes = index == last and writes_in_stage
        constructor: dict[str, Any] = {"stage": stage}
        if writes:
            constructor["write"] = commits.write_step_kwargs()
        if index == last:
            constructor["scored_prefix"] = scored.prefix  # rows through the pipeline, for the progress lines
        ds = ds.map_batches(
            WritingStageWorker if writes else StageWorker,
            fn_constructor_kwargs=constructor,
            batch_format="pyarrow",
            zero_copy_batch=True,
            udf_modifying_row_count=writes,  # a writing replica returns one metadata row per file
            **kwargs,
        )
    if not writes_in_stage:
        ds = ds.map_batches(
            write_block,
            fn_kwargs=commits.write_step_kwargs(),
            batch_format="pyarrow",
            zero_copy_batch=True,
            batch_size=None,
            **write_step_resources(ray.cluster_resources().get("CPU", 1)),
        )
    watchdog = Watchdog(config.progress_timeout, commits.progress, config.stages, ds)
    try:
        with commits.progress.clock(scored), watchdog, ray_stderr_at_level():
            writer = commits.ledger.writer
            if writer is not None:
                commits.ledger.writer = dataclasses.replace(writer, started_at=commits.progress.stages_started_at)
            try:
                # No prefetching: with it, Ray Data's iterator hands on a block only once the next
                # ones exist, so each range's commit waited for two more ranges to be written
                # (RESULTS 11c). The blocks here are a few rows of metadata: nothing to prefetch.
                for metadata in ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0):
                    watchdog.beat()
                    commits.add(metadata)
                commits.check_done()
            except Exception as e:
                # Files the write step finished before the failure are committed, so a retry need
                # not redo their ranges.
                commits.salvage()
                if (cause := provider_error_in(e)) is not None and cause is not e:
                    # Raised on a Ray worker (a stage's contract, a write): its message alone says
                    # what is wrong, and its class whether a retry can help; Ray's wrapper would
                    # repeat it inside the worker's traceback.
                    raise cause.as_raised() from None
                raise
    finally:
        scored.clear()


def _takeover(run: PreparedRun, error: Exception) -> LeaseLostError | None:
    """The takeover of this writer's lease when the run failed after one, else None.

    A fenced writer rarely meets its fence first: the new holder's start-up removes the temporary
    files it is writing, so it fails on a file that vanished, or a write into a folder that is gone.
    The takeover is the cause, and its error says so (who took the lease, when); the symptom is
    chained to it.
    """
    if isinstance(provider_error_in(error), (LeaseLostError, StoreUnavailableError)):
        # Fenced before anything else failed: its own error says so. Or the store kept failing:
        # reading the lease would wait out another retry budget, to no avail.
        return None
    try:
        return run.lease.takeover()
    except Exception as e:  # noqa: BLE001 - the lease cannot be read now: the run's own error stands
        log.warning("Could not read the lease of %s after the run failed: %s", run.ledger.display_path, e)
        return None


def _release_frames(error: BaseException) -> None:
    """Clear the local variables of the finished frames that ``error`` (and its chain) keeps.

    Ray Data's executor raises with frames whose locals hold its in-flight tasks, and each task
    the handle of the replica that runs it: whoever keeps the exception (a retry in the same
    process, as ``dag.test()`` makes them, a notebook's last traceback) would keep those replicas
    alive, with the CPUs and GPUs they reserve, and the next run would wait for them. A traceback
    keeps its frames' callers too (a frame holds its ``f_back``). The tracebacks still print; a
    post-mortem debugger finds the cleared frames' variables gone.
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        for tb_frame, _ in traceback.walk_tb(current.__traceback__):
            for frame, _ in traceback.walk_stack(tb_frame):  # the frame, then its callers
                with suppress(RuntimeError):  # a frame still running keeps its locals
                    frame.clear()
        pending += [current.__cause__, current.__context__]
    # Ray Data's executor, operators and tasks refer to each other: freed now, not at the
    # interpreter's next full collection (which a process that does little may not reach for minutes).
    gc.collect()
