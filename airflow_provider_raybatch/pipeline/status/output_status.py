"""Where an output stands, read from its bookkeeping only: :class:`OutputStatus`, by :func:`read_status`.

What the command line's ``status`` prints and what a UI would draw: planned and committed ranges
and rows, rejects, a timeline of rows committed, the current rate and the time left, the lease
holders and the run's state. It reads ``plan.json``, the commit records (the manifest and the
segments, once: :meth:`.commit_log.CommitLog.committed`) and the leases' newest generations,
never a data file, so it answers quickly however large the output (``benchmarks/status.py``).

A table output (:func:`read_table_status`) is read per writer: each writer that staged rows for
the partition has a generation being written, a Parquet output of its own under the table
(:mod:`.tables.staging`), whose status is read as above, with the writer's leases.

What the ledger does not hold is not guessed: a mapped partition's planned ranges are known only
to the planning task (its XCom), so a partition's progress counts what it committed, not what is
left of it.
"""

from __future__ import annotations

import bisect
import posixpath
import socket
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from airflow_provider_raybatch.pipeline.commit.commit_log import OUTPUT_SCOPE
from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord
from airflow_provider_raybatch.pipeline.commit.lease import Lease, LeaseHolder
from airflow_provider_raybatch.pipeline.commit.ledger import META_DIR, OutputLedger, partition_key
from airflow_provider_raybatch.pipeline.config import DEFAULT_LEASE_TIMEOUT_S
from airflow_provider_raybatch.pipeline.errors import RayBatchError
from airflow_provider_raybatch.pipeline.planning.planner import RowRange, contiguous_groups, recorded_ranges
from airflow_provider_raybatch.pipeline.store.files import ls, read_json, resolve
from airflow_provider_raybatch.pipeline.summary import token_totals

State = Literal["done", "running", "partial", "not started"]

#: Seconds of commits the current rate is measured over.
RATE_WINDOW_S = 120.0
#: Points of the timeline at most (a long run's are thinned evenly: a chart needs no more).
TIMELINE_POINTS = 500


class OutputNotFoundError(RayBatchError):
    """The path holds no output of this provider (nothing planned there)."""


@dataclass(frozen=True)
class LeaseStatus:
    """The newest generation of one lease: who holds (or last held) it, and whether it still counts.

    :param scope: ``"output"`` for the whole output's lease, else the mapped partition's lease key.
    :param holder: who, in words (:meth:`.lease.LeaseHolder.describe`).
    :param dag_id: the Airflow task instance that holds it, when the writer is a task (from its run key
        ``dag/run/task/map_index``); likewise ``run_id``, ``task_id``, ``map_index``.
    :param heartbeat_age_s: seconds since its holder last renewed it (at the time of reading).
    :param holder_gone: True when the holder was a process of this host that has ended; None when it
        ran on another host (not knowable from here).
    :param live: it still counts as held: not released, holder not gone, a heartbeat within the timeout.
    """

    scope: str
    generation: int
    holder: str
    run_key: str | None
    dag_id: str | None
    run_id: str | None
    task_id: str | None
    map_index: int | None
    try_number: int | None
    ray_job: str | None
    host: str
    pid: int
    taken_at: float
    heartbeat: float
    heartbeat_age_s: float
    released: bool
    holder_gone: bool | None
    live: bool


@dataclass(frozen=True)
class PartitionStatus:
    """A mapped partition's writer: its lease and the ranges it committed (as its segments hold them;
    once a whole-output run folds them into the manifest they are no longer told apart).

    :param index: its map index, and ``ranges_planned`` / ``rows_planned`` its share of the plan,
        when the planning task recorded how many partitions it planned (``_raybatch/partitions.json``);
        None for a writer of another plan. A planned partition is listed before its task starts.
    """

    key: str
    lease: LeaseStatus | None
    ranges_committed: int
    rows_committed: int
    index: int | None = None
    ranges_planned: int | None = None
    rows_planned: int | None = None


