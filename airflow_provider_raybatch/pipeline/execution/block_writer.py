"""The write step: a range's rows written to files on the Ray workers that hold them.

A write step after the last stage (:func:`write_block`, a Ray Data task) writes each block's rows
of each range to a Parquet file in the writer's temporary folder (and its rejected rows to
another), and returns one small metadata row per file (:data:`FILE_METADATA`): the only thing the
driver receives (:class:`.range_commits.RangeCommits` commits the files). Rows do not pass
through the driver.

A range normally arrives in one block, so it gets one file; one that arrives in several blocks
gets one file per block. Each block's ids are checked as a key where they are written; the driver
checks them across a range's blocks.

Each write step also leaves its metadata beside its files (a receipt), which the driver reads
back when the stream fails before the metadata reached it.

When the last stage's replicas reserve only CPUs, they write their own rows
(:class:`WritingStageWorker`) and there is no separate write step.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.columns import (
    COUNT_KEYS,
    ENGINE_ERROR,
    INTERNAL_PREFIX,
    KEEP_PREFIX,
    RANGE_COLUMN,
)
from airflow_provider_raybatch.pipeline.commit.ledger import tmp_name
from airflow_provider_raybatch.pipeline.config import Stage
from airflow_provider_raybatch.pipeline.errors import OutputSchemaError, RayBatchError, StageError
from airflow_provider_raybatch.pipeline.execution.stages import (
    StageWorker,
    count_sums,
    output_columns,
    rejects_table,
    split_by_range,
    split_rejected,
)
from airflow_provider_raybatch.pipeline.store.files import is_local
from airflow_provider_raybatch.pipeline.store.retries import retry_transient

OUTPUT, REJECTS = "output", "rejects"
#: A write step's receipt in the temporary folder: ``block-<block id>`` + this.
RECEIPT_SUFFIX = ".metadata.arrow"

#: What a write step returns for each file it wrote: the only thing the driver receives.
FILE_METADATA = pa.schema(
    [
        ("range", pa.int32()),  # index of the range in the plan
        ("block", pa.string()),  # the block the rows came in (a range's files: one per block)
        ("kind", pa.string()),  # OUTPUT or REJECTS
        ("path", pa.string()),  # in the writer's temporary folder
        ("rows", pa.int64()),
        ("bytes", pa.int64()),
        ("schema", pa.binary()),  # the file's Arrow schema, serialized
        ("engine_errors", pa.int64()),  # rejects that failed in a model
        # The sums of the counted columns over the file's rows, by their keys (null: none counted).
        *((key, pa.int64()) for key in COUNT_KEYS),
        ("problem", pa.string()),  # why the rows' ids are not a key (None: they are)
    ]
)


def write_step_resources(cluster_cpus: float) -> dict[str, Any]:
    """Ray Data arguments of the write step: no CPU of Ray's accounting, at most one write per CPU.

    Like the driver that wrote every file before the write step existed, the writes take no share
    of the CPUs that reading and the replicas reserve. With a share of their own (0.25 CPU), Ray
    Data's resource budget gave them nothing while reads and replicas held every CPU: on 2 CPUs,
    2,194 finished blocks waited unwritten, and no range committed, until the whole input had
    been read.
    """
    from ray.data import TaskPoolStrategy  # as `compute`: map_batches' `concurrency` is deprecated

    return {"num_cpus": 0, "compute": TaskPoolStrategy(size=max(1, int(cluster_cpus)))}


def write_block(
    block: pa.Table,
    *,
    fs: AbstractFileSystem,
    folder: str,
    output_path: str,
    stage: str,
    id_column: str | None,
    key_type: pa.DataType | None,
    partition: dict[str, str] | None = None,
) -> pa.Table:
    """Write ``block``'s rows to one file per range (and one of its rejects); return their metadata.

    Runs as a Ray Data task after the last stage. Rows whose ids are not a key are still written
    (to the temporary folder only): the driver names the range and refuses to commit it.

    :param folder: the writer's temporary folder in the output.
    :param output_path: the output, as the user gave it (named in errors).
    :param stage: the last stage's name (named in errors).
    :param id_column: the row key column, None when the pipeline derives row ids.
    :param key_type: the input's type of ``id_column``.
    :param partition: columns with one value for every row, added to the output's (a table's
        partition, e.g. ``{"ds": "2026-11-24"}``: Iceberg reads a file's partition from its columns).
    """
    if block.num_rows and RANGE_COLUMN not in block.column_names:
        raise StageError(
            f"a transform stage dropped the internal columns (got {block.column_names}); "
            f"its output must carry every column starting with {INTERNAL_PREFIX!r}"
        )
    block_id = uuid4().hex
    rows: list[dict[str, Any]] = []
    for index, piece in split_by_range(block) if block.num_rows else ():
        accepted, rejected = split_rejected(piece)
        output = with_partition(output_columns(accepted), partition, stage)
        rejects = rejects_table(rejected) if rejected.num_rows else None
        problem = None
        if id_column is not None:
            problem = id_type_problem(output, stage, id_column, key_type)
            if problem is None:
                # What is written: a stage's own id column wins over the kept input column in the output.
                ids = [output.column(id_column)] if output.num_rows else []
                if rejected.num_rows:
                    ids.append(rejected.column(KEEP_PREFIX + id_column))
                problem = key_problem([c.cast(key_type) for c in ids], id_column)
        counts = {OUTPUT: count_sums(accepted), REJECTS: count_sums(rejected)}
        for kind, table in ((OUTPUT, output), (REJECTS, rejects)):
            if table is None or not table.num_rows:
                continue
            path = tmp_name(folder, str(index))
            try:
                # The output's key is unique: dictionary encoding it is wasted work. The rejects' is kept as is.
                key = id_column if kind == OUTPUT else None
                size = retry_transient(
                    lambda path=path, table=table, key=key: _write_file(fs, path, table, key),
                    f"writing range #{index} to {path}",
                )
            except OSError as e:
                raise RayBatchError(
                    f"cannot write rows of range #{index} of the plan to output {output_path!r} ({path}): "
                    f"{type(e).__name__}: {e}. The committed ranges are kept; the range is redone on a retry"
                ) from e
            engine_errors = 0
            if kind == REJECTS:
                engine_errors = int(pc.sum(pc.equal(table.column("kind"), ENGINE_ERROR)).as_py() or 0)
            rows.append(
                {
                    "range": index,
                    "block": block_id,
                    "kind": kind,
                    "path": path,
                    "rows": table.num_rows,
                    "bytes": size,
                    "schema": table.schema.remove_metadata().serialize().to_pybytes(),
                    "engine_errors": engine_errors,
                    **counts[kind],
                    "problem": problem,
                }
            )
    metadata = pa.Table.from_pylist(rows, schema=FILE_METADATA)
    if rows:
        receipt = f"{folder}/block-{block_id}{RECEIPT_SUFFIX}"
        retry_transient(lambda: _leave_receipt(fs, receipt, metadata), f"writing {receipt}")
    return metadata


def with_partition(table: pa.Table, partition: dict[str, str] | None, stage: str) -> pa.Table:
    """``table`` with the partition's columns appended (each holding its value on every row)."""
    for column, value in (partition or {}).items():
        if column in table.column_names:
            raise OutputSchemaError(
                f"stage {stage!r} returned a column {column!r}, which is the output table's partition column: "
                "rename it (the partition column is added to every row)"
            )
        table = table.append_column(pa.field(column, pa.string()), pa.array([value] * table.num_rows, pa.string()))
    return table


