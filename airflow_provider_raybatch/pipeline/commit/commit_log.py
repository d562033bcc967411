"""The ledger's commit records: where they are kept and how a writer reads, writes and merges them.

A commit record names a committed range's files and counts its rows. Layout version 2 keeps the
records in segments (``_raybatch/segments/<scope>.<writer>.<level>.<seq>.json``, a batch of
records per object, written by one writer) and in ``_raybatch/manifest.json`` (the records folded
together at the end of a run). :class:`CommitLog` is this part of :class:`.ledger.OutputLedger`,
which adds the output's plan, schemas and files.

Layout version 1 (outputs of earlier versions) listed every range in ``plan.json`` and kept one
record per range, ``_raybatch/commits/<range id>.json``. Such an output is still read and
resumed: records are read from all three places, and a version-1 output keeps getting per-range
records (a writer writes the layout of the output's plan) until a whole-output run upgrades it
(:meth:`.ledger.OutputLedger.upgrade`), after which an older provider refuses it with a clear message.

Why segments: an object store cannot append, so a writer's "log" is a sequence of immutable
objects, each holding the records of the ranges published since the previous one (records are
batched: :meth:`record` takes many). Rewriting one growing file per writer instead would cost
O(n) bytes per batch, O(n^2) per run. To keep the objects a resume reads few however long a
run, a writer merges its own segments as it goes, like a log-structured merge tree: every
:data:`SEGMENT_FANOUT` segments of one level become one segment of the next (written before
the merged ones are deleted: a crash in between leaves records twice, which reading tolerates).
A writer thus leaves at most ``SEGMENT_FANOUT x log(batches)`` segments, and the whole-output
writer folds everything into ``manifest.json`` at the end of its run (:meth:`compact`), so a
resume reads O(segments) objects, not one per range. Segments are named per writer (scope: the
whole output or a shard's lease key; a fresh id per writer): shards writing side by
side never write the same object, and only a whole-output writer, which excludes every shard
writer by the leases, rewrites the manifest.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.columns import COUNT_KEYS, TOKEN_KEYS
from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord, CommitWriter
from airflow_provider_raybatch.pipeline.errors import LeaseLostError, RayBatchError
from airflow_provider_raybatch.pipeline.store.files import absent, exists, ls, read_json, write_json

log = logging.getLogger(__name__)

#: The layout version this code writes, and the newest it reads (see the module's docstring).
PLAN_VERSION = 2
#: The layout of outputs with a record per range (``commits/<range id>.json``) and the ranges listed in the plan.
PER_RANGE_RECORDS = 1
#: Segments of one level a writer merges into one of the next level.
SEGMENT_FANOUT = 16
#: The scope of the whole-output writer's segments (a shard's is its lease key).
OUTPUT_SCOPE = "output"
#: Listings of the records :meth:`CommitLog.committed` makes before a segment merged away under it is an error.
_READ_ATTEMPTS = 20


class CommitLog:
    """The commit records of one output folder: read them all (:meth:`committed`), write a batch
    (:meth:`record`), merge and fold them (:meth:`finish`, :meth:`compact`).

    :param fs: the output's filesystem.
    :param root: the output folder (records name its files relative to it).
    :param display_path: the output as the user gave it (named in errors).
    :param meta: the output's bookkeeping folder, which holds the records.
    """

    def __init__(self, fs: AbstractFileSystem, root: str, display_path: str, meta: str):
        self.fs = fs
        self.root = root
        self.display_path = display_path
        self.meta = meta
        self.commits_dir = f"{self.meta}/commits"  # layout version 1
        self.segments_dir = f"{self.meta}/segments"
        self.manifest_path = f"{self.meta}/manifest.json"
        #: The layout this ledger writes: the recorded plan's (given to :class:`.ledger.OutputLedger`), else the newest.
        self.version = PLAN_VERSION
        #: The id of the plan this writer checked its configuration against (:meth:`.plan_record.PlanRecord.plan_id`),
        #: named in each record it writes; None without one (given, or written).
        self.plan_id: str | None = None
        #: Whose segments this writer writes (:class:`.ledger.OutputLedger`'s ``range_ids``), and this writer's own id
        #: in their names.
        self.scope = OUTPUT_SCOPE
        self.writer_id = uuid.uuid4().hex[:12]
        self._seq = 0
        self._levels: dict[int, list[str]] = {}  # this writer's segments by level, oldest first
        #: What the latest :meth:`committed` read: objects per kind ("manifest", "segments", "records").
        self.last_read: dict[str, int] = {}
        #: Range id -> scope of the segment its record was read from, by the latest :meth:`committed`
        #: (records in the manifest or in layout-1 files have none): which shard's writer committed it.
        self.last_scopes: dict[str, str] = {}
        self._segments_seen = False  # segments found by a read: there is something to fold
        #: Called before every publish, commit record and removal: raises once this writer lost its lease.
        self.fence: Callable[[], None] = lambda: None
        #: The try named in each record this writer writes (:meth:`record`), set by the run that
        #: holds the lease (its holder, and when its stages started); None: no writer named.
        self.writer: CommitWriter | None = None

    def committed(self) -> dict[str, CommitRecord]:
        """Range id -> commit record, for every committed range (from the manifest, the segments
        and the per-range records of layout version 1).

        Reads O(segments) objects. A segment merged away by its writer between the listing and
        the read is found again in the segment it was merged into: the listing is repeated (a
        writer that merges as fast as it commits can win that race several times in a row).
        """
        for _ in range(_READ_ATTEMPTS - 1):
            try:
                return self._read_records()[0]
            except FileNotFoundError:
                self.fs.invalidate_cache(self.meta)
        return self._read_records()[0]

    def _read_records(self) -> tuple[dict[str, CommitRecord], list[str]]:
        """Every commit record, and the segments and per-range record files they were read from."""
        # Listed before the manifest is read: a fold writes the manifest before it deletes what it
        # folded, so a record is in the manifest read or in a listed object (or its read fails,
        # and committed() reads again). Read the other way round, a fold in between could hide it.
        listed = {
            kind: _json_files(self.fs, folder)
            for kind, folder in (("records", self.commits_dir), ("segments", self.segments_dir))
        }
        records: dict[str, CommitRecord] = {}
        scopes: dict[str, str] = {}
        read = {"manifest": 0, "segments": 0, "records": 0}
        if exists(self.fs, self.manifest_path):
            _add_records(records, _decode(read_json(self.fs, self.manifest_path)))
            read["manifest"] = 1
        for kind, paths in listed.items():
            with ThreadPoolExecutor(max_workers=16) as pool:
                for path, data in zip(paths, pool.map(lambda p: read_json(self.fs, p), paths), strict=True):
                    found = _decode(data) if kind == "segments" else {data["range_id"]: CommitRecord.from_json(data)}
                    _add_records(records, found)
                    if kind == "segments":
                        scope = posixpath.basename(path).split(".", 1)[0]
                        scopes.update((r, scope) for r, record in found.items() if records[r] is record)
            read[kind] = len(paths)
        self.last_read = read
        self.last_scopes = scopes
        self._segments_seen = self._segments_seen or bool(read["segments"])
        return records, listed["records"] + listed["segments"]

    def record(self, records: list[CommitRecord]) -> list[CommitRecord]:
        """Write the records of published ranges durably: then, and only then, are they committed.
        Returns them as written (with their commit time and writer).

        Layout 2: one new segment holding them all (then this writer's segments are merged where a
        level is full); layout 1: one file per range. If they cannot be written, their files are
        unpublished again when the write is known not to have happened (best effort), and the error
        names the ranges.
        """
        if not records:
            return []
        self.fence()
        if self.version == PER_RANGE_RECORDS:
            written = [r.committed(None, self.writer) for r in records]
            writes = [
                (f"{self.commits_dir}/{w.range_id}.json", w.to_json(), [r])
                for r, w in zip(records, written, strict=True)
            ]
        else:
            now = round(time.time(), 3)
            written = [r.committed(now, self.writer) for r in records]
            writes = [(self._segment_path(0), _encode(written), records)]
        for done, (path, payload, _) in enumerate(writes):
            try:
                write_json(self.fs, path, payload, compact=self.version != PER_RANGE_RECORDS)
            except Exception as e:
                failed = [r for _, _, records_of in writes[done:] for r in records_of]
                if absent(self.fs, path):
                    # Known not written: unpublish the ranges' files, so that readers never see them.
                    # Otherwise the write may have been applied all the same (a store can apply a PUT
                    # and answer 500): the files stay, and the next try finds each range either
                    # recorded with its files or not recorded, and then removes them and redoes it.
                    # Fenced: once the lease is taken over, these names are the new holder's to write.
                    self.fence()
                    self._unpublish(failed)
                ids = [r.range_id for r in failed]
                what = (
                    f"range {ids[0]}"
                    if len(ids) == 1
                    else f"ranges {', '.join(ids[:3])}{' ...' if len(ids) > 3 else ''}"
                )
                raise RayBatchError(
                    f"cannot commit {what} of output {self.display_path!r}: {type(e).__name__}: {e}. "
                    "The ranges committed before are kept; these are committed or redone on a retry"
                ) from e
            if self.version != PER_RANGE_RECORDS:
                self._levels.setdefault(0, []).append(path)
        self._merge(SEGMENT_FANOUT)
        return written

    def _segment_path(self, level: int) -> str:
        self._seq += 1
        return f"{self.segments_dir}/{self.scope}.{self.writer_id}.{level}.{self._seq:08d}.json"

    def _write_segment(self, level: int, records: list[CommitRecord]) -> None:
        path = self._segment_path(level)
        write_json(self.fs, path, _encode(records), compact=True)
        self._levels.setdefault(level, []).append(path)

    def _unpublish(self, records: list[CommitRecord]) -> None:
        for name in (name for record in records for name in record.files):
            with contextlib.suppress(OSError):
                self.fs.rm(f"{self.root}/{name}")

    def _merge(self, fanout: int) -> None:
        """Merge this writer's segments: each level holding ``fanout`` of them into one of the next.

        The records are durable already: a merge that fails is logged and left for :meth:`compact`.
        """
        level = 0
        try:
            while level in self._levels:
                paths = self._levels[level]
                if len(paths) >= fanout:
                    records: dict[str, CommitRecord] = {}
                    for path in paths:
                        records.update(_decode(read_json(self.fs, path)))
                    self.fence()
                    self._write_segment(level + 1, list(records.values()))
                    del self._levels[level]
                    for path in paths:
                        with contextlib.suppress(FileNotFoundError):
                            self.fs.rm(path)
                level += 1
        except LeaseLostError:
            raise
        except Exception as e:  # noqa: BLE001 - best effort, see above
            log.warning("Could not merge the commit records of %s (kept as they are): %s", self.display_path, e)

    def finish(self) -> None:
        """At the end of a writer's run: the whole output's writer folds every record into the
        manifest (:meth:`compact`); a shard's writer merges its scope's segments into one."""
        if self.scope == OUTPUT_SCOPE:
            if self._levels or self._segments_seen:
                self.compact()
        else:
            self._merge_all()

    def _merge_all(self) -> None:
        """Merge every segment of this writer's scope into one: its own, and those that earlier
        writers of the scope (killed tries of the same shard) left. The scope's lease keeps any
        other writer of it away meanwhile."""
        prefix = f"{self.scope}."
        paths = [p for p in _json_files(self.fs, self.segments_dir) if posixpath.basename(p).startswith(prefix)]
        if len(paths) < 2:
            return
        records: dict[str, CommitRecord] = {}
        for path in paths:
            records.update(_decode(read_json(self.fs, path)))
        self.fence()
        self._levels = {}
        self._write_segment(0, list(records.values()))
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path)

    def compact(self) -> None:
        """Fold every record (manifest, segments of any writer) into the manifest; delete the
        segments folded. Only for the whole output's writer: its lease excludes every shard's
        writer, so no segment appears meanwhile that the manifest would miss.

        The new manifest is durable before any segment goes: a crash in between leaves records
        twice, never none. A version-1 output keeps its per-range records
        (:meth:`.ledger.OutputLedger.upgrade` moves them).
        """
        if self.version == PER_RANGE_RECORDS:
            return
        records, sources = self._read_records()
        segments = [p for p in sources if p.startswith(self.segments_dir + "/")]
        if not segments:
            return
        self.fence()
        self.write_manifest(records)
        self.fence()
        for path in segments:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path)
        self._levels = {}
        self._segments_seen = False

    def write_manifest(self, records: dict[str, CommitRecord]) -> None:
        """Write ``records`` (range id -> record) as the manifest, replacing the one there."""
        write_json(self.fs, self.manifest_path, _encode(records.values()), compact=True)


def _add_records(records: dict[str, CommitRecord], found: dict[str, CommitRecord]) -> None:
    """Add ``found`` to ``records``; of two records of one range, the later committed wins.

    A range has two records when a write whose outcome was unknown was applied after all, and a
    later try redid the range (its files were missing); or when a merge or fold was cut short
    (then both are the same). The later one names the files that are there.
    """
    for range_id, record in found.items():
        known = records.get(range_id)
        if known is None or (record.committed_at or 0) >= (known.committed_at or 0):
            records[range_id] = record


def _json_files(fs: AbstractFileSystem, folder: str) -> list[str]:
    """The JSON files of ``folder`` (none if it does not exist), without the temporary files of writes."""
    paths = ls(fs, folder)
    return sorted(p for p in paths if p.endswith(".json") and not posixpath.basename(p).startswith("."))


def _encode(records: Iterable[CommitRecord]) -> dict[str, Any]:
    """Records as a segment or manifest holds them: one short row each.

    ``[range id, rows, rejected, engine errors, files, committed at]``; files is null for the
    common case, the range's one output file ``part-<range id>.parquet``, which keeps a manifest of
    a million ranges to some tens of MB. The plan each record was written under is kept beside the
    rows, run-length encoded (``plans``: ``[[plan id, count], ...]`` in row order; nearly always one
    run), and so is the try that committed each (``writers``: ``[[writer or null, count], ...]``, a
    run per writing try), and what a model counted: the tokens (``tokens``: ``[prompt, generated]``
    or null per row, the shape earlier versions read) and the other counts (``counts``: ``{key:
    [count or null per row]}``, a key only where some row has it): rows keep the shape that
    earlier versions of the provider read, and those versions skip keys they do not know.
    """
    rows: list[list[Any]] = []
    plans: list[list[Any]] = []
    writers: list[list[Any]] = []
    tokens: list[list[int | None] | None] = []
    counts: dict[str, list[int | None]] = {key: [] for key in COUNT_KEYS if key not in TOKEN_KEYS}
    for r in records:
        _run_length(writers, None if r.writer is None else r.writer.to_json())
        tokens.append(None if r.tokens == (None, None) else list(r.tokens))
        for key, column in counts.items():
            column.append(getattr(r, key))
        default = r.files == (f"part-{r.range_id}.parquet",)
        rows.append(
            [r.range_id, r.rows, r.rejected, r.engine_errors, None if default else list(r.files), r.committed_at]
        )
        _run_length(plans, r.plan)
    encoded: dict[str, Any] = {"version": PLAN_VERSION, "records": rows}
    if any(plan for plan, _ in plans):
        encoded["plans"] = plans
    if any(writer for writer, _ in writers):
        encoded["writers"] = writers
    if any(tokens):
        encoded["tokens"] = tokens
    counted = {key: column for key, column in counts.items() if any(c is not None for c in column)}
    if counted:
        encoded["counts"] = counted
    return encoded


def _run_length(runs: list[list[Any]], value: Any) -> None:
    """Add ``value`` to ``runs`` (``[[value, count], ...]``)."""
    if runs and runs[-1][0] == value:
        runs[-1][1] += 1
    else:
        runs.append([value, 1])


def _decode(data: dict[str, Any]) -> dict[str, CommitRecord]:
    plans = (plan for plan, count in data.get("plans", ()) for _ in range(count))
    writers = (
        None if writer is None else CommitWriter.from_json(writer)
        for writer, count in data.get("writers", ())
        for _ in range(count)
    )
    rows_count = len(data["records"])
    tokens = data.get("tokens") or [None] * rows_count
    # Counts a later version may add are ignored, as keys of a record are (CommitRecord.from_json).
    counts = {key: column for key, column in data.get("counts", {}).items() if key in COUNT_KEYS}
    records = {}
    for i, ((range_id, rows, rejected, engine_errors, files, committed_at), counted) in enumerate(
        zip(data["records"], tokens, strict=True)
    ):
        tokens_in, tokens_out = counted or (None, None)
        records[range_id] = CommitRecord(
            range_id=range_id,
            files=(f"part-{range_id}.parquet",) if files is None else tuple(files),
            rows=rows,
            rejected=rejected or 0,
            engine_errors=(engine_errors or 0) if rejected else 0,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            **{key: column[i] for key, column in counts.items()},
            plan=next(plans, None),
            committed_at=committed_at,
            writer=next(writers, None),
        )
    return records
