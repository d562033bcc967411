"""Conversions between Arrow tables and the batches predictors see.

Fixed-size list columns (possibly nested) and Ray's tensor extension columns become N-d numpy
arrays without copying when they hold no nulls; N-d arrays returned by a predictor become
fixed-size list columns (plain Parquet, readable without Ray).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from airflow_provider_raybatch.pipeline.errors import StageError


def column_to_numpy(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(array.type, pa.ExtensionType):
        if hasattr(array, "to_numpy_ndarray"):  # Ray's tensor extension
            return array.to_numpy_ndarray()
        array = array.storage
    shape = [len(array)]
    values = array
    while pa.types.is_fixed_size_list(values.type) and values.null_count == 0:
        shape.append(values.type.list_size)
        values = values.flatten()  # a view of the child values, honouring the slice offset
    if len(shape) > 1 and _is_numeric(values.type) and values.null_count == 0:
        return values.to_numpy(zero_copy_only=True).reshape(shape)
    return array.to_numpy(zero_copy_only=False)


def _is_numeric(t: pa.DataType) -> bool:
    # Booleans are bit-packed in Arrow, so they cannot be viewed as numpy without a copy.
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def table_to_numpy(table: pa.Table) -> dict[str, np.ndarray]:
    return {name: column_to_numpy(table.column(name)) for name in table.column_names}


def array_from_output(value: Any) -> pa.Array | pa.ChunkedArray:
    """Turn one returned column (numpy, list, Arrow, pandas) into an Arrow array."""
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        return value
    if hasattr(value, "to_numpy") and not isinstance(value, np.ndarray):  # pandas Series, torch tensors
        value = value.to_numpy()
    if isinstance(value, np.ndarray) and value.ndim > 1 and value.dtype != object:
        flat = pa.array(np.ascontiguousarray(value).reshape(-1))
        for size in reversed(value.shape[1:]):
            flat = pa.FixedSizeListArray.from_arrays(flat, size)
        return flat
    if isinstance(value, np.ndarray) and value.dtype == object:
        return pa.array(list(value))
    return pa.array(value)


def output_to_table(output: Any, stage_name: str, num_rows: int) -> pa.Table:
    """Check a stage's result and return it as a table of ``num_rows`` rows."""
    if isinstance(output, pa.Table):
        table = output
    elif hasattr(output, "columns") and hasattr(output, "iloc"):  # pandas DataFrame
        table = pa.Table.from_pandas(output, preserve_index=False)
    elif isinstance(output, dict):
        if not output:
            raise StageError(f"stage {stage_name!r} returned an empty dict")
        arrays = {}
        for name, value in output.items():
            try:
                arrays[str(name)] = array_from_output(value)
            except (pa.ArrowException, TypeError, ValueError) as e:
                raise StageError(f"stage {stage_name!r}: column {name!r} cannot be converted to Arrow: {e}") from e
            if len(arrays[str(name)]) != num_rows:
                raise StageError(
                    f"stage {stage_name!r} returned column {name!r} with {len(arrays[str(name)])} rows "
                    f"for a batch of {num_rows} rows; a stage must return one row per input row"
                )
        table = pa.table(arrays)
    else:
        raise StageError(
            f"stage {stage_name!r} returned {type(output).__name__}; expected a dict of arrays, "
            "a pandas DataFrame or a pyarrow Table"
        )
    if table.num_rows != num_rows:
        raise StageError(
            f"stage {stage_name!r} returned {table.num_rows} rows for a batch of {num_rows} rows; "
            "a stage must return one row per input row"
        )
    return table
