"""The writer lease of an output (or of one shard's ranges): one writer at a time, fenced commits.

A lease is a folder of generation files, ``_raybatch/lease/<generation>.json``; the highest
generation is the current lease. Taking the lease creates the next generation's file with a
create-if-absent write (a hard link locally, ``If-None-Match: *`` on S3), so of two
writers racing for it exactly one wins, on every filesystem. The holder rewrites its own file
(the heartbeat) while it runs and marks it released at the end; it is fenced as soon as a higher
generation exists: every commit and every removal first checks that its generation is still the
highest, and a writer that could not renew within half the timeout stops by itself.

A lease is taken over when its holder released it, when its heartbeat is older than the
holder's own ``lease_timeout`` (recorded with the lease: a taker with a shorter one must not
judge a holder that heartbeats at its own, slower pace), or at once when its holder was a process
on this host that no longer exists (a killed task or Ray job driver: its retry need not wait for
the timeout). :meth:`LeaseRecord.is_live` is that rule, for writers and for ``raybatch status`` alike.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import socket
import threading
import time
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any

from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.commit.commit_record import CommitWriter, task_instance_of
from airflow_provider_raybatch.pipeline.config import DEFAULT_LEASE_TIMEOUT_S
from airflow_provider_raybatch.pipeline.errors import LeaseLostError, OutputBusyError
from airflow_provider_raybatch.pipeline.store.files import create_file, ls, read_json, write_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseHolder:
    """Who writes: the Airflow task instance (if any) and the process that commits."""

    run_key: str | None = None
    try_number: int | None = None
    ray_job: str | None = None
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    pid_started: float | None = field(default_factory=lambda: _process_start(os.getpid()))

    def task_instance(self) -> tuple[str, str, str, str] | None:
        """(dag id, run id, task id, map index) of an Airflow task's run key; None for another key."""
        return task_instance_of(self.run_key)

    def writer(self, started_at: float) -> CommitWriter:
        """This holder as its commit records name it, its stages started at ``started_at``."""
        return CommitWriter(self.run_key, self.try_number, self.ray_job, self.host, self.pid, started_at)

    def describe(self) -> str:
        who = []
        if (ti := self.task_instance()) is not None:
            dag, run, task, map_index = ti
            who.append(f"dag {dag}, run {run}, task {task}" + (f" [{map_index}]" if map_index != "-1" else ""))
        elif self.run_key:
            who.append(self.run_key)
        if self.try_number is not None:
            who.append(f"try {self.try_number}")
        who.append(f"Ray job {self.ray_job}" if self.ray_job else f"pid {self.pid}")
        return ", ".join(who) + f" on host {self.host}"

    def is_dead_here(self) -> bool:
        """True when the holder was a process of this host that has ended (its pid gone or reused)."""
        if self.host != socket.gethostname():
            return False
        started = _process_start(self.pid)
        return started is None or (self.pid_started is not None and started != self.pid_started)


