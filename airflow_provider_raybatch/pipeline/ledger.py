"""The output's commit protocol.

Layout of an output folder (layout version 2)::

    part-<range id>.parquet          the file of a committed range (readers see only these);
    part-<range id>.<n>.parquet      or its files, one per block, when it arrived in several blocks
    _rejects/part-<range id>...      the range's rejected rows (row key, reason, kind), if any
    _raybatch/plan.json              input fingerprint (files and row groups: the ranges follow from
                                     them), job signature, run key, layout version
    _raybatch/segments/<scope>.<writer>.<level>.<seq>.json
                                     commit records, a batch per object, written by one writer
    _raybatch/manifest.json          the commit records folded together at the end of a run
    _raybatch/schemas/output.json    the output's schema, recorded by the first range committed
    _raybatch/schemas/rejects.json   the rejects' schema, recorded by the first range with rejects
    _raybatch/tmp/                   files being written, published by a rename when complete
                                     (a partition's writer has its own subfolder)
    _raybatch/lease/                 the writer lease of the whole output (see :mod:`.lease`)
    _raybatch/leases/<partition>/    the writer lease of one partition's ranges
    _raybatch/jobs/<submission id>.json  result of a Ray Job: a run's summary, or the planned partitions

Layout version 1 (outputs of earlier versions) listed every range in ``plan.json`` and kept one
record per range, ``_raybatch/commits/<range id>.json``. Such an output is still read and
resumed: records are read from all three places, and a version-1 output keeps getting per-range
records (a writer writes the layout of the output's plan) until a whole-output run upgrades it
(:meth:`OutputLedger.upgrade`), after which an older provider refuses it with a clear message.

A range is committed by (1) writing its files under ``_raybatch/tmp/`` (on the Ray workers that
computed its rows), (2) moving them to their final names (:meth:`OutputLedger.publish`), (3)
writing a commit record that names them all (:meth:`OutputLedger.record`). A crash before (3)
leaves at most files without a record, which are deleted before the range is redone; a reader of
a finished output only ever sees whole ranges, each once, and a range's rejects exactly when its
accepted rows. A range counts as committed (progress, summary) only once (3) is durable.

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
whole output or a partition's lease key; a fresh id per writer): partitions writing side by
side never write the same object, and only a whole-output writer, which excludes every partition
writer by the leases, rewrites the manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import posixpath
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.errors import ConfigError, RayBatchError
from airflow_provider_raybatch.pipeline.faults import crash_point
from airflow_provider_raybatch.pipeline.planner import recorded_ranges
from airflow_provider_raybatch.pipeline.schemas import schema_from_json, schema_to_json
from airflow_provider_raybatch.pipeline.storage import (
    create_file,
    ensure_folder,
    fsync,
    read_json,
    resolve,
    write_json,
)

log = logging.getLogger(__name__)

META_DIR = "_raybatch"
REJECTS_DIR = "_rejects"
LEASE_DIR = "lease"
PARTITION_LEASES_DIR = "leases"
#: The layout version this code writes, and the newest it reads (see the module's docstring).
PLAN_VERSION = 2
#: The layout of outputs with a record per range (``commits/<range id>.json``) and the ranges listed in the plan.
PER_RANGE_RECORDS = 1
#: Segments of one level a writer merges into one of the next level.
SEGMENT_FANOUT = 16
#: The scope of the whole-output writer's segments (a partition's is its lease key).
OUTPUT_SCOPE = "output"


@dataclass(frozen=True)
class PlanRecord:
    """``_raybatch/plan.json``: what an output was planned on, checked by every later run.

    :param input_path: the input as the user gave it.
    :param input: the planned files and ranges (:meth:`Plan.describe`).
    :param job: the job signature (:meth:`BatchInferenceConfig.job_signature`).
    :param run_key: the run that planned it (``mode="overwrite"`` applies once per run key).
    :param version: the layout version of the output.
    """

    input_path: str
    input: dict[str, Any]
    job: dict[str, Any]
    run_key: str | None
    version: int = PLAN_VERSION

    def range_ids(self) -> list[str]:
        """The planned ranges' ids, in plan order (listed by layout 1, cut again from the files by layout 2)."""
        ranges = recorded_ranges(self.input, self.job["rows_per_range"], self.job.get("max_rows"))
        return [r.id for r in ranges]