def _write_file(fs: AbstractFileSystem, path: str, table: pa.Table, id_column: str | None = None) -> int:
    """Write ``table`` to ``path`` as Parquet (:func:`parquet_options`); return the file's size."""
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, **parquet_options(table.schema, id_column))
        size = f.tell()
    return size


@functools.lru_cache(maxsize=64)
def parquet_options(schema: pa.Schema, id_column: str | None = None) -> dict[str, Any]:
    """How the output's Parquet columns are encoded: pyarrow's defaults (dictionary encoding,
    snappy) except where they only cost.

    Floating-point values (model outputs, embeddings) are mostly distinct and their bits do not
    compress: dictionary encoding then snappy wrote them at ~0.06 GB/s on one core, ~3x slower than
    plain values (benchmarks/RESULTS.md 1g), for files of the same size. The row key is unique, so a
    dictionary of it is as large as the column. Other columns (labels, strings) keep both, which
    pay there. Options are per Parquet leaf column (``emb.list.element`` for a list column).
    """
    buffer = io.BytesIO()
    pq.write_table(schema.empty_table(), buffer)
    leaves = pq.ParquetFile(pa.BufferReader(buffer.getvalue())).schema
    dictionary, compression = [], {}
    for i in range(len(leaves)):
        column = leaves.column(i)
        floats = column.physical_type in ("FLOAT", "DOUBLE")
        if not floats and column.path.split(".")[0] != id_column:
            dictionary.append(column.path)
        compression[column.path] = "none" if floats else "snappy"
    return {"use_dictionary": dictionary, "compression": compression}


