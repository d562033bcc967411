"""Plan the input into deterministic, checkpointable row ranges.

A range is a contiguous run of rows of one file, cut at row-group boundaries where it can be
(row groups larger than ``rows_per_range`` are cut by row offset). Its id depends only on the
file's path relative to the input root and the row bounds, so the plan is the same whatever the
listing order, the number of workers or the machine that plans it.

Footers are read by threads of this process, or, when this process is a Ray driver (a Ray Job
on a cluster) and the input has many files, by Ray tasks spread over the cluster
(:func:`read_footers`): both give the same plan.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import posixpath
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.errors import ConfigError, InputError
from airflow_provider_raybatch.pipeline.storage import GLOB_CHARS, is_hidden, static_prefix

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputFile:
    path: str  # as the filesystem spells it
    relpath: str  # relative to the input root: what ids and change detection use
    size: int
    rows: int
    row_groups: tuple[int, ...]  # rows per row group
    signature: str  # sha256 of size and Parquet footer: changes when the file is rewritten
    # What the store says of the object (None where it says nothing): a rewrite that keeps size and
    # footer still gets a new modification time and, on object stores, a new ETag or version.
    mtime: str | None = None
    etag: str | None = None
    version: str | None = None
    null_ids: int | None = None  # nulls in the id column by the footer's statistics (None: unknown)

    def describe(self) -> dict[str, Any]:
        described = {
            "relpath": self.relpath,
            "size": self.size,
            "rows": self.rows,
            "row_groups": list(self.row_groups),
            "signature": self.signature,
        }
        described.update({k: getattr(self, k) for k in FINGERPRINT_FIELDS if getattr(self, k) is not None})
        return described


#: Fields of a file's fingerprint besides its signature, compared on resume where both plans have them
#: (a plan recorded before they existed has none).
FINGERPRINT_FIELDS = ("mtime", "etag", "version")
#: Keys of ``fs.info()`` naming the modification time, the ETag and the object version, by store
#: (local, s3fs, gcsfs, adlfs); the first present wins.
_MTIME_KEYS = ("mtime", "LastModified", "updated", "last_modified")
_ETAG_KEYS = ("ETag", "etag")
_VERSION_KEYS = ("VersionId", "generation", "version_id")


@dataclass(frozen=True)
class RowRange:
    id: str
    file_index: int
    start: int
    end: int

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass
class Plan:
    files: list[InputFile]
    ranges: list[RowRange]
    schema: pa.Schema  # of the columns read

    @property
    def total_rows(self) -> int:
        """Rows in the planned ranges (all input rows, unless limited or restricted to a partition)."""
        return sum(r.rows for r in self.ranges)

    @property
    def input_rows(self) -> int:
        """Rows in the input files, whatever the ranges cover."""
        return sum(f.rows for f in self.files)

    def describe(self) -> dict[str, Any]:
        """What ``plan.json`` records of the input: its files with their row groups. The ranges are
        not listed (a million ranges would make a plan of some 100 MB): they follow from the files,
        ``rows_per_range`` and ``max_rows`` (:func:`recorded_ranges`)."""
        return {"files": [f.describe() for f in self.files]}


def list_input_files(fs: AbstractFileSystem, fs_path: str, display_path: str) -> tuple[str, list[str]]:
    """Return the input root and the sorted Parquet files under a file, folder or glob."""
    if any(c in fs_path for c in GLOB_CHARS):
        root = static_prefix(fs_path)
        paths = [p for p in fs.glob(fs_path) if fs.isfile(p)]
        if not paths:
            raise InputError(f"input path {display_path!r} matches no file")
    elif fs.isfile(fs_path):
        return posixpath.dirname(fs_path), [fs_path]
    elif fs.isdir(fs_path):
        root = fs_path
        paths = fs.find(fs_path)
    else:
        raise InputError(f"input path {display_path!r} does not exist")
    paths = sorted(p for p in paths if not is_hidden(posixpath.relpath(p, root)))
    if not paths:
        raise InputError(f"input path {display_path!r} holds no data file (files starting with '_' or '.' are skipped)")
    return root, paths


def read_file_info(
    fs: AbstractFileSystem, path: str, root: str, id_column: str | None = None
) -> tuple[InputFile, pa.Schema]:
    try:
        with fs.open(path, "rb") as f:
            size = f.size
            # Remote files carry the listing's details (s3fs: ETag, LastModified); local ones are stat'ed.
            details = getattr(f, "details", None) or fs.info(path)
            metadata = pq.ParquetFile(f).metadata
            schema = metadata.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"cannot read Parquet file {path!r}: {e}") from e
    footer = pa.BufferOutputStream()
    metadata.write_metadata_file(footer)
    digest = hashlib.sha256(str(size).encode() + footer.getvalue().to_pybytes()).hexdigest()
    row_groups = tuple(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
    info = InputFile(
        path,
        posixpath.relpath(path, root),
        size,
        metadata.num_rows,
        row_groups,
        digest,
        mtime=_detail(details, _MTIME_KEYS),
        etag=_detail(details, _ETAG_KEYS),
        version=_detail(details, _VERSION_KEYS),
        null_ids=_null_count(metadata, id_column),
    )
    return info, schema


def _detail(details: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = details.get(key)
        if value is not None and value != "":
            return value.isoformat() if hasattr(value, "isoformat") else str(value)
    return None


def _null_count(metadata: pq.FileMetaData, column: str | None) -> int | None:
    """Nulls in a top-level column by the footer's statistics; None when a row group has none."""
    if column is None or metadata.num_rows == 0:
        return 0 if column is not None else None
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    if column not in names:
        return None
    index, nulls = names.index(column), 0
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_null_count:
            return None
        nulls += stats.null_count
    return nulls