def _process_start(pid: int) -> float | None:
    """The process's start time in clock ticks since boot (None if there is no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may hold spaces: count fields after its closing parenthesis.
            return float(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return -1.0  # alive, start time unknown (no /proc)


@dataclass
class LeaseRecord:
    """One generation of a lease, as its file holds it: who took it, when, its last heartbeat, and
    the holder's own lease_timeout. :meth:`is_live` is the one rule for whether it is still held
    (writers taking over, ``raybatch status`` and the UI, the verifier's stray files)."""

    generation: int
    holder: LeaseHolder
    taken_at: float
    heartbeat: float
    released: bool = False
    #: the holder's lease_timeout, by which its heartbeat is judged; None: a record of an older release
    timeout_s: float | None = None

    def timeout(self, default_s: float = DEFAULT_LEASE_TIMEOUT_S) -> float:
        """The holder's lease_timeout; ``default_s`` for a record without one (an older release's,
        whose default it was: :data:`.config.DEFAULT_LEASE_TIMEOUT_S` has been 120 s since leases exist)."""
        return self.timeout_s if self.timeout_s else default_s

    def is_live(self, now: float, default_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S) -> bool:
        """Whether the holder still counts as writing: not released, not a process of this host that
        has ended, and a heartbeat within its own timeout (:meth:`timeout`).

        :param now: the time to judge the heartbeat's age at.
        :param default_timeout_s: the timeout of a record without one.
        """
        if self.released or self.holder.is_dead_here():
            return False
        return now - self.heartbeat <= self.timeout(default_timeout_s)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> LeaseRecord:
        # Fields a newer release may add are ignored: its leases stay readable here.
        known = {f.name for f in fields(cls)}
        holder = {k: v for k, v in data["holder"].items() if k in {f.name for f in fields(LeaseHolder)}}
        return cls(**{**{k: v for k, v in data.items() if k in known}, "holder": LeaseHolder(**holder)})


class Lease:
    """One scope's lease (the whole output, or one shard's ranges) in ``folder``.

    :param timeout_s: this writer's lease_timeout, recorded with the lease it takes: seconds without
        its heartbeat after which another writer may take over. A lease held by another writer is
        judged by that writer's recorded timeout, not by this one.
    """

    def __init__(self, fs: AbstractFileSystem, folder: str, display: str, holder: LeaseHolder, timeout_s: float):
        self.fs, self.folder, self.display, self.holder, self.timeout_s = fs, folder, display, holder, timeout_s
        self.record: LeaseRecord | None = None
        self._renewed = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- taking and giving back -------------------------------------------------------------

    def live(self) -> LeaseRecord | None:
        """The current record if its holder still counts as writing (None: free to take)."""
        return self._live(self.current())

    def _live(self, current: LeaseRecord | None) -> LeaseRecord | None:
        if current is None:
            return None
        if current.is_live(time.time()):
            return current
        if current.released:
            return None
        if current.holder.is_dead_here():
            log.warning("Lease on %s: its holder (%s) has ended", self.display, current.holder.describe())
        else:
            log.warning(
                "Lease on %s: no heartbeat from %s for %.0f s (its lease_timeout=%g s): it may be taken over",
                self.display,
                current.holder.describe(),
                time.time() - current.heartbeat,
                current.timeout(),
            )
        return None

    def busy_error(self, record: LeaseRecord) -> OutputBusyError:
        return OutputBusyError(
            f"{self.display} is being written by {record.holder.describe()} since {_clock(record.taken_at)}; "
            f"last heartbeat {time.time() - record.heartbeat:.0f} s ago (taken over after {record.timeout():g} s "
            "without one, its lease_timeout). Two writers at once would mix their results: retry once it has finished."
        )

    def acquire(self) -> None:
        """Take the lease, or raise :class:`OutputBusyError` naming the live holder."""
        current = self.current()
        if self._live(current) is not None:
            raise self.busy_error(current)
        generation = 1 if current is None else current.generation + 1
        now = time.time()
        record = LeaseRecord(generation, self.holder, now, now, timeout_s=self.timeout_s)
        if not self._create(self._path(generation), record):
            winner = self.current()
            who = winner.holder.describe() if winner else "another writer"
            raise OutputBusyError(f"{self.display} was taken by {who} at the same moment; retry later")
        self.record, self._renewed = record, time.monotonic()
        self._remove_older(generation)
        self._thread = threading.Thread(target=self._heartbeat, name="raybatch-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Give the lease back (kept as a released record, so that a fenced writer still sees a newer one)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if self.record is not None and self.holds():
                record = asdict(replace(self.record, released=True))
                write_json(self.fs, self._path(self.record.generation), record, retry_s=self.timeout_s / 4)
        except Exception as e:  # noqa: BLE001 - see below
            # Often the very failure the run is ending on (a full disk, storage gone): it must not
            # hide that error. Unmarked, the lease is taken over once its heartbeat is stale.
            log.warning("Could not release the lease of %s (%s); it expires after %gs", self.display, e, self.timeout_s)
        self.record = None

    # --- fencing ----------------------------------------------------------------------------

    def holds(self) -> bool:
        current = self.current()
        return self.record is not None and current is not None and current.generation == self.record.generation

    def check(self) -> None:
        """Before a commit or a removal: raise :class:`LeaseLostError` unless this writer still holds the lease."""
        if self.record is None:
            raise LeaseLostError(f"no lease held on {self.display}")
        current = self.current()
        if current is None or current.generation != self.record.generation:
            raise self._lost(current)
        # A writer paused past the timeout (SIGSTOP, a long GC, a frozen VM) may have been replaced
        # without a newer generation being visible yet: it stops rather than risk a second writer.
        if time.monotonic() - self._renewed > self.timeout_s / 2:
            raise LeaseLostError(
                f"the lease on {self.display} was not renewed for {time.monotonic() - self._renewed:.0f} s "
                f"(lease_timeout={self.timeout_s:g} s): another writer may have taken over, so this one stops"
            )

    def takeover(self) -> LeaseLostError | None:
        """The error naming who took this writer's lease, and when, if another generation is the
        lease now; None while this writer holds it (or holds none).

        A fenced writer often meets the takeover first as something else (its temporary files
        removed by the new holder's start-up, a write into a folder that is gone): it reports this
        instead, so that the cause is named, not its symptom.
        """
        if self.record is None:
            return None
        current = self.current()
        if current is None or current.generation == self.record.generation:
            return None
        return self._lost(current)

    def _lost(self, current: LeaseRecord | None) -> LeaseLostError:
        if current is None:
            who = "someone who then released it"
        else:
            mine = self.record
            who = (
                f"{current.holder.describe()} (generation {current.generation}, taken at {_clock(current.taken_at)}; "
                f"this writer held generation {mine.generation}, last renewed at {_clock(mine.heartbeat)})"
            )
        return LeaseLostError(
            f"the lease on {self.display} was taken over by {who}: this writer commits and removes nothing more "
            "(its committed ranges stand; the new holder finishes the output)"
        )

    # --- files --------------------------------------------------------------------------------

    def current(self) -> LeaseRecord | None:
        """The highest generation's record (None if the lease was never taken)."""
        generations = sorted(
            int(name.removesuffix(".json"))
            for name in (posixpath.basename(p) for p in ls(self.fs, self.folder))
            if name.endswith(".json") and name.removesuffix(".json").isdigit()
        )
        for generation in reversed(generations):
            try:
                return LeaseRecord.parse(read_json(self.fs, self._path(generation)))
            except FileNotFoundError:  # removed by a newer holder meanwhile
                continue
        return None

    def _path(self, generation: int) -> str:
        return f"{self.folder}/{generation:012d}.json"

    def _create(self, path: str, record: LeaseRecord) -> bool:
        """Create ``path`` only if it does not exist; False when another writer created it first.

        A create whose reply was lost and that the client then retried is refused by the store
        although it won: :func:`.files.create_file` reads the object back, and the record (this
        holder, this moment) tells this writer's own from another's.
        """
        return create_file(self.fs, path, json.dumps(asdict(record), indent=1, sort_keys=True).encode())

    def _remove_older(self, generation: int) -> None:
        """Tidy up older generations (best effort: the highest generation is the lease, whatever is left)."""
        try:
            for g in range(max(1, generation - 5), generation - 1):  # keep the previous one: it names who was replaced
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(self._path(g))
        except Exception as e:  # noqa: BLE001
            log.warning("Could not remove old generations of the lease on %s: %s", self.display, e)

    def _heartbeat(self) -> None:
        interval = self.timeout_s / 4
        while not self._stop.wait(interval):
            try:
                if not self.holds():
                    log.warning("Lease on %s taken over: stopping the heartbeat", self.display)
                    return
                self.record = replace(self.record, heartbeat=time.time())
                write_json(self.fs, self._path(self.record.generation), asdict(self.record), retry_s=interval)
                self._renewed = time.monotonic()
            except Exception as e:  # noqa: BLE001 - a missed beat is retried; check() fences a long gap
                log.warning("Could not renew the lease on %s: %s", self.display, e)


def _clock(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