class OutputLedger:
    """Reads and writes the bookkeeping of one output folder."""

    def __init__(self, fs: AbstractFileSystem, root: str, display_path: str):
        self.fs = fs
        self.root = root
        self.display_path = display_path
        self.meta = f"{root}/{META_DIR}"
        self.plan_path = f"{self.meta}/plan.json"
        self.commits_dir = f"{self.meta}/commits"  # layout version 1
        self.segments_dir = f"{self.meta}/segments"
        self.manifest_path = f"{self.meta}/manifest.json"
        #: The layout this ledger writes: the recorded plan's (:meth:`load_plan`), else the newest.
        self.version = PLAN_VERSION
        #: Whose segments this writer writes (:meth:`set_scope`), and this writer's own id in their names.
        self.scope = OUTPUT_SCOPE
        self.writer_id = uuid.uuid4().hex[:12]
        self._seq = 0
        self._levels: dict[int, list[str]] = {}  # this writer's segments by level, oldest first
        #: What the latest :meth:`committed` read: objects per kind ("manifest", "segments", "records").
        self.last_read: dict[str, int] = {}
        self._segments_seen = False  # segments found by a read: there is something to fold
        #: This writer's temporary folder: a partition's writer is given its own (:meth:`tmp_folder`).
        self.tmp_dir = self.tmp_folder()
        self.schemas_dir = f"{self.meta}/schemas"
        #: Called before every publish, commit record and removal: raises once this writer lost its lease.
        self.fence: Callable[[], None] = lambda: None
        self.rejects_dir = f"{root}/{REJECTS_DIR}"

    @classmethod
    def open(cls, output_path: str, storage_options: dict[str, Any] | None = None) -> OutputLedger:
        """The ledger of the output folder ``output_path`` (local or a URL)."""
        fs, path = resolve(output_path, storage_options)
        return cls(fs, path, output_path)

    def lease_folder(self, range_ids: list[str] | None = None) -> str:
        """Where the lease of the whole output (None) or of one partition's ranges lives."""
        if range_ids is None:
            return f"{self.meta}/{LEASE_DIR}"
        key = hashlib.sha256("\n".join(range_ids).encode()).hexdigest()[:16]
        return f"{self.meta}/{PARTITION_LEASES_DIR}/{key}"

    def partition_lease_folders(self) -> list[str]:
        folder = f"{self.meta}/{PARTITION_LEASES_DIR}"
        return self.fs.ls(folder, detail=False) if self.fs.isdir(folder) else []

    def data_file(self, range_id: str) -> str:
        return f"{self.root}/part-{range_id}.parquet"

    def rejects_file(self, range_id: str) -> str:
        return f"{self.rejects_dir}/part-{range_id}.parquet"

    def tmp_folder(self, range_ids: list[str] | None = None) -> str:
        """Where the writer of the whole output (None) or of one partition's ranges writes its files."""
        if range_ids is None:
            return f"{self.meta}/tmp"
        return f"{self.meta}/tmp/{posixpath.basename(self.lease_folder(range_ids))}"

    def set_scope(self, range_ids: list[str] | None) -> None:
        """Make this the writer of the whole output (None) or of one partition's ranges: its
        temporary folder and the scope in its segments' names."""
        self.tmp_dir = self.tmp_folder(range_ids)
        self.scope = OUTPUT_SCOPE if range_ids is None else posixpath.basename(self.lease_folder(range_ids))

    def tmp_file(self, label: str) -> str:
        """A new file name in this writer's temporary folder (which is created)."""
        self.fs.makedirs(self.tmp_dir, exist_ok=True)
        return tmp_name(self.tmp_dir, label)

    def load_plan(self) -> PlanRecord | None:
        """The recorded plan; an output written by a newer, incompatible layout is refused."""
        if not self.fs.exists(self.plan_path):
            return None
        data = read_json(self.fs, self.plan_path)
        version = data.get("version")
        if not isinstance(version, int) or version > PLAN_VERSION:
            raise ConfigError(
                f"output {self.display_path!r} was written by a newer version of airflow-provider-raybatch "
                f"(layout version {version!r}; this version reads up to {PLAN_VERSION}): upgrade the provider "
                "where the pipeline runs, or write to another output path"
            )
        self.version = version
        return PlanRecord(**data)

    def write_plan(self, plan: PlanRecord) -> None:
        write_json(self.fs, self.plan_path, asdict(plan), compact=True)
        self.version = plan.version

    def upgrade(self, plan: PlanRecord) -> None:
        """Move a version-1 output to this layout: its records into the manifest, then ``plan`` (the
        same input, described compactly) as the plan, then the per-range records away.

        Every step leaves an output that reads the same: the records are in the manifest before
        the plan says version 2, and a provider that reads only version 1 refuses the output from
        the moment its per-range records could go.
        """
        records = self.committed()
        self.fence()
        write_json(self.fs, self.manifest_path, _encode(records.values()), compact=True)
        self.fence()
        self.write_plan(plan)
        if self.fs.isdir(self.commits_dir):
            self.fence()
            self.fs.rm(self.commits_dir, recursive=True)

    def recorded_schema(self, kind: str) -> pa.Schema | None:
        """The schema recorded for ``kind`` ("output" or "rejects"), None before the first commit of one."""
        path = f"{self.schemas_dir}/{kind}.json"
        try:
            return schema_from_json(read_json(self.fs, path))
        except FileNotFoundError:
            return None

    def record_schema(self, kind: str, schema: pa.Schema) -> pa.Schema:
        """Record ``schema`` for ``kind`` unless one is recorded already; return the one recorded.

        Created if absent: of partitions racing to record it (each holds only its own lease), one
        wins and the others are checked against the winner's.
        """
        self.fence()
        path = f"{self.schemas_dir}/{kind}.json"
        data = json.dumps(schema_to_json(schema), indent=1, sort_keys=True).encode()
        if create_file(self.fs, path, data):
            return schema.remove_metadata()
        self.fs.invalidate_cache(self.schemas_dir)
        return schema_from_json(read_json(self.fs, path))

    def forget_schemas(self) -> None:
        """Remove the recorded schemas (an output with no committed range: its next range records them)."""
        if self.fs.isdir(self.schemas_dir):
            self.fence()
            self.fs.rm(self.schemas_dir, recursive=True)

    def job_summary_path(self, submission_id: str) -> str:
        return f"{self.meta}/jobs/{submission_id}.json"

    def foreign_entries(self) -> list[str]:
        """Entries of the output folder that this protocol did not write."""
        if not self.fs.isdir(self.root):
            return []
        names = [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.root, detail=False)]
        return sorted(n for n in names if n not in (META_DIR, REJECTS_DIR) and not _is_part_file(n))

    def committed(self) -> dict[str, dict[str, Any]]:
        """Range id -> commit record, for every committed range (from the manifest, the segments
        and the per-range records of layout version 1).

        Reads O(segments) objects. A segment merged away by its writer between the listing and
        the read is found again in the segment it was merged into: the listing is repeated.
        """
        for _ in range(4):
            try:
                return self._read_records()[0]
            except FileNotFoundError:
                self.fs.invalidate_cache(self.meta)
        return self._read_records()[0]

    def _read_records(self) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """Every commit record, and the segments and per-range record files they were read from."""
        # Listed before the manifest is read: a fold writes the manifest before it deletes what it
        # folded, so a record is in the manifest read or in a listed object (or its read fails,
        # and committed() reads again). Read the other way round, a fold in between could hide it.
        listed = {
            kind: _json_files(self.fs, folder)
            for kind, folder in (("records", self.commits_dir), ("segments", self.segments_dir))
        }
        records: dict[str, dict[str, Any]] = {}
        read = {"manifest": 0, "segments": 0, "records": 0}
        if self.fs.exists(self.manifest_path):
            records.update(_decode(read_json(self.fs, self.manifest_path)))
            read["manifest"] = 1
        for kind, paths in listed.items():
            with ThreadPoolExecutor(max_workers=16) as pool:
                for data in pool.map(lambda p: read_json(self.fs, p), paths):
                    records.update(_decode(data) if kind == "segments" else {data["range_id"]: data})
            read[kind] = len(paths)
        self.last_read = read
        self._segments_seen = self._segments_seen or bool(read["segments"])
        return records, listed["records"] + listed["segments"]

    def commit(
        self,
        range_id: str,
        tmp_paths: list[str],
        rows: int,
        rejects_tmp_paths: list[str] = (),
        rejected: int = 0,
        engine_errors: int = 0,
    ) -> None:
        """Publish a range's files and record it at once (:meth:`publish` then :meth:`record`)."""
        self.record([self.publish(range_id, tmp_paths, rows, rejects_tmp_paths, rejected, engine_errors)])

    def publish(
        self,
        range_id: str,
        tmp_paths: list[str],
        rows: int,
        rejects_tmp_paths: list[str] = (),
        rejected: int = 0,
        engine_errors: int = 0,
    ) -> dict[str, Any]:
        """Move a range's files (output, rejects) to their final names, durably; return the record
        that will commit them (:meth:`record`). Until it is recorded, the range is published without
        a record: the next run removes its files and redoes it.

        ``rows`` counts the rows of the output files; ``rejected`` those of the rejects files, of
        which ``engine_errors`` failed in a model.
        """
        self.fence()
        files = []
        for tmps, final in ((tmp_paths, self.data_file(range_id)), (rejects_tmp_paths, self.rejects_file(range_id))):
            if not tmps:
                continue
            folder = posixpath.dirname(final)
            ensure_folder(self.fs, folder)
            stem = final.removesuffix(".parquet")
            for n, tmp in enumerate(tmps):
                target = final if len(tmps) == 1 else f"{stem}.{n}.parquet"
                try:
                    fsync(self.fs, tmp)  # the content is on disk before it gets its final name
                    self.fs.mv(tmp, target)
                except FileNotFoundError as e:
                    raise RayBatchError(
                        f"range {range_id}: file {tmp} written by a Ray worker is not visible to the driver. "
                        "On a cluster of several hosts the output must be on storage every host shares "
                        "(s3://... or a shared mount), not on a host's local disk"
                    ) from e
                files.append(posixpath.relpath(target, self.root))
            fsync(self.fs, folder)  # and so are the names, before the record that names them
        if files:
            crash_point("published")
        record: dict[str, Any] = {"range_id": range_id, "files": files, "rows": rows}
        if rejected:  # only when there are rejects: records of outputs without any stay as they were
            record.update(rejected=rejected, engine_errors=engine_errors)
        return record

    def record(self, records: list[dict[str, Any]]) -> None:
        """Write the records of published ranges durably: then, and only then, are they committed.

        Layout 2: one new segment holding them all (then this writer's segments are merged where a
        level is full); layout 1: one file per range. If they cannot be written, their files are
        unpublished again (best effort) and the error names the ranges.
        """
        if not records:
            return
        self.fence()
        try:
            if self.version == PER_RANGE_RECORDS:
                for record in records:
                    write_json(self.fs, f"{self.commits_dir}/{record['range_id']}.json", record)
            else:
                now = round(time.time(), 3)
                self._write_segment(0, [{**r, "committed_at": now} for r in records])
        except OSError as e:
            for name in (name for record in records for name in record["files"]):
                with contextlib.suppress(OSError):  # unpublished again, so that readers never see them
                    self.fs.rm(f"{self.root}/{name}")
            ids = [r["range_id"] for r in records]
            what = (
                f"range {ids[0]}" if len(ids) == 1 else f"ranges {', '.join(ids[:3])}{' ...' if len(ids) > 3 else ''}"
            )
            raise RayBatchError(
                f"cannot commit {what} of output {self.display_path!r}: {type(e).__name__}: {e}. "
                "The ranges committed before are kept; these are redone on a retry"
            ) from e
        self._merge(SEGMENT_FANOUT)

    def _write_segment(self, level: int, records: list[dict[str, Any]]) -> None:
        self._seq += 1
        path = f"{self.segments_dir}/{self.scope}.{self.writer_id}.{level}.{self._seq:08d}.json"
        write_json(self.fs, path, _encode(records), compact=True)
        self._levels.setdefault(level, []).append(path)

    def _merge(self, fanout: int) -> None:
        """Merge this writer's segments: each level holding ``fanout`` of them into one of the next.

        The records are durable already: a merge that fails is logged and left for :meth:`compact`.
        """
        level = 0
        try:
            while level in self._levels:
                paths = self._levels[level]
                if len(paths) >= fanout:
                    records: dict[str, dict[str, Any]] = {}
                    for path in paths:
                        records.update(_decode(read_json(self.fs, path)))
                    self.fence()
                    self._write_segment(level + 1, list(records.values()))
                    del self._levels[level]
                    for path in paths:
                        with contextlib.suppress(FileNotFoundError):
                            self.fs.rm(path)
                level += 1
        except OSError as e:
            log.warning("Could not merge the commit records of %s (kept as they are): %s", self.display_path, e)

    def finish(self) -> None:
        """At the end of a writer's run: the whole output's writer folds every record into the
        manifest (:meth:`compact`); a partition's writer merges its scope's segments into one."""
        if self.scope == OUTPUT_SCOPE:
            if self._levels or self._segments_seen:
                self.compact()
        else:
            self._merge_all()

    def _merge_all(self) -> None:
        """Merge every segment of this writer's scope into one: its own, and those that earlier
        writers of the scope (killed tries of the same partition) left. The scope's lease keeps any
        other writer of it away meanwhile."""
        prefix = f"{self.scope}."
        paths = [p for p in _json_files(self.fs, self.segments_dir) if posixpath.basename(p).startswith(prefix)]
        if len(paths) < 2:
            return
        records: dict[str, dict[str, Any]] = {}
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
        segments folded. Only for the whole output's writer: its lease excludes every partition's
        writer, so no segment appears meanwhile that the manifest would miss.

        The new manifest is durable before any segment goes: a crash in between leaves records
        twice, never none. A version-1 output keeps its per-range records (:meth:`upgrade` moves them).
        """
        if self.version == PER_RANGE_RECORDS:
            return
        records, sources = self._read_records()
        segments = [p for p in sources if p.startswith(self.segments_dir + "/")]
        if not segments:
            return
        self.fence()
        write_json(self.fs, self.manifest_path, _encode(records.values()), compact=True)
        self.fence()
        for path in segments:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path)
        self._levels = {}
        self._segments_seen = False

    def remove_uncommitted(self, committed: dict[str, dict[str, Any]], range_ids: list[str] | None = None) -> list[str]:
        """Delete data and rejects files of ranges without a commit record, and abandoned temporary files.

        With ``range_ids`` (one partition of a mapped run), only files of those ranges: other
        partitions' tasks may be writing theirs at the same time.
        """
        keep = {name for record in committed.values() for name in record["files"]}
        stale = []
        for folder in (self.root, self.rejects_dir):
            if self.fs.isdir(folder):
                for path in self.fs.ls(folder, detail=False):
                    name = posixpath.basename(path.rstrip("/"))
                    if name.startswith("part-") and posixpath.relpath(path, self.root) not in keep:
                        stale.append(path)
        if range_ids is not None:
            # part-<id>.parquet and part-<id>.<n>.parquet both start with "part-<id>.".
            prefixes = tuple(f"part-{range_id}." for range_id in range_ids)
            stale = [p for p in stale if posixpath.basename(p).startswith(prefixes)]
        if self.fs.isdir(self.tmp_dir):  # this writer's own: a partition's writer leaves the others' alone
            stale.append(self.tmp_dir)
        if stale:
            self.fence()
        for path in stale:
            self.fs.rm(path, recursive=True)
        return stale

    def reset(self) -> None:
        """Remove what this protocol wrote (``mode="overwrite"``): part files, ``_rejects/`` and
        ``_raybatch/`` except its leases. Anything else in the folder is someone else's and stays."""
        if not self.fs.isdir(self.root):
            return
        self.fence()
        doomed = [p for p in self.fs.ls(self.root, detail=False) if _is_part_file(posixpath.basename(p.rstrip("/")))]
        if self.fs.isdir(self.rejects_dir):
            doomed.append(self.rejects_dir)
        if self.fs.isdir(self.meta):
            leases = (LEASE_DIR, PARTITION_LEASES_DIR)
            doomed += [
                p for p in self.fs.ls(self.meta, detail=False) if posixpath.basename(p.rstrip("/")) not in leases
            ]
        for path in doomed:
            self.fs.rm(path, recursive=True)