#: Reads the footers of ``paths`` (under the input root ``root``): ``(fs, root, paths, id_column)`` ->
#: each file's :class:`InputFile` and Arrow schema, in the order of ``paths``; raises
#: :class:`InputError` naming the first file (in that order) that cannot be read.
FooterReader = Callable[[AbstractFileSystem, str, list[str], str | None], list[tuple[InputFile, pa.Schema]]]

#: Threads reading footers in one process: footer reads wait on storage (one or two requests per
#: file on an object store) more than they compute.
FOOTER_THREADS = 16
#: Environment variable: the fewest input files whose footers a Ray driver reads with Ray tasks.
RAY_FOOTERS_MIN_FILES_ENV = "RAYBATCH_RAY_FOOTERS_MIN_FILES"
#: Below this many files, the driver's threads read the footers before Ray tasks would have
#: started: a job's first tasks start fresh worker processes (1-3 s measured on 2 cores), while
#: threads read a local footer in 0.3-0.5 ms (benchmarks/planning_cost.py) and one on an object
#: store in a request or two. Above it, the reads spread over the cluster's nodes and networks.
DEFAULT_RAY_FOOTERS_MIN_FILES = 1000
#: Files per Ray task, at least and at most: a task is worth its scheduling only with some hundred
#: footers, and a task of a few thousand is short enough to redo if its node is lost.
MIN_FILES_PER_TASK, MAX_FILES_PER_TASK = 100, 2000


def read_footers(
    fs: AbstractFileSystem, root: str, paths: list[str], id_column: str | None
) -> list[tuple[InputFile, pa.Schema]]:
    """The default :data:`FooterReader`: Ray tasks on a Ray driver with many files, else threads here.

    Ray is used only when this process is already connected to it (the driver of a Ray Job): it
    is never started for planning, so an embedded run plans before its local Ray starts, and
    bad settings or input fail before that expensive start.
    """
    if len(paths) >= ray_footers_min_files() and _ray_is_initialized():
        return read_footers_on_ray(fs, root, paths, id_column)
    return read_footers_threaded(fs, root, paths, id_column)


def ray_footers_min_files() -> int:
    """:data:`DEFAULT_RAY_FOOTERS_MIN_FILES`, or the value of :data:`RAY_FOOTERS_MIN_FILES_ENV`."""
    value = os.environ.get(RAY_FOOTERS_MIN_FILES_ENV, "").strip()
    try:
        return int(value) if value else DEFAULT_RAY_FOOTERS_MIN_FILES
    except ValueError:
        raise ConfigError(f"{RAY_FOOTERS_MIN_FILES_ENV} must be an integer, got {value!r}") from None


def _ray_is_initialized() -> bool:
    # Not imported means not initialised; importing Ray only to ask would cost seconds.
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def read_footers_threaded(
    fs: AbstractFileSystem, root: str, paths: list[str], id_column: str | None
) -> list[tuple[InputFile, pa.Schema]]:
    """A :data:`FooterReader`: :data:`FOOTER_THREADS` threads of this process."""
    with ThreadPoolExecutor(max_workers=max(1, min(FOOTER_THREADS, len(paths)))) as pool:
        return list(pool.map(lambda p: read_file_info(fs, p, root, id_column), paths))