class WritingStageWorker(StageWorker):
    """A last stage's replica on CPUs, which writes its own rows: no write task, no hop through the object store.

    It scores each block as :class:`StageWorker` does and writes each run of ranges it hands on as
    :func:`write_block` does, yielding the files' metadata.
    """

    def __init__(self, stage: Stage, write: dict[str, Any], scored_prefix: str | None = None):
        """:param stage: the stage this replica runs.
        :param write: :func:`write_block`'s keyword arguments.
        :param scored_prefix: as :class:`.stages.StageWorker`'s.
        """
        super().__init__(stage, scored_prefix)
        self.write = write

    def __call__(self, block: pa.Table) -> Iterator[pa.Table]:
        for scored in super().__call__(block):
            yield write_block(scored, **self.write)


def _leave_receipt(fs: AbstractFileSystem, path: str, metadata: pa.Table) -> None:
    """Write ``metadata`` to ``path`` so that a reader sees it whole or not at all."""
    target = f"{path}.partial" if is_local(fs) else path  # an object store's upload appears whole
    with fs.open(target, "wb") as f, pa.ipc.new_file(f, metadata.schema) as writer:
        writer.write_table(metadata)
    if target != path:
        fs.mv(target, path)


def id_type_problem(table: pa.Table, stage: str, id_column: str, key_type: pa.DataType) -> str | None:
    """Why a stage's output does not carry the input's row key unchanged (None when it does)."""
    if not table.num_rows:
        return None
    column = table.column(id_column) if id_column in table.column_names else None
    if column is not None and (column.type == key_type or pa.types.is_null(column.type)):
        return None
    found = "no such column" if column is None else f"type {column.type}"
    if column is not None and pa.types.is_floating(column.type):
        found += f" ({column.null_count + int(pc.sum(pc.is_nan(column)).as_py() or 0)} of them null or NaN)"
    return (
        f"stage {stage!r} returned id_column {id_column!r} with {found} where the input's is {key_type}: "
        "a stage must not change the row key (a predictor that echoes its batch turns null ids into NaN)"
    )


def key_problem(ids: list[pa.ChunkedArray], id_column: str) -> str | None:
    """Why ids of one range (output and rejects together) are not a key: nulls or repeats (None: they are)."""
    if not ids:
        return None
    chunks = [c for column in ids for c in column.chunks]
    values = pa.chunked_array(chunks, type=ids[0].type)
    if values.null_count:
        return f"id_column {id_column!r} holds {values.null_count} null(s): the row key must be set on every row"
    if _increasing(values):
        return None  # the common case (ids in input order), at a fraction of counting them
    counts = pc.value_counts(values)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):
        example = repeated.field("values")[0].as_py()
        return (
            f"id_column {id_column!r} holds {len(repeated)} duplicated id(s), e.g. {example!r}: "
            "the row key must be unique"
        )
    return None


def _increasing(values: pa.ChunkedArray) -> bool:
    """Whether integer ``values`` (no nulls) strictly increase, and so are distinct."""
    if not pa.types.is_integer(values.type) or len(values) < 2:
        return False
    ids = values.to_numpy()
    return bool((ids[1:] > ids[:-1]).all())
