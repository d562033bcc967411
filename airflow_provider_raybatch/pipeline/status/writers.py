"""Who writes an output: its lease's holder, and its mapped shards' writers, as
:class:`.output_status.OutputStatus` shows them (read from the leases' newest generations)."""

from __future__ import annotations

import posixpath
import socket
from dataclasses import dataclass

from airflow_provider_raybatch.pipeline.commit.commit_log import OUTPUT_SCOPE
from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord
from airflow_provider_raybatch.pipeline.commit.lease import Lease, LeaseHolder
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.planning.planner import RowRange


@dataclass(frozen=True)
class LeaseStatus:
    """The newest generation of one lease: who holds (or last held) it, and whether it still counts.

    :param scope: ``"output"`` for the whole output's lease, else the mapped shard's lease key.
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
class ShardStatus:
    """A mapped shard's writer: its lease and the ranges it committed (as its segments hold them;
    once a whole-output run folds them into the manifest they are no longer told apart).

    :param index: its map index, and ``ranges_planned`` / ``rows_planned`` its share of the plan,
        when the planning task recorded how many shards it planned (``_raybatch/partitions.json``);
        None for a writer of another plan. A planned shard is listed before its task starts.
    """

    key: str
    lease: LeaseStatus | None
    ranges_committed: int
    rows_committed: int
    index: int | None = None
    ranges_planned: int | None = None
    rows_planned: int | None = None


def lease_status(owner: OutputLedger, folder: str, scope: str, timeout_s: float, now: float) -> LeaseStatus | None:
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


def shard_writers(
    owner: OutputLedger,
    committed: dict[str, CommitRecord],
    scopes: dict[str, str],
    planned: dict[str, list[RowRange]],
    timeout_s: float,
    now: float,
) -> list[ShardStatus]:
    """The mapped shards' writers: those planned (by key, in plan order), with a lease, or whose
    segments hold records."""
    counts: dict[str, list[int]] = {}
    for range_id, scope in scopes.items():
        if scope != OUTPUT_SCOPE and range_id in committed:
            record = committed[range_id]
            count = counts.setdefault(scope, [0, 0])
            count[0] += 1
            count[1] += record.input_rows
    folders = {posixpath.basename(f.rstrip("/")): f.rstrip("/") for f in owner.shard_lease_folders()}
    index = {key: i for i, key in enumerate(planned)}
    keys = sorted(folders.keys() | counts.keys() | planned.keys(), key=lambda k: (index.get(k, len(index)), k))
    return [
        ShardStatus(
            key=key,
            lease=lease_status(owner, folders[key], key, timeout_s, now) if key in folders else None,
            ranges_committed=counts.get(key, [0, 0])[0],
            rows_committed=counts.get(key, [0, 0])[1],
            index=index.get(key),
            ranges_planned=len(planned[key]) if key in planned else None,
            rows_planned=sum(r.rows for r in planned[key]) if key in planned else None,
        )
        for key in keys
    ]