def read_footers_on_ray(
    fs: AbstractFileSystem,
    root: str,
    paths: list[str],
    id_column: str | None,
    *,
    files_per_task: int | None = None,
) -> list[tuple[InputFile, pa.Schema]]:
    """A :data:`FooterReader`: Ray tasks of this process's Ray (which must be initialised), each
    reading a contiguous batch of files with threads.

    Batches, not a task per file: 100,000 files make at most a few hundred tasks.

    :param files_per_task: the files of each task; None: about two tasks per CPU of the cluster,
        within :data:`MIN_FILES_PER_TASK` and :data:`MAX_FILES_PER_TASK`.
    """
    import ray

    if files_per_task is None:
        files_per_task = _files_per_task(len(paths), int(ray.cluster_resources().get("CPU", 1)))
    started = time.monotonic()
    # SPREAD: footer reads wait on storage, so each node's network adds to the throughput.
    task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_read_footer_batch)
    fs_ref = ray.put(fs)
    batches = [paths[i : i + files_per_task] for i in range(0, len(paths), files_per_task)]
    results = ray.get([task.remote(fs_ref, root, batch, id_column) for batch in batches])
    infos: list[tuple[InputFile, pa.Schema]] = []
    for files, schemas, error in results:
        infos.extend((info, schemas[index]) for info, index in files)
        if error is not None:
            # The batches are in path order and each stops at its first bad file: this is the
            # first bad file of the input, as the threads would name it.
            raise InputError(error)
    log.info("Read %d footers in %d Ray task(s) in %.1f s", len(infos), len(batches), time.monotonic() - started)
    return infos


def _files_per_task(files: int, cpus: int) -> int:
    """About two tasks per CPU (a slow node's batch is then not the last to wait for), each of
    :data:`MIN_FILES_PER_TASK` to :data:`MAX_FILES_PER_TASK` files where there are enough."""
    most = math.ceil(files / MIN_FILES_PER_TASK)
    fewest = math.ceil(files / MAX_FILES_PER_TASK)
    tasks = max(1, min(most, max(2 * max(cpus, 1), fewest)))
    return math.ceil(files / tasks)


def _read_footer_batch(
    fs: AbstractFileSystem, root: str, paths: list[str], id_column: str | None
) -> tuple[list[tuple[InputFile, int]], list[pa.Schema], str | None]:
    """One Ray task's footers: each file with the index of its schema among the batch's distinct
    schemas (the files of an input mostly share one: it travels back once), and the first error."""
    files: list[tuple[InputFile, int]] = []
    schemas: list[pa.Schema] = []
    index_of: dict[bytes, int] = {}
    try:
        infos = read_footers_threaded(fs, root, paths, id_column)
    except InputError as e:
        # The exception's message, not the exception: a Ray task error would wrap it in a traceback.
        return files, schemas, str(e)
    for info, schema in infos:
        key = schema.serialize().to_pybytes()
        if key not in index_of:
            index_of[key] = len(schemas)
            schemas.append(schema)
        files.append((info, index_of[key]))
    return files, schemas, None


def plan_ranges(files: list[InputFile], rows_per_range: int) -> list[RowRange]:
    ranges = []
    for index, file in enumerate(files):
        digest = hashlib.sha1(file.relpath.encode()).hexdigest()[:12]
        bounds = _cut(file.row_groups, rows_per_range)
        if not bounds:
            # An empty file still gets a range, so its (empty) result is committed like any other.
            bounds = [(0, 0)]
        ranges.extend(RowRange(f"{digest}-{start}-{end}", index, start, end) for start, end in bounds)
    return ranges


def _cut(row_groups: tuple[int, ...], rows_per_range: int) -> list[tuple[int, int]]:
    bounds, start, offset = [], 0, 0
    for rows in row_groups:
        if rows > rows_per_range:
            if offset > start:
                bounds.append((start, offset))
            bounds.extend(
                (s, min(s + rows_per_range, offset + rows)) for s in range(offset, offset + rows, rows_per_range)
            )
            start = offset + rows
        elif offset + rows - start > rows_per_range:
            bounds.append((start, offset))
            start = offset
        offset += rows
    if offset > start:
        bounds.append((start, offset))
    return bounds