@dataclass(frozen=True)
class TimelinePoint:
    """Cumulative figures at one commit time (seconds since the epoch): ranges, and input rows
    done (written or rejected)."""

    time: float
    ranges: int
    rows: int


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
    :param rate_rows_per_s: rows done per second over the last :data:`RATE_WINDOW_S` seconds (of
        the current writer's time, while running), None without commits to measure.
    :param eta_s: seconds left at that rate, while running.
    :param lease: the whole output's lease (None: never taken).
    :param partitions: the mapped partitions' writers, by lease key.
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
    rate_rows_per_s: float | None
    eta_s: float | None
    lease: LeaseStatus | None
    partitions: list[PartitionStatus]
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
    partition_dir = "/".join(f"{k}={v}" for k, v in partition.items())
    statuses = []
    for folder in sorted(ls(fs, f"{root}/{partition_dir}")):
        folder = folder.rstrip("/")
        record_path = f"{folder}/{META_DIR}/generation.json"
        try:
            number = read_json(fs, record_path)["number"]
        except FileNotFoundError:
            continue  # not a writer's folder
        relpath = f"{partition_dir}/{posixpath.basename(folder)}"
        display = f"{table_root.rstrip('/')}/{relpath}"
        writer = OutputLedger(fs, folder, display)  # holds the writer's leases, as an output folder does
        staging = OutputLedger(fs, f"{folder}/g{number}", f"{display}/g{number}")
        status = _read(staging, writer, started, lease_timeout_s, now, detail)
        intents = [read_json(fs, p) for p in sorted(ls(fs, f"{staging.meta}/table")) if p.endswith(".json")]
        statuses.append(
            replace(
                status,
                writer=relpath,
                generation=number,
                table_commits=len(intents),
                ranges_in_table_commits=len({r for intent in intents for r in intent["ranges"]}),
                read_s=round(time.perf_counter() - started, 4),
            )
        )
    if not statuses:
        raise OutputNotFoundError(
            f"{table_root}: no writer of this provider staged rows for partition {partition} "
            f"(no {partition_dir}/<writer>/{META_DIR}/generation.json)"
        )
    return statuses


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
    tokens_in, tokens_out = token_totals(mine.values())
    rows_planned = sum(r.rows for r in ranges)

    lease = _lease_status(lease_owner, lease_owner.lease_folder(), OUTPUT_SCOPE, lease_timeout_s, now)
    count = ledger.load_partitions(plan)
    planned = {} if count is None else {partition_key([r.id for r in g]): g for g in contiguous_groups(ranges, count)}
    partitions = _partitions(lease_owner, mine, ledger.last_scopes, planned, lease_timeout_s, now)
    live = [s for s in [lease, *(p.lease for p in partitions)] if s is not None and s.live]

    timeline = _timeline(mine)
    done = len(mine) == len(ranges)
    if done:
        state: State = "done"
    elif live:
        state = "running"
    elif mine:
        state = "partial"
    else:
        state = "not started"
    rate = _rate(timeline, now if state == "running" else None, min((s.taken_at for s in live), default=None))
    rows_done = rows_out + rejected
    eta = (rows_planned - rows_done) / rate if state == "running" and rate else None
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
        rate_rows_per_s=None if rate is None else round(rate, 1),
        eta_s=None if eta is None else round(eta, 1),
        lease=lease,
        partitions=partitions,
        timeline=_thin(timeline, TIMELINE_POINTS),
        read_at=now,
        read_s=round(time.perf_counter() - started, 4),
        objects_read=dict(ledger.last_read),
        tokens_in=tokens_in,
        tokens_out=tokens_out,
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


def _lease_status(owner: OutputLedger, folder: str, scope: str, timeout_s: float, now: float) -> LeaseStatus | None:
    # A reader's Lease object: it only reads the newest generation (current()), never takes it.
    record = Lease(owner.fs, folder, owner.display_path, LeaseHolder(), timeout_s).current()
    if record is None:
        return None
    holder = record.holder
    dag_id = run_id = task_id = None
    map_index = None
    if (ti := holder.task_instance()) is not None:
        dag_id, run_id, task_id, index = ti
        map_index = int(index) if index.lstrip("-").isdigit() else None
    # Whether its process has ended is known on its own host only.
    gone = holder.is_dead_here() if holder.host == socket.gethostname() else None
    age = max(0.0, now - record.heartbeat)
    return LeaseStatus(
        scope=scope,
        generation=record.generation,
        holder=holder.describe(),
        run_key=holder.run_key,
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        map_index=map_index,
        try_number=holder.try_number,
        ray_job=holder.ray_job,
        host=holder.host,
        pid=holder.pid,
        taken_at=record.taken_at,
        heartbeat=record.heartbeat,
        heartbeat_age_s=round(age, 1),
        released=record.released,
        holder_gone=gone,
        # The writers' own rule (the holder's recorded timeout; the reader's for an older record).
        live=record.is_live(now, timeout_s),
    )


def _partitions(
    owner: OutputLedger,
    committed: dict[str, CommitRecord],
    scopes: dict[str, str],
    planned: dict[str, list[RowRange]],
    timeout_s: float,
    now: float,
) -> list[PartitionStatus]:
    """The mapped partitions' writers: those planned (by key, in plan order), with a lease, or whose
    segments hold records."""
    counts: dict[str, list[int]] = {}
    for range_id, scope in scopes.items():
        if scope != OUTPUT_SCOPE and range_id in committed:
            record = committed[range_id]
            count = counts.setdefault(scope, [0, 0])
            count[0] += 1
            count[1] += record.input_rows
    folders = {posixpath.basename(f.rstrip("/")): f.rstrip("/") for f in owner.partition_lease_folders()}
    index = {key: i for i, key in enumerate(planned)}
    keys = sorted(folders.keys() | counts.keys() | planned.keys(), key=lambda k: (index.get(k, len(index)), k))
    return [
        PartitionStatus(
            key=key,
            lease=_lease_status(owner, folders[key], key, timeout_s, now) if key in folders else None,
            ranges_committed=counts.get(key, [0, 0])[0],
            rows_committed=counts.get(key, [0, 0])[1],
            index=index.get(key),
            ranges_planned=len(planned[key]) if key in planned else None,
            rows_planned=sum(r.rows for r in planned[key]) if key in planned else None,
        )
        for key in keys
    ]


def _timeline(committed: dict[str, CommitRecord]) -> list[TimelinePoint]:
    """Cumulative ranges and rows per commit time (records without one, of layout 1, are left out)."""
    by_time: dict[float, list[int]] = {}
    for record in committed.values():
        if (at := record.committed_at) is not None:
            point = by_time.setdefault(at, [0, 0])
            point[0] += 1
            point[1] += record.input_rows
    points, ranges, rows = [], 0, 0
    for at in sorted(by_time):
        ranges += by_time[at][0]
        rows += by_time[at][1]
        points.append(TimelinePoint(at, ranges, rows))
    return points


def _rate(timeline: list[TimelinePoint], now: float | None, taken_at: float | None) -> float | None:
    """Rows per second over the last :data:`RATE_WINDOW_S` seconds: up to ``now`` while running
    (a stalled run's rate falls), else up to the last commit; never before the current writer took
    its lease (the gap after a killed try is not the rate). None without commits in the window."""
    if not timeline:
        return None
    end = timeline[-1].time if now is None else max(now, timeline[-1].time)
    start = end - RATE_WINDOW_S
    if taken_at is not None:
        start = max(start, taken_at)
    times = [p.time for p in timeline]
    before = bisect.bisect_right(times, start)  # points at or before the window's start
    if before == len(timeline):
        return 0.0 if now is not None else None
    if before == 0 and taken_at is None:
        # The window holds the first commits: measure from the first, whose rows were made before it.
        start = timeline[0].time
        base = timeline[0].rows
    else:
        base = timeline[before - 1].rows if before else 0
    if end <= start:
        return None
    return (timeline[-1].rows - base) / (end - start)


def _thin(points: list[TimelinePoint], most: int) -> list[TimelinePoint]:
    """At most ``most`` points, evenly spaced by position, the last always kept."""
    if len(points) <= most:
        return points
    step = len(points) / (most - 1)
    return [points[int(i * step)] for i in range(most - 1)] + [points[-1]]
