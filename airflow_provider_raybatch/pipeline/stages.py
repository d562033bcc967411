"""What runs inside Ray: the range reader and the wrapper around each user predictor.

Rows carry two kinds of internal columns through the stages, never shown to a predictor: the
range they belong to (so the driver knows when a range is complete) and the input columns kept
for the output (so a predictor in the style of Ray's guide, which returns only its outputs,
still gets them written beside its results).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.config import ROW_ID_COLUMN, Stage
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.planner import InputFile, RowRange
from airflow_provider_raybatch.pipeline.tensors import output_to_table, table_to_numpy

INTERNAL_PREFIX = "__raybatch_"
RANGE_COLUMN = "__raybatch_range"
KEEP_PREFIX = "__raybatch_keep:"
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


class StageWorker:
    """The callable class Ray Data runs per replica: builds the predictor once, then maps batches."""

    def __init__(self, stage: Stage):
        self.name = stage.display_name
        self.batch_format = stage.batch_format
        target = resolve_predictor(stage)
        if inspect.isclass(target):
            self.fn, self.kwargs = target(**stage.predictor_kwargs), {}
        else:
            self.fn, self.kwargs = target, dict(stage.predictor_kwargs)

    def __call__(self, table: pa.Table) -> pa.Table:
        internal = [c for c in table.column_names if c.startswith(INTERNAL_PREFIX)]
        user = table.drop_columns(internal)
        if self.batch_format == "numpy":
            batch: Any = table_to_numpy(user)
        elif self.batch_format == "pandas":
            batch = user.to_pandas()
        else:
            batch = user
        result = output_to_table(self.fn(batch, **self.kwargs), self.name, table.num_rows)
        for name in internal:
            result = result.append_column(name, table.column(name))
        return result


def read_range(
    fs: AbstractFileSystem,
    file: InputFile,
    row_range: RowRange,
    range_index: int,
    columns: list[str],
    keep: list[str],
    derive_row_id: bool,
) -> Iterator[pa.Table]:
    """Read one range, a row group slice at a time, with its internal columns."""
    with fs.open(file.path, "rb") as f:
        parquet = pq.ParquetFile(f)
        offset = 0
        for group, group_rows in enumerate(file.row_groups):
            lo, hi = max(row_range.start, offset), min(row_range.end, offset + group_rows)
            if lo < hi:
                table = parquet.read_row_group(group, columns=columns).slice(lo - offset, hi - lo)
                yield _with_internal_columns(table, range_index, row_range.file_index, lo, keep, derive_row_id)
            offset += group_rows


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