def plan_input(
    fs: AbstractFileSystem,
    fs_path: str,
    display_path: str,
    columns: list[str] | None,
    rows_per_range: int,
    id_column: str | None = None,
    footer_reader: FooterReader | None = None,
) -> Plan:
    """List and inspect the input, check the requested columns, and cut it into ranges.

    Every file must give each column read the same Arrow type, so that every range's output has
    the same schema; with ``id_column``, a file whose footer statistics count nulls in it is refused.

    :param footer_reader: how the footers are read (:data:`FooterReader`); None: :func:`read_footers`,
        threads here or Ray tasks on a Ray driver.
    """
    root, paths = list_input_files(fs, fs_path, display_path)
    infos = (footer_reader or read_footers)(fs, root, paths, id_column)
    files = [info for info, _ in infos]
    first_schema = infos[0][1]
    wanted = columns if columns is not None else first_schema.names
    seen: dict[str, tuple[pa.DataType, str]] = {}  # column -> its first type other than null, and where
    for info, schema in infos:
        missing = [c for c in wanted if c not in schema.names]
        if missing:
            raise InputError(f"column(s) {missing} not found in {info.path!r}; it has columns {schema.names}")
        for name in wanted:
            found = schema.field(name).type
            if pa.types.is_null(found):
                continue  # only nulls (or no rows): fits any type
            expected, where = seen.setdefault(name, (found, info.path))
            if found != expected:
                raise InputError(
                    f"column {name!r} has type {expected} in {where!r} but {found} in {info.path!r}: "
                    "every input file must give a column the same type (the output holds one schema); "
                    "rewrite the files with one type"
                )
        if info.null_ids:
            raise InputError(
                f"id_column {id_column!r} holds {info.null_ids} null(s) in {info.path!r} (by its footer statistics): "
                "the id column is the row key and must be set on every row"
            )
    schema = pa.schema(
        [first_schema.field(c).with_type(seen[c][0]) if c in seen else first_schema.field(c) for c in wanted]
    )
    return Plan(files, plan_ranges(files, rows_per_range), schema)


def recorded_ranges(recorded: dict[str, Any], rows_per_range: int, max_rows: int | None = None) -> list[RowRange]:
    """The ranges of a recorded plan (:meth:`Plan.describe`): cut again from its files' row
    groups exactly as :func:`plan_input` cut them; listed as they are by a plan of layout version 1."""
    if "ranges" in recorded:
        return [RowRange(**r) for r in recorded["ranges"]]
    files = [
        InputFile(f["relpath"], f["relpath"], f["size"], f["rows"], tuple(f["row_groups"]), f["signature"])
        for f in recorded["files"]
    ]
    return limit_rows(Plan(files, plan_ranges(files, rows_per_range), pa.schema([])), max_rows).ranges


def input_changes(recorded: dict[str, Any], plan: Plan) -> str:
    """Describe how the input differs from the recorded plan's ("" when it does not)."""
    old = {f["relpath"]: f for f in recorded["files"]}
    new = {f.relpath: f.describe() for f in plan.files}
    changes = {
        "added": sorted(new.keys() - old.keys()),
        "removed": sorted(old.keys() - new.keys()),
        "rewritten": sorted(p for p in new.keys() & old.keys() if _fingerprint_differs(old[p], new[p])),
    }
    return "; ".join(f"{label}: {_short(paths)}" for label, paths in changes.items() if paths)


def _fingerprint_differs(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Signatures differ, or a field both plans recorded (a plan of an older version records fewer)."""
    return old["signature"] != new["signature"] or any(
        k in old and k in new and old[k] != new[k] for k in FINGERPRINT_FIELDS
    )


def _short(paths: list[str], limit: int = 5) -> str:
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


def limit_rows(plan: Plan, max_rows: int | None) -> Plan:
    """Keep only the ranges holding the input's first ``max_rows`` rows (a smoke run).

    The last range kept is cut at ``max_rows``; its id follows from its bounds like any other, so a
    limited plan is as deterministic as a full one (and never shares a cut range's id with it).
    """
    if max_rows is None or max_rows >= plan.total_rows:
        return plan
    ranges, rows = [], 0
    for row_range in plan.ranges:
        if rows >= max_rows:
            break
        if rows + row_range.rows > max_rows:
            end = row_range.start + max_rows - rows
            prefix = row_range.id.rsplit("-", 2)[0]
            row_range = RowRange(f"{prefix}-{row_range.start}-{end}", row_range.file_index, row_range.start, end)
        ranges.append(row_range)
        rows += row_range.rows
    return Plan(plan.files, ranges, plan.schema)


def select_ranges(plan: Plan, range_ids: list[str] | None) -> Plan:
    """The plan restricted to ``range_ids`` (a partition of a mapped run), in plan order."""
    if range_ids is None:
        return plan
    wanted = set(range_ids)
    unknown = wanted - {r.id for r in plan.ranges}
    if unknown:
        raise InputError(
            f"{len(unknown)} range id(s) of the partition are not in the input's plan (e.g. {sorted(unknown)[0]}): "
            "the partitions were planned on other input or settings; rerun the planning task"
        )
    return Plan(plan.files, [r for r in plan.ranges if r.id in wanted], plan.schema)
