from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from airflow_provider_raybatch.pipeline.errors import StageError
from airflow_provider_raybatch.pipeline.execution.tensors import column_to_numpy, output_to_table


def fixed_size(values: np.ndarray, *shape: int) -> pa.Array:
    array = pa.array(values.reshape(-1))
    for size in reversed(shape):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def test_fixed_size_list_becomes_a_zero_copy_matrix():
    values = np.arange(40, dtype=np.float32)
    column = fixed_size(values, 4)
    matrix = column_to_numpy(column)
    assert matrix.shape == (10, 4)
    assert np.array_equal(matrix, values.reshape(10, 4))
    assert np.shares_memory(matrix, column.flatten().to_numpy())


def test_nested_and_sliced_lists_keep_shape_and_offset():
    values = np.arange(60, dtype=np.int64)
    column = fixed_size(values, 3, 2).slice(4, 3)
    tensor = column_to_numpy(column)
    assert tensor.shape == (3, 3, 2)
    assert np.array_equal(tensor, values.reshape(10, 3, 2)[4:7])


def test_columns_with_nulls_or_strings_fall_back_to_a_copy():
    assert column_to_numpy(pa.array(["a", "b"])).tolist() == ["a", "b"]
    with_null = pa.array([[1.0, 2.0], None], type=pa.list_(pa.float64(), 2))
    assert column_to_numpy(with_null)[1] is None


def test_outputs_round_trip_as_fixed_size_lists():
    out = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    table = output_to_table({"emb": out, "label": np.array([1, 2, 3, 4])}, "model", 4)
    assert table.schema.field("emb").type == pa.list_(pa.list_(pa.float32(), 2), 3)
    assert np.array_equal(column_to_numpy(table["emb"]), out)


def test_a_wrong_row_count_names_the_stage_and_column():
    with pytest.raises(StageError, match=r"stage 'model' returned column 'label' with 3 rows for a batch of 4"):
        output_to_table({"label": np.array([1, 2, 3])}, "model", 4)
    with pytest.raises(StageError, match=r"stage 'model' returned list"):
        output_to_table([1, 2], "model", 2)
