"""The input's files: listing them, and one file's Parquet footer as an :class:`InputFile`
(:mod:`.footers` reads many)."""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.errors import InputError
from airflow_provider_raybatch.pipeline.store.files import GLOB_CHARS, is_hidden, static_prefix
from airflow_provider_raybatch.pipeline.store.retries import retry_transient


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
