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
                                     (a shard's writer has its own subfolder)
    _raybatch/lease/                 the writer lease of the whole output (see :mod:`.lease`)
    _raybatch/leases/<shard>/        the writer lease of one shard's ranges
    _raybatch/jobs/<submission id>.json  result of a Ray Job: a run's summary, or the planned shards
    _raybatch/partitions.json        how many shards the last mapped run's planning cut the plan
                                     into (for status: each shard's ranges follow from the plan)

A range is committed by (1) writing its files under ``_raybatch/tmp/`` (on the Ray workers that
computed its rows), (2) moving them to their final names (:meth:`OutputLedger.publish`), (3)
writing a commit record that names them all (:meth:`OutputLedger.record`). A crash before (3)
leaves at most files without a record, which are deleted before the range is redone; a reader of
a finished output only ever sees whole ranges, each once, and a range's rejects exactly when its
accepted rows. A range counts as committed (progress, summary) only once (3) is durable.

The commit records themselves (segments, manifest, layout versions) are kept by :mod:`.commit_log`,
the plan's record by :mod:`.plan_record`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import posixpath
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.commit.commit_log import CommitLog
from airflow_provider_raybatch.pipeline.commit.commit_record import REJECTS_DIR, CommitRecord
from airflow_provider_raybatch.pipeline.commit.crash_points import crash_point
from airflow_provider_raybatch.pipeline.commit.output_schema import schema_from_json, schema_to_json
from airflow_provider_raybatch.pipeline.commit.plan_record import PlanRecord
from airflow_provider_raybatch.pipeline.errors import RayBatchError
from airflow_provider_raybatch.pipeline.store.files import (
    create_file,
    ensure_folder,
    fsync,
    ls,
    move,
    read_json,
    resolve,
    write_json,
)
from airflow_provider_raybatch.pipeline.store.retries import retry_transient

log = logging.getLogger(__name__)

META_DIR = "_raybatch"
LEASE_DIR = "lease"
SHARD_LEASES_DIR = "leases"


def shard_key(range_ids: list[str]) -> str:
    """The name of a shard's lease folder, segments' scope and temporary folder."""
    return hashlib.sha256("\n".join(range_ids).encode()).hexdigest()[:16]


class OutputLedger(CommitLog):
    """Reads and writes the bookkeeping of one output folder: its plan, schemas, files and leases'
    folders here, its commit records by :class:`.commit_log.CommitLog`.

    What a writer needs is given when it is made, and not changed from outside afterwards: the
    ledger changes its own plan only by writing one (:meth:`write_plan`).

    :param fs: the output's filesystem.
    :param root: the output folder.
    :param display_path: the output as the user gave it (named in errors).
    :param plan: the recorded plan the writer checked its settings against (:func:`read_plan`): the
        layout it writes and the plan id its records name. None: none recorded (a reader, or a new output).
    :param range_ids: the writer of one shard's ranges (its own temporary folder and segments'
        scope); None: of the whole output.
    :param fence: called before every publish, commit record and removal; raises once the writer lost its
        lease (:meth:`.lease.Lease.check`). None: a reader, or a writer without a lease (tests, benchmarks).
    """

    def __init__(
        self,
        fs: AbstractFileSystem,
        root: str,
        display_path: str,
        *,
        plan: PlanRecord | None = None,
        range_ids: list[str] | None = None,
        fence: Callable[[], None] | None = None,
    ):
        super().__init__(fs, root, display_path, f"{root}/{META_DIR}")
        self.plan_path = plan_path(root)
        # Named before shards were told apart from a table's partitions: outputs written then still resume.
        self.shards_path = f"{self.meta}/partitions.json"
        #: This writer's temporary folder: a shard's writer is given its own (:meth:`tmp_folder`).
        self.tmp_dir = self.tmp_folder(range_ids)
        self.schemas_dir = f"{self.meta}/schemas"
        self.rejects_dir = f"{root}/{REJECTS_DIR}"
        if range_ids is not None:
            self.scope = posixpath.basename(self.lease_folder(range_ids))
        if fence is not None:
            self.fence = fence
        if plan is not None:
            self._adopt(plan)

    @classmethod
    def open(cls, output_path: str, storage_options: dict[str, Any] | None = None) -> OutputLedger:
        """The ledger of the output folder ``output_path`` (local or a URL), for reading it."""
        fs, path = resolve(output_path, storage_options)
        return cls(fs, path, output_path)

    def lease_folder(self, range_ids: list[str] | None = None) -> str:
        """Where the lease of the whole output (None) or of one shard's ranges lives."""
        if range_ids is None:
            return f"{self.meta}/{LEASE_DIR}"
        return f"{self.meta}/{SHARD_LEASES_DIR}/{shard_key(range_ids)}"

    def shard_lease_folders(self) -> list[str]:
        return ls(self.fs, f"{self.meta}/{SHARD_LEASES_DIR}")

    def data_file(self, range_id: str) -> str:
        return f"{self.root}/part-{range_id}.parquet"

    def rejects_file(self, range_id: str) -> str:
        return f"{self.rejects_dir}/part-{range_id}.parquet"

    def tmp_folder(self, range_ids: list[str] | None = None) -> str:
        """Where the writer of the whole output (None) or of one shard's ranges writes its files."""
        if range_ids is None:
            return f"{self.meta}/tmp"
        return f"{self.meta}/tmp/{posixpath.basename(self.lease_folder(range_ids))}"

    def tmp_file(self, label: str) -> str:
        """A new file name in this writer's temporary folder (which is created)."""
        self.fs.makedirs(self.tmp_dir, exist_ok=True)
        return tmp_name(self.tmp_dir, label)

    def load_plan(self) -> PlanRecord | None:
        """The recorded plan, read now (:func:`read_plan`); the ledger's own stays the one it was given."""
        return read_plan(self.fs, self.root, self.display_path)

    def write_shards(self, count: int) -> None:
        """Record that a mapped run's planning cut the plan into ``count`` shards."""
        self.fence()
        write_json(self.fs, self.shards_path, {"plan_id": self.plan_id, "count": count})

    def load_shards(self, plan: PlanRecord) -> int | None:
        """The shard count recorded for ``plan``; None without one (or for another plan)."""
        try:
            data = read_json(self.fs, self.shards_path)
        except FileNotFoundError:
            return None
        return int(data["count"]) if data.get("plan_id") == plan.plan_id() else None

    def write_plan(self, plan: PlanRecord) -> None:
        """Record ``plan``: from now on this writer writes its layout and names its id."""
        write_json(self.fs, self.plan_path, plan.to_json(), compact=True)
        self._adopt(plan)

    def _adopt(self, plan: PlanRecord) -> None:
        self.version = plan.version
        self.plan_id = plan.plan_id()

    def upgrade(self, plan: PlanRecord) -> None:
        """Move a version-1 output to this layout: its records into the manifest, then ``plan`` (the
        same input, described compactly) as the plan, then the per-range records away.

        Every step leaves an output that reads the same: the records are in the manifest before
        the plan says version 2, and a provider that reads only version 1 refuses the output from
        the moment its per-range records could go.
        """
        records = self.committed()
        self.fence()
        self.write_manifest(records)
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

        Created if absent: of shards racing to record it (each holds only its own lease), one
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

    def publish(
        self,
        range_id: str,
        tmp_paths: list[str],
        rows: int,
        rejects_tmp_paths: list[str] = (),
        rejected: int = 0,
        engine_errors: int = 0,
        counts: Mapping[str, int | None] | None = None,
    ) -> CommitRecord:
        """Move a range's files (output, rejects) to their final names, durably; return the record
        that will commit them (:meth:`record`). Until it is recorded, the range is published without
        a record: the next run removes its files and redoes it.

        ``rows`` counts the rows of the output files; ``rejected`` those of the rejects files, of
        which ``engine_errors`` failed in a model; ``counts`` the sums of the counted columns over
        all of them, by key (:data:`~airflow_provider_raybatch.pipeline.columns.COUNT_KEYS`; None
        or absent: not counted).
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
                    move(self.fs, tmp, target)
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
        return CommitRecord(
            range_id,
            tuple(files),
            rows,
            rejected=rejected,
            engine_errors=engine_errors if rejected else 0,
            **dict(counts or {}),
            plan=self.plan_id,
        )

    def reconcile(
        self, committed: dict[str, CommitRecord], range_ids: list[str] | None = None
    ) -> tuple[dict[str, CommitRecord], list[str]]:
        """Make the output's files agree with its records, before a writer starts.

        A record whose files are not all there does not count: its range is redone (a write
        whose outcome was unknown can leave such a record, applied after the try that wrote
        it had given up on it). Nor does a record written under another plan than this writer's
        (:meth:`.plan_record.PlanRecord.plan_id`: a writer that raced an overwrite). Then the data and rejects files of ranges without a record
        are deleted, and this writer's temporary folder with them.

        With ``range_ids`` (one shard of a mapped run), only files of those ranges: other
        shards' tasks may be writing theirs at the same time.

        :returns: the records that stand, and the paths deleted.
        """
        present = {
            posixpath.relpath(path, self.root)
            for folder in (self.root, self.rejects_dir)
            for path in ls(self.fs, folder)
            if posixpath.basename(path.rstrip("/")).startswith("part-")
        }
        standing = {}
        for range_id, record in committed.items():
            if record.plan is not None and record.plan != self.plan_id:
                log.warning(
                    "Range %s of %s was committed under another plan (%s, not %s): redone",
                    range_id,
                    self.display_path,
                    record.plan,
                    self.plan_id,
                )
            elif all(name in present for name in record.files):
                standing[range_id] = record
            else:
                missing = [name for name in record.files if name not in present]
                log.warning(
                    "Range %s of %s is recorded but its file(s) %s are not there: redone",
                    range_id,
                    self.display_path,
                    missing,
                )
        keep = {name for record in standing.values() for name in record.files}
        stale = [f"{self.root}/{name}" for name in sorted(present - keep)]
        if range_ids is not None:
            # part-<id>.parquet and part-<id>.<n>.parquet both start with "part-<id>.".
            prefixes = tuple(f"part-{range_id}." for range_id in range_ids)
            stale = [p for p in stale if posixpath.basename(p).startswith(prefixes)]
        if ls(self.fs, self.tmp_dir):  # this writer's own: a shard's writer leaves the others' alone
            stale.append(self.tmp_dir)
        if stale:
            self.fence()
        for path in stale:
            retry_transient(lambda path=path: _remove(self.fs, path), f"removing {path}")
        return standing, stale

    def clear_tmp(self) -> None:
        """Remove this writer's temporary folder (the write steps' receipts) once its ranges are all recorded.

        Best effort: the next writer of the scope removes what is left. Fenced: a writer whose lease
        was taken over shares the folder with the new holder, whose files are in it now.
        """
        try:
            if ls(self.fs, self.tmp_dir):
                self.fence()
                retry_transient(lambda: _remove(self.fs, self.tmp_dir), f"removing {self.tmp_dir}")
        except Exception as e:  # noqa: BLE001
            log.warning("Could not remove the temporary files in %s: %s", self.tmp_dir, e)

    def reset(self) -> None:
        """Remove what this protocol wrote (``mode="overwrite"``): part files, ``_rejects/`` and
        ``_raybatch/`` except its leases. Anything else in the folder is someone else's and stays.

        Listings and deletes are retried on transient store errors, as every write is; a delete
        applied whose reply was lost finds the path gone when retried, which counts as done.
        """
        entries = {posixpath.basename(p.rstrip("/")): p for p in ls(self.fs, self.root)}
        if not entries:
            return
        self.fence()
        doomed = [p for name, p in entries.items() if _is_part_file(name)]
        if REJECTS_DIR in entries:
            doomed.append(self.rejects_dir)
        if META_DIR in entries:
            leases = (LEASE_DIR, SHARD_LEASES_DIR)
            doomed += [p for p in ls(self.fs, self.meta) if posixpath.basename(p.rstrip("/")) not in leases]
        for path in doomed:
            retry_transient(lambda path=path: _remove(self.fs, path), f"removing {path}")


def plan_path(root: str) -> str:
    """Where the plan of the output folder ``root`` is recorded."""
    return f"{root}/{META_DIR}/plan.json"


def read_plan(fs: AbstractFileSystem, root: str, display_path: str) -> PlanRecord | None:
    """The plan recorded in the output folder ``root``, None without one; an output written by a
    newer, incompatible layout is refused (:class:`.errors.ConfigError` naming ``display_path``)."""
    try:
        data = read_json(fs, plan_path(root))
    except FileNotFoundError:
        return None
    return PlanRecord.from_json(data, display_path)


def _remove(fs: AbstractFileSystem, path: str) -> None:
    """Delete ``path`` (recursively); already gone counts as done (a delete retried after its reply was lost)."""
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path, recursive=True)


def tmp_name(folder: str, label: str) -> str:
    """A new, unique file name in ``folder`` (a temporary folder of the ledger)."""
    return f"{folder}/part-{label}.{uuid.uuid4().hex}.parquet"


def _is_part_file(name: str) -> bool:
    return name.startswith("part-") and name.endswith(".parquet")