def tmp_name(folder: str, label: str) -> str:
    """A new, unique file name in ``folder`` (a temporary folder of the ledger)."""
    return f"{folder}/part-{label}.{uuid.uuid4().hex}.parquet"


def _json_files(fs: AbstractFileSystem, folder: str) -> list[str]:
    """The JSON files of ``folder`` (none if it does not exist), without the temporary files of writes."""
    try:
        paths = fs.ls(folder, detail=False)
    except FileNotFoundError:
        return []
    return sorted(p for p in paths if p.endswith(".json") and not posixpath.basename(p).startswith("."))


def _encode(records: Any) -> dict[str, Any]:
    """Records as a segment or manifest holds them: one short row each.

    ``[range id, rows, rejected, engine errors, files, committed at]``; files is null for the
    common case, the range's one output file ``part-<range id>.parquet``, which keeps a manifest of
    a million ranges to some tens of MB.
    """
    rows = []
    for r in records:
        files = r["files"]
        default = files == [f"part-{r['range_id']}.parquet"]
        rows.append(
            [
                r["range_id"],
                r["rows"],
                r.get("rejected", 0),
                r.get("engine_errors", 0),
                None if default else files,
                r.get("committed_at"),
            ]
        )
    return {"version": PLAN_VERSION, "records": rows}


def _decode(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    records = {}
    for range_id, rows, rejected, engine_errors, files, committed_at in data["records"]:
        record: dict[str, Any] = {
            "range_id": range_id,
            "files": [f"part-{range_id}.parquet"] if files is None else files,
            "rows": rows,
        }
        if rejected:
            record.update(rejected=rejected, engine_errors=engine_errors)
        if committed_at is not None:
            record["committed_at"] = committed_at
        records[range_id] = record
    return records


def _is_part_file(name: str) -> bool:
    return name.startswith("part-") and name.endswith(".parquet")
