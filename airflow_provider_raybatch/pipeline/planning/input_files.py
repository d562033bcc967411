"""The input's files: listing them, and reading their Parquet footers into :class:`InputFile`.

Footers are read by threads of this process, or, when this process is a Ray driver (a Ray Job
on a cluster) and the input has many files, by Ray tasks spread over the cluster
(:func:`read_footers`): both give the same files, fingerprints and schemas.
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
from airflow_provider_raybatch.pipeline.store.files import GLOB_CHARS, is_hidden, static_prefix
from airflow_provider_raybatch.pipeline.store.retries import retry_transient

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


def list_input_files(fs: AbstractFileSystem, fs_path: str, display_path: str) -> tuple[str, list[str]]:
    """Return the input root and the sorted Parquet files under a file, folder or glob."""
    if any(c in fs_path for c in GLOB_CHARS):
        root = static_prefix(fs_path)
        paths = [p for p in fs.glob(fs_path) if fs.isfile(p)]
        if not paths:
            raise InputError(f"input path {display_path!r} matches no file")
    elif fs.isfile(fs_path):
        _refuse_undecodable_names([fs_path], display_path)
        return posixpath.dirname(fs_path), [fs_path]
    elif fs.isdir(fs_path):
        root = fs_path
        paths = fs.find(fs_path)
    else:
        raise InputError(f"input path {display_path!r} does not exist")
    paths = sorted(p for p in paths if not is_hidden(posixpath.relpath(p, root)))
    if not paths:
        raise InputError(f"input path {display_path!r} holds no data file (files starting with '_' or '.' are skipped)")
    _refuse_undecodable_names(paths, display_path)
    return root, paths


def read_file_info(
    fs: AbstractFileSystem, path: str, root: str, id_column: str | None = None
) -> tuple[InputFile, pa.Schema]:
    def read() -> tuple[int, dict[str, Any], pq.FileMetaData]:
        with fs.open(path, "rb") as f:
            # Remote files carry the listing's details (s3fs: ETag, LastModified); local ones are stat'ed.
            return f.size, getattr(f, "details", None) or fs.info(path), pq.ParquetFile(f).metadata

    try:
        # Throttling or a reset is not a bad file: retried here, then a retryable StoreUnavailableError.
        size, details, metadata = retry_transient(read, f"reading the footer of {path}")
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


def _refuse_undecodable_names(paths: list[str], display_path: str) -> None:
    """Refuse files whose names are not valid UTF-8, naming them with their odd bytes escaped.

    On Linux such a name is listed with surrogate escapes (``b"caf\\xe9"`` as ``'caf\\udce9'``), which
    fail when encoded: in the range ids, the plan's JSON, logs. Refused at listing, before anything
    is written, rather than failing later on every retry with an error that names no file.
    """
    bad = [path for path in paths if not _is_utf8(path)]
    if not bad:
        return
    shown = ", ".join(f"'{_escaped(path)}'" for path in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    raise InputError(
        f"input path {display_path!r} holds {len(bad)} file(s) whose name is not valid UTF-8 "
        f"(shown with the bytes that are not UTF-8 as \\xNN): {shown}. The output's plan records file names "
        "as text: rename these files to UTF-8 names, or move them out of the input."
    )


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _escaped(name: str) -> str:
    """``name`` with each undecodable byte (a surrogate escape) written ``\\xNN``, other surrogates ``\\uNNNN``."""
    return "".join(_escaped_char(c) for c in name)


def _escaped_char(c: str) -> str:
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:  # how os.fsdecode (surrogateescape) spells the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return f"\\u{code:04x}"
    return c


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
