"""What runs inside Ray: the range reader and the wrapper around each user predictor.

Rows carry internal columns through the stages, never shown to a predictor: the range they
belong to (so the driver knows when a range is complete), the input columns kept for the output
(so a predictor in the style of Ray's guide, which returns only its outputs, still gets them
written beside its results), and, once a stage rejects a row, why.

A stage rejects rows by returning a column ``REJECT_COLUMN`` holding a reason (None for rows it
accepts) and optionally ``REJECT_KIND_COLUMN`` (``INVALID_INPUT`` or ``ENGINE_ERROR``, the
default). Later stages never see rejected rows; the driver writes them to the rejects output.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.config import ROW_ID_COLUMN, Stage, TransformStage
from airflow_provider_raybatch.pipeline.errors import ConfigError, InputError, StageError
from airflow_provider_raybatch.pipeline.input_files import InputFile
from airflow_provider_raybatch.pipeline.planner import RowRange
from airflow_provider_raybatch.pipeline.retries import is_transient, retry_transient
from airflow_provider_raybatch.pipeline.tensors import output_to_table, table_to_numpy

INTERNAL_PREFIX = "__raybatch_"
RANGE_COLUMN = "__raybatch_range"
KEEP_PREFIX = "__raybatch_keep:"
#: Why a stage rejected a row (null: accepted).
REJECT_COLUMN = "__raybatch_reject"
#: What kind of rejection: INVALID_INPUT (never reached a model) or ENGINE_ERROR (a model failed on it).
REJECT_KIND_COLUMN = "__raybatch_reject_kind"
INVALID_INPUT = "invalid_input"
ENGINE_ERROR = "engine_error"
REJECT_COLUMNS = (REJECT_COLUMN, REJECT_KIND_COLUMN)
# Row ids derived from (file, row): rows per file up to 2**40, files up to 2**23.
ROW_ID_FILE_SHIFT = 40


def import_object(path: str) -> Any:
    """Import ``"package.module:Name"`` (or ``"package.module.Name"``)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ImportError(f"{path!r} is not an import path like 'package.module:Name'")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_predictor(stage: Stage) -> Callable[..., Any]:
    """Import the stage's predictor if given by path, and check that it can be called."""
    target = stage.predictor
    where = f"stage {stage.display_name!r}"
    if isinstance(target, str):
        try:
            target = import_object(target)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"{where}: cannot import predictor {stage.predictor!r}: {e}") from e
    if inspect.isclass(target):
        if "__call__" not in dir(target):  # dir() of a class leaves out type.__call__
            raise ConfigError(f"{where}: predictor class {target.__qualname__} has no __call__(batch) method")
    elif not callable(target):
        raise ConfigError(f"{where}: predictor {stage.predictor!r} is not callable")
    return target


def warm_imports(stages: Sequence[Stage]) -> list[str]:
    """Modules a warm worker imports ahead for these stages' replicas: Ray Data, this module and
    the block writer, each predictor's module, and the modules a predictor names in its
    ``warm_imports`` attribute (the heavy ones it imports when built, such as ``torch``)."""
    names = ["ray.data", __name__, "airflow_provider_raybatch.pipeline.block_writer"]
    for stage in stages:
        if isinstance(stage, TransformStage):
            continue
        target = resolve_predictor(stage)
        names += [getattr(target, "__module__", None) or "", *getattr(target, "warm_imports", ())]
    return [n for n in dict.fromkeys(names) if n and n != "__main__"]


