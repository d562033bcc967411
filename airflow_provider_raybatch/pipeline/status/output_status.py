"""Where an output stands, read from its bookkeeping only: :class:`OutputStatus`, by :func:`read_status`.

What the command line's ``status`` prints and what a UI would draw: planned and committed ranges
and rows, rejects, a timeline of rows committed, the current and average commit rates and the time
left, the tries that wrote (:mod:`.tries`), the lease holders and the run's state. It reads
``plan.json``, the commit records (the manifest and the segments, once:
:meth:`.commit_log.CommitLog.committed`) and the leases' newest generations, never a data file,
so it answers quickly however large the output (``benchmarks/status.py``).

A table output (:func:`read_table_status`) is read per writer: each writer that staged rows for
the partition has a generation being written, a Parquet output of its own under the table
(:mod:`.tables.staging`), whose status is read as above, with the writer's leases.

What the ledger does not hold is not guessed: a mapped shard's planned ranges are known only
to the planning task (its XCom), so a shard's progress counts what it committed, not what is
left of it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.commit.commit_log import OUTPUT_SCOPE
from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord
from airflow_provider_raybatch.pipeline.commit.ledger import META_DIR, OutputLedger, shard_key
from airflow_provider_raybatch.pipeline.config import DEFAULT_LEASE_TIMEOUT_S
from airflow_provider_raybatch.pipeline.errors import OutputNotFoundError
from airflow_provider_raybatch.pipeline.planning.planner import contiguous_groups, recorded_ranges
from airflow_provider_raybatch.pipeline.status.timeline import (
    TIMELINE_POINTS,
    TimelinePoint,
    cumulative,
    current_rate,
    thin,
)
from airflow_provider_raybatch.pipeline.status.tries import WritingTry, average_commit_rate, writing_tries
from airflow_provider_raybatch.pipeline.status.writers import (
    LeaseStatus,
    ShardStatus,
    lease_status,
    shard_writers,
)
from airflow_provider_raybatch.pipeline.store.files import resolve
from airflow_provider_raybatch.pipeline.summary import count_totals
from airflow_provider_raybatch.pipeline.tables.staging import (
    GENERATION_RECORD,
    StagedWriter,
    intents,
    partition_folder,
    staged_writers,
)

State = Literal["done", "running", "partial", "not started"]


@dataclass(frozen=True)
class FileProgress:
    """One planned input file: its rows and ranges, and how many of them are committed."""

    relpath: str
    rows: int
    ranges: int
    ranges_committed: int
    rows_done: int


@dataclass(frozen=True)
class OutputStatus:
    """Where one output stands (see the module's docstring). Rows count input rows: ``rows_done``
    is ``rows_out + rows_rejected``, which reaches ``rows_planned`` when the output is done.

    :param path: the output as given (for a table, the writer's staging output).
    :param state: ``done`` (every planned range committed), ``running`` (a live lease),
        ``partial`` (stopped part-way: some committed, no live writer), ``not started``.
    :param commit_rows_per_s: the current commit rate: rows done per second over the last
        :data:`.timeline.RATE_WINDOW_S` seconds of the current writer's time, while running; None
        otherwise, or without commits to measure.
    :param average_commit_rows_per_s: rows done over the time the tries that wrote them spent
        committing (:func:`.tries.average_commit_rate`: the gaps between tries are not counted).
    :param eta_s: seconds left at the current commit rate, while running.
    :param last_writer: the try that committed the newest range (:meth:`.commit_record.CommitWriter.to_dict`);
        None without commits, or when its record (of an older release) names no writer.
    :param tries: the tries that committed ranges, in the order of their last commit (:class:`.tries.WritingTry`).
    :param lease: the whole output's lease (None: never taken): who holds or last held it, which
        may be a try that found nothing to do, not the writer.
    :param shards: the mapped shards' writers, by lease key.
    :param timeline: cumulative figures per commit time, oldest first (thinned to :data:`TIMELINE_POINTS`).
    :param writer: a table output's writer folder (else None); ``generation`` the generation read.
    :param table_commits: a table output's table commits decided (each adds its ranges to the table).
    :param ranges_in_table_commits: ranges those commits add.
    :param read_s: seconds the reading took.
    :param files: with ``detail``: the input plan, per file (rows, ranges, and what is committed).
    :param committed_mask: with ``detail``: one character per planned range in plan order, ``1``
        committed, ``0`` not (a picture of which ranges are done).
    :param rejects_files: with ``detail``: the committed rejects files, relative to the output, in
        range order (a sample is read from them: :func:`.rejects.sample_rejects`).
    :param tokens_in: prompt tokens of the committed ranges, where a model counted them (LLM
        engines; None: none counted); ``tokens_out`` the generated tokens. What the output holds,
        not what its tries spent.
    :param truncated_rows: committed rows whose text a model cut to its maximum length (embedding
        engines; None: not counted).
    """

    path: str
    state: State
    ranges_planned: int
    rows_planned: int
    ranges_committed: int
    rows_out: int
    rows_rejected: int
    engine_errors: int
    rows_done: int
    first_commit_at: float | None
    last_commit_at: float | None
    commit_rows_per_s: float | None
    average_commit_rows_per_s: float | None
    eta_s: float | None
    last_writer: dict[str, Any] | None
    tries: list[WritingTry]
    lease: LeaseStatus | None
    shards: list[ShardStatus]
    timeline: list[TimelinePoint]
    read_at: float
    read_s: float
    objects_read: dict[str, int] = field(default_factory=dict)
    writer: str | None = None
    generation: int | None = None
    table_commits: int | None = None
    ranges_in_table_commits: int | None = None
    files: list[FileProgress] | None = None
    committed_mask: str | None = None
    rejects_files: list[str] | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    truncated_rows: int | None = None

    @property
    def fraction_done(self) -> float:
        """Rows done over rows planned (1.0 for an output that planned none)."""
        return self.rows_done / self.rows_planned if self.rows_planned else float(self.state == "done")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with :attr:`fraction_done` (the ``detail`` fields only when read)."""
        document = {**asdict(self), "fraction_done": round(self.fraction_done, 6)}
        for name in ("files", "committed_mask", "rejects_files"):
            if document[name] is None:
                del document[name]
        return document


def read_status(
    output_path: str,
    storage_options: dict[str, Any] | None = None,
    *,
    lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S,
    now: float | None = None,
    detail: bool = False,
) -> OutputStatus:
    """The status of the Parquet output at ``output_path``.

    :param output_path: the output folder, local or a URL.
    :param storage_options: fsspec options for a remote path (one filesystem's, or keyed by store).
    :param lease_timeout_s: for a lease recorded without its holder's ``lease_timeout`` (by an
        older release): a holder silent for longer no longer counts as running.
    :param now: the time to measure ages against (default: the clock).
    :param detail: also the input plan per file and which ranges are committed (:attr:`OutputStatus.files`,
        :attr:`OutputStatus.committed_mask`: what a UI draws).
    :raises OutputNotFoundError: nothing was planned at ``output_path``.
    """
    started = time.perf_counter()
    ledger = OutputLedger.open(output_path, storage_options)
    return _read(ledger, ledger, started, lease_timeout_s, now, detail)


def read_table_status(
    table_root: str,
    partition: dict[str, str],
    storage_options: dict[str, Any] | None = None,
    *,
    lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S,
    now: float | None = None,
    detail: bool = False,
) -> list[OutputStatus]:
    """The status of each writer that staged rows for ``partition`` of the Delta or Iceberg table
    at ``table_root`` (a Delta table's root, an Iceberg table's location): the generation it is
    writing now, with the writer's leases. Writers in the order of their folders' names.

    :raises OutputNotFoundError: no writer of this provider staged rows for the partition.
    """
    started = time.perf_counter()
    fs, root = resolve(table_root, storage_options)
    statuses = []
    for staged in table_writers(fs, root, table_root, partition):
        display = f"{table_root.rstrip('/')}/{staged.relpath}"
        # The writer's folder holds its leases, as an output folder does.
        writer = OutputLedger(fs, f"{root}/{staged.relpath}", display)
        staging = OutputLedger(
            fs, f"{root}/{staged.generation_relpath}", f"{table_root.rstrip('/')}/{staged.generation_relpath}"
        )
        status = _read(staging, writer, started, lease_timeout_s, now, detail)
        decided = intents(fs, staging.root)
        statuses.append(
            replace(
                status,
                writer=staged.relpath,
                generation=staged.generation,
                table_commits=len(decided),
                ranges_in_table_commits=len({r for intent in decided for r in intent.ranges}),
                read_s=round(time.perf_counter() - started, 4),
            )
        )
    return statuses


def table_writers(fs: AbstractFileSystem, root: str, table_root: str, partition: dict[str, str]) -> list[StagedWriter]:
    """The writers that staged rows for ``partition`` of the table at ``root`` (``table_root`` as
    the user named it, for the error).

    :raises OutputNotFoundError: none did.
    """
    writers = staged_writers(fs, root, partition)
    if not writers:
        raise OutputNotFoundError(
            f"{table_root}: no writer of this provider staged rows for partition {partition} "
            f"(no {partition_folder(partition)}/<writer>/{META_DIR}/{GENERATION_RECORD})"
        )
    return writers


def _read(
    ledger: OutputLedger,
    lease_owner: OutputLedger,
    started: float,
    lease_timeout_s: float,
    now: float | None,
    detail: bool = False,
) -> OutputStatus:
    """The status of ``ledger``'s output, whose leases are kept by ``lease_owner`` (itself, or a
    table writer's folder)."""
    fs = ledger.fs
    fs.invalidate_cache()
    plan = ledger.load_plan()
    if plan is None:
        raise OutputNotFoundError(
            f"{ledger.display_path}: no {META_DIR}/plan.json there: not an output of this provider, "
            "or not planned yet (check the path, and that its run has started)"
        )
    committed = ledger.committed()
    now = time.time() if now is None else now

    # Planned rows from the files' row groups, as the planner cut them: no data file is read.
    ranges = recorded_ranges(plan.input, plan.job["rows_per_range"], plan.job.get("max_rows"))
    planned_ids = {r.id for r in ranges}
    mine = {r: record for r, record in committed.items() if r in planned_ids}
    rows_out = sum(r.rows for r in mine.values())
    rejected = sum(r.rejected for r in mine.values())
    engine_errors = sum(r.engine_errors for r in mine.values())
    counts = count_totals(mine.values())
    rows_planned = sum(r.rows for r in ranges)

    lease = lease_status(lease_owner, lease_owner.lease_folder(), OUTPUT_SCOPE, lease_timeout_s, now)
    count = ledger.load_shards(plan)
    planned = {} if count is None else {shard_key([r.id for r in g]): g for g in contiguous_groups(ranges, count)}
    shards = shard_writers(lease_owner, mine, ledger.last_scopes, planned, lease_timeout_s, now)
    live = [s for s in [lease, *(p.lease for p in shards)] if s is not None and s.live]

    timeline = cumulative(mine)
    done = len(mine) == len(ranges)
    if done:
        state: State = "done"
    elif live:
        state = "running"
    elif mine:
        state = "partial"
    else:
        state = "not started"
    # Current: of the running writer only; a stopped output's rate is its average.
    rate = current_rate(timeline, now, min(s.taken_at for s in live)) if state == "running" else None
    rows_done = rows_out + rejected
    eta = (rows_planned - rows_done) / rate if rate else None
    tries = writing_tries(mine.values())
    return OutputStatus(
        path=ledger.display_path,
        state=state,
        ranges_planned=len(ranges),
        rows_planned=rows_planned,
        ranges_committed=len(mine),
        rows_out=rows_out,
        rows_rejected=rejected,
        engine_errors=engine_errors,
        rows_done=rows_done,
        first_commit_at=timeline[0].time if timeline else None,
        last_commit_at=timeline[-1].time if timeline else None,
        commit_rows_per_s=None if rate is None else round(rate, 1),
        average_commit_rows_per_s=average_commit_rate(tries),
        eta_s=None if eta is None else round(eta, 1),
        last_writer=tries[-1].writer if tries else None,
        tries=tries,
        lease=lease,
        shards=shards,
        timeline=thin(timeline, TIMELINE_POINTS),
        read_at=now,
        read_s=round(time.perf_counter() - started, 4),
        objects_read=dict(ledger.last_read),
        **counts,
        files=_files(plan.input, ranges, mine) if detail else None,
        committed_mask="".join("1" if r.id in mine else "0" for r in ranges) if detail else None,
        rejects_files=rejects_files(mine) if detail else None,
    )


def rejects_files(committed: dict[str, CommitRecord]) -> list[str]:
    """The rejects files the commit records ``committed`` name, relative to the output, sorted."""
    return sorted(name for record in committed.values() for name in record.reject_files)


def _files(recorded: dict[str, Any], ranges: list[Any], committed: dict[str, CommitRecord]) -> list[FileProgress]:
    """The planned files with their ranges and what of them is committed (ranges in plan order)."""
    names = [f["relpath"] for f in recorded.get("files", ())]
    counts = [[0, 0, 0, 0] for _ in names]  # rows, ranges, ranges committed, rows done
    for r in ranges:
        count = counts[r.file_index]
        count[0] += r.rows
        count[1] += 1
        if (record := committed.get(r.id)) is not None:
            count[2] += 1
            count[3] += record.input_rows
    return [FileProgress(name, *count) for name, count in zip(names, counts, strict=True)]
