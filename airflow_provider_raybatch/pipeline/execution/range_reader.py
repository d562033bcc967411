"""Reading a file's ranges on Ray: a row group slice at a time, with the rows' internal columns."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.columns import KEEP_PREFIX, RANGE_COLUMN, ROW_ID_FILE_SHIFT
from airflow_provider_raybatch.pipeline.config import ROW_ID_COLUMN
from airflow_provider_raybatch.pipeline.errors import InputError
from airflow_provider_raybatch.pipeline.planning.input_files import InputFile
from airflow_provider_raybatch.pipeline.planning.planner import RowRange
from airflow_provider_raybatch.pipeline.store.retries import is_transient, retry_transient


def read_ranges(
    fs: AbstractFileSystem,
    file: InputFile,
    ranges: Sequence[tuple[int, RowRange]],
    columns: list[str],
    keep: list[str],
    derive_row_id: bool,
) -> Iterator[pa.Table]:
    """Read ranges of one file, given as (index, range) in file order, a row group slice at a time,
    with their internal columns. A row group that several ranges share is decoded once."""
    with contextlib.ExitStack() as handles:

        def open_parquet() -> pq.ParquetFile:
            return pq.ParquetFile(handles.enter_context(fs.open(file.path, "rb")))

        # Opening reads the footer: throttling then is waited out as for the row groups below.
        parquet = retry_transient(open_parquet, f"opening {file.path!r}")
        cached: tuple[int, pa.Table] | None = None
        for index, row_range in ranges:
            offset = 0
            for group, group_rows in enumerate(file.row_groups):
                lo, hi = max(row_range.start, offset), min(row_range.end, offset + group_rows)
                if lo < hi:
                    if cached is None or cached[0] != group:
                        try:
                            cached = group, parquet.read_row_group(group, columns=columns)
                        except (OSError, pa.ArrowException) as e:
                            cached = group, _read_again(fs, file, group, columns, row_range, e)
                    table = cached[1].slice(lo - offset, hi - lo)
                    yield _with_internal_columns(table, index, row_range.file_index, lo, keep, derive_row_id)
                offset += group_rows


def _read_again(
    fs: AbstractFileSystem, file: InputFile, group: int, columns: list[str], row_range: RowRange, first: Exception
) -> pa.Table:
    """A failed row group read, again from a fresh handle: a dropped connection passes then.

    Store errors that a later attempt may not meet (throttling, 5xx, resets: :func:`.retries.is_transient`)
    are retried with backoff for a bounded time, then fail the try retryably. Damaged data (a
    corrupt page under a valid footer) fails the same way twice and is reported as a permanent
    :class:`InputError` naming the file and the row group, so no retry repeats it.
    """

    def read() -> pa.Table:
        with fs.open(file.path, "rb") as f:
            return pq.ParquetFile(f).read_row_group(group, columns=columns)

    what = f"reading row group {group} of {file.path!r} (range {row_range.id})"
    try:
        return read() if not is_transient(first) else retry_transient(read, what)
    except (OSError, pa.ArrowException) as second:
        if is_transient(second) or type(first) is not type(second) or str(first) != str(second):
            raise
        raise InputError(
            f"cannot read row group {group} of {file.path!r} (range {row_range.id}): "
            f"{type(second).__name__}: {second}. The same read failed twice: the file is damaged; "
            "replace it and rerun with mode='overwrite'"
        ) from second


def _with_internal_columns(
    table: pa.Table, range_index: int, file_index: int, first_row: int, keep: list[str], derive_row_id: bool
) -> pa.Table:
    n = table.num_rows
    table = table.append_column(RANGE_COLUMN, pa.array(np.full(n, range_index, dtype=np.int32)))
    if derive_row_id:
        row_ids = (file_index << ROW_ID_FILE_SHIFT) + first_row + np.arange(n, dtype=np.int64)
        table = table.append_column(KEEP_PREFIX + ROW_ID_COLUMN, pa.array(row_ids))
    for name in keep:
        table = table.append_column(KEEP_PREFIX + name, table.column(name))
    return table
