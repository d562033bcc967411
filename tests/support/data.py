"""Test data written as real Parquet."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

FEATURES = 8


def features_table(n: int, start_id: int = 0, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed + start_id)
    x = rng.random((n, FEATURES), dtype=np.float32)
    return pa.table(
        {
            "id": pa.array(np.arange(start_id, start_id + n, dtype=np.int64)),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), FEATURES),
            "group": pa.array([f"g{i % 3}" for i in range(start_id, start_id + n)]),
        }
    )


def put_input(fs: AbstractFileSystem, folder: str, rows_per_file: list[int], row_group_size: int = 100) -> None:
    """:func:`write_input`'s files on any fsspec filesystem (an object store's: a PUT per file)."""
    start = 0
    for i, n in enumerate(rows_per_file):
        buffer = io.BytesIO()
        pq.write_table(features_table(n, start), buffer, row_group_size=row_group_size)
        fs.pipe_file(f"{folder}/part-{i}.parquet", buffer.getvalue())
        start += n


def write_input(folder: Path, rows_per_file: list[int], row_group_size: int = 100) -> list[Path]:
    """Files part-0.parquet, part-1.parquet... with consecutive ids starting at 0."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, start = [], 0
    for i, n in enumerate(rows_per_file):
        path = folder / f"part-{i}.parquet"
        pq.write_table(features_table(n, start), path, row_group_size=row_group_size)
        paths.append(path)
        start += n
    return paths


def read_output(path: str | Path, **kwargs) -> pa.Table:
    return pq.read_table(str(path), **kwargs)


def assert_exactly_once(output: pa.Table, expected_ids: range | list[int]) -> None:
    ids = output["id"].to_pylist()
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicated rows"
    assert sorted(ids) == list(expected_ids)


def assert_output_sound(path: str | Path, expected_ids: range | list[int]) -> None:
    """The output passes the verifier (files as their ledger says) and holds each expected id once."""
    from airflow_provider_raybatch.pipeline.commit.verify import verify_output

    assert verify_output(str(path)) == []
    assert_exactly_once(read_output(path), expected_ids)


class OpenRecordingFileSystem(LocalFileSystem):
    """The local filesystem, noting which process opened which file: one ``<pid> <path>`` line per
    open in the file ``record`` (appended, so processes on this machine, Ray's workers included,
    share it). It pickles by its arguments, as every fsspec filesystem, so Ray tasks get one too."""

    def __init__(self, record: str, **kwargs):
        super().__init__(**kwargs)
        self.record = record

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        with open(self.record, "a") as f:
            f.write(f"{os.getpid()} {path}\n")
        return super()._open(path, mode=mode, block_size=block_size, **kwargs)

    def opened(self) -> list[tuple[int, str]]:
        """(pid, path) of every open so far, then forgets them."""
        if not os.path.exists(self.record):
            return []
        with open(self.record) as f:
            lines = [line.split(" ", 1) for line in f.read().splitlines()]
        os.remove(self.record)
        return [(int(pid), path) for pid, path in lines]