class StageWorker:
    """The callable class Ray Data runs per replica: builds the predictor once, then maps batches."""

    def __init__(self, stage: Stage):
        self.name = stage.display_name
        self.batch_format = stage.batch_format
        # Replicas on CPUs get whole blocks from Ray Data (see the runner) and slice them here.
        self.rows_per_call = stage.batch_size if stage.cpus_only else None
        target = resolve_predictor(stage)
        if inspect.isclass(target):
            self.fn, self.kwargs = target(**stage.predictor_kwargs), {}
        else:
            self.fn, self.kwargs = target, dict(stage.predictor_kwargs)

    def __call__(self, table: pa.Table) -> Iterator[pa.Table]:
        size = self.rows_per_call
        if not size or table.num_rows <= size:
            yield self._score(table)
            return
        # A whole block may hold many ranges (one read task reads a row group's): each run of
        # whole ranges of about a batch goes on as soon as it is scored, so that its ranges are
        # written and committed while the rest of the block is scored.
        start = 0
        for end in _cuts_between_ranges(table, size):
            part = table.slice(start, end - start)
            scored = [self._score(part.slice(i, size)) for i in range(0, part.num_rows, size)]
            try:
                # As Ray Data joins batches into a block: missing columns become nulls, numbers widen.
                yield pa.concat_tables(scored, promote_options="permissive")
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise StageError(f"stage {self.name!r} returned batches whose columns do not fit together: {e}") from e
            start = end

    def _score(self, table: pa.Table) -> pa.Table:
        table, rejected = split_rejected(table)
        if table.num_rows == 0:
            return rejected
        internal = [c for c in table.column_names if c.startswith(INTERNAL_PREFIX)]
        user = table.drop_columns(internal)
        if self.batch_format == "numpy":
            batch: Any = table_to_numpy(user)
        elif self.batch_format == "pandas":
            batch = user.to_pandas()
        else:
            batch = user
        result = output_to_table(self.fn(batch, **self.kwargs), self.name, table.num_rows)
        result, reasons, kinds = self._take_rejects(result)
        for name in internal:
            if name not in REJECT_COLUMNS:
                result = result.append_column(name, table.column(name))
        if reasons is not None:
            result = result.append_column(REJECT_COLUMN, reasons).append_column(REJECT_KIND_COLUMN, kinds)
        if rejected.num_rows == 0:
            return result
        # Rows rejected earlier pass by with nulls in this stage's output columns.
        return pa.concat_tables([result, rejected], promote_options="default")

    def _take_rejects(self, result: pa.Table) -> tuple[pa.Table, pa.Array | None, pa.Array | None]:
        bad = [c for c in result.column_names if c.startswith(INTERNAL_PREFIX) and c not in REJECT_COLUMNS]
        if bad:
            raise StageError(f"stage {self.name!r} returned internal column(s) {bad}; rename them")
        outputs = result.drop_columns([c for c in REJECT_COLUMNS if c in result.column_names])
        if REJECT_COLUMN not in result.column_names:
            return outputs, None, None
        try:
            reasons = result.column(REJECT_COLUMN).cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise StageError(f"stage {self.name!r}: {REJECT_COLUMN} must hold reason strings or None: {e}") from e
        kinds: Any = ENGINE_ERROR
        if REJECT_KIND_COLUMN in result.column_names:
            kinds = pc.coalesce(result.column(REJECT_KIND_COLUMN).cast(pa.string()), ENGINE_ERROR)
        return outputs, reasons, pc.if_else(pc.is_valid(reasons), kinds, pa.scalar(None, pa.string()))


def _cuts_between_ranges(table: pa.Table, rows: int) -> list[int]:
    """Row positions that cut ``table`` (rows in range order) into runs of whole ranges, each of
    at least ``rows`` rows but the last."""
    if RANGE_COLUMN not in table.column_names:
        return [table.num_rows]
    ranges = table.column(RANGE_COLUMN).to_numpy()
    cuts, last = [], 0
    for boundary in [*(np.flatnonzero(ranges[1:] != ranges[:-1]) + 1), table.num_rows]:
        if boundary - last >= rows or boundary == table.num_rows:
            cuts.append(int(boundary))
            last = boundary
    return cuts


def split_rejected(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(accepted rows, rejected rows); rejected rows keep only their internal columns."""
    if REJECT_COLUMN not in table.column_names:
        return table, table.schema.empty_table().select([])
    valid = pc.is_valid(table.column(REJECT_COLUMN))
    if not pc.any(valid).as_py():
        return table, table.schema.empty_table().select([])
    internal = [c for c in table.column_names if c.startswith(INTERNAL_PREFIX)]
    return table.filter(pc.invert(valid)), table.filter(valid).select(internal)


def rejects_table(rejected: pa.Table) -> pa.Table:
    """What the rejects output holds: the row key and kept columns (not binary ones), reason, kind."""
    names, columns = [], []
    for name in rejected.column_names:
        if name.startswith(KEEP_PREFIX):
            column = rejected.column(name)
            if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
                continue  # image bytes and the like: the rejects name the row, they do not copy it
            names.append(name[len(KEEP_PREFIX) :])
            columns.append(column)
    kinds = (
        rejected.column(REJECT_KIND_COLUMN)
        if REJECT_KIND_COLUMN in rejected.column_names
        else pa.array([ENGINE_ERROR] * rejected.num_rows, pa.string())
    )
    return pa.table(
        columns + [rejected.column(REJECT_COLUMN).cast(pa.string()), kinds.cast(pa.string())],
        names=names + ["reason", "kind"],
    )


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


def split_by_range(table: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """Yield (range index, rows of that range) for a block that may hold several ranges."""
    column = table.column(RANGE_COLUMN)
    lo, hi = pc.min_max(column).values()
    if lo == hi:
        yield lo.as_py(), table
        return
    for value in pc.unique(column).to_pylist():
        yield value, table.filter(pc.equal(column, value))


def output_columns(table: pa.Table) -> pa.Table:
    """Drop internal columns and restore kept input columns; a stage output wins a name clash."""
    names = table.column_names
    outputs = [c for c in names if not c.startswith(INTERNAL_PREFIX)]
    kept = [c[len(KEEP_PREFIX) :] for c in names if c.startswith(KEEP_PREFIX)]
    kept = [c for c in kept if c not in outputs]
    return pa.table(
        [table.column(KEEP_PREFIX + c) for c in kept] + [table.column(c) for c in outputs],
        names=kept + outputs,
    )
