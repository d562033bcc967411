"""Range files written on the driver: one Parquet file per range (and one of its rejects), committed whole.

The driver receives the stream of blocks in any order; rows of a range are buffered into row
groups of at least ``ROW_GROUP_ROWS`` rows and the range is committed (through the ledger) as
soon as its last row has arrived, so a crash loses at most the ranges in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_raybatch.pipeline.config import ROW_ID_COLUMN, BatchInferenceConfig
from airflow_provider_raybatch.pipeline.errors import OutputSchemaError, RayBatchError, RowKeyError, StageError
from airflow_provider_raybatch.pipeline.faults import crash_point
from airflow_provider_raybatch.pipeline.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.planner import Plan, RowRange
from airflow_provider_raybatch.pipeline.schemas import batch_mismatch, promotion_needed, schema_mismatch
from airflow_provider_raybatch.pipeline.stages import ENGINE_ERROR, KEEP_PREFIX, rejects_table
from airflow_provider_raybatch.pipeline.summary import Progress

#: Rows buffered per output row group: small Ray blocks must not become tiny row groups.
ROW_GROUP_ROWS = 65_536


@dataclass
class _OpenRange:
    path: str | None = None
    file: Any = None
    writer: pq.ParquetWriter | None = None
    buffered: list[pa.Table] = field(default_factory=list)
    buffered_rows: int = 0
    rows: int = 0
    rejects: list[pa.Table] = field(default_factory=list)
    rejected: int = 0
    schema: pa.Schema | None = None  # of the range's first rows: later ones must fit it
    ids: list[pa.ChunkedArray] = field(default_factory=list)  # id_column values, output and rejects


class RangeWriters:
    """The ranges being written; each is committed when its last row arrives."""

    def __init__(self, ledger: OutputLedger, plan: Plan, progress: Progress, config: BatchInferenceConfig):
        self.ledger, self.plan, self.progress, self.config = ledger, plan, progress, config
        self.open: dict[int, _OpenRange] = {}
        self.schemas: dict[str, pa.Schema] = {}  # kind -> recorded schema, once read or recorded
        self.stage = config.stages[-1].display_name

    def write(self, index: int, table: pa.Table, rejected: pa.Table) -> None:
        """Add rows of range ``index``: ``table`` to its output, ``rejected`` to its rejects."""
        row_range = self.plan.ranges[index]
        current = self.open.setdefault(index, _OpenRange())
        if table.num_rows:
            if current.schema is None:
                current.schema = table.schema
            elif problem := batch_mismatch(current.schema, table.schema):
                raise OutputSchemaError(
                    f"stage {self.stage!r} returned batches of different schemas for range {row_range.id}: {problem}"
                )
            if self.config.id_column is not None:
                current.ids.append(self._ids(table, self.config.id_column, row_range))
            if current.file is None:
                current.path = self.ledger.tmp_file(row_range.id)
                current.file = self.ledger.fs.open(current.path, "wb")
            current.buffered.append(table)
            current.buffered_rows += table.num_rows
            current.rows += table.num_rows
        if rejected.num_rows:
            if self.config.id_column is not None:
                current.ids.append(rejected.column(KEEP_PREFIX + self.config.id_column))
            current.rejects.append(rejects_table(rejected))  # rejects are few: kept in memory until commit
            current.rejected += rejected.num_rows
        received = current.rows + current.rejected
        if received > row_range.rows:
            raise RayBatchError(f"range {row_range.id} received {received} rows but holds {row_range.rows}")
        if received == row_range.rows:
            self._commit(index, current)
        elif current.buffered_rows >= ROW_GROUP_ROWS:
            self._flush(current)

    def commit_empty(self, index: int, keep: list[str]) -> None:
        """Commit a range without rows (an empty input file)."""
        row_range = self.plan.ranges[index]
        tmp = None
        if self.plan.input_rows == 0 and row_range.file_index == 0:
            # An output with no rows still gets one (empty) file so that any Parquet reader opens it.
            fields = [pa.field(ROW_ID_COLUMN, pa.int64())] if self.config.id_column is None else []
            schema = pa.schema(fields + [self.plan.schema.field(c) for c in keep])
            tmp = self.ledger.tmp_file(row_range.id)
            with self.ledger.fs.open(tmp, "wb") as f:
                pq.write_table(schema.empty_table(), f)
        self.ledger.commit(row_range.id, tmp, 0)
        self.progress.committed(index)

    def _commit(self, index: int, current: _OpenRange) -> None:
        row_range = self.plan.ranges[index]
        if self.config.id_column is not None:
            self._check_ids(current, row_range)
        if current.file is not None:
            if current.buffered:
                self._flush(current)
            current.writer.close()
            current.file.close()
            current.path = self._conform(current.path, current.writer.schema, "output", row_range)
        rejects_path, errors = None, 0
        if current.rejects:
            rejects = pa.concat_tables(current.rejects, promote_options="permissive")
            recorded = self._recorded("rejects", rejects.schema, row_range)
            if promotion_needed(recorded, rejects.schema):
                rejects = rejects.cast(recorded)
            errors = int(pc.sum(pc.equal(rejects.column("kind"), ENGINE_ERROR)).as_py() or 0)
            rejects_path = self.ledger.tmp_file(f"rejects-{row_range.id}")
            with self.ledger.fs.open(rejects_path, "wb") as f:
                pq.write_table(rejects, f)
        del self.open[index]
        self.ledger.commit(row_range.id, current.path, current.rows, rejects_path, current.rejected, errors)
        crash_point("committed")
        self.progress.committed(index, current.rows, current.rejected, errors)
        self.progress.check_errors(self.config.max_error_fraction, self.config.output_path, final=False)

    def _recorded(self, kind: str, schema: pa.Schema, row_range: RowRange) -> pa.Schema:
        """The output's recorded schema of ``kind`` (recording ``schema`` if none is), checked against ``schema``."""
        if kind not in self.schemas:
            self.schemas[kind] = self.ledger.recorded_schema(kind) or self.ledger.record_schema(kind, schema)
        recorded = self.schemas[kind]
        if problem := schema_mismatch(recorded, schema):
            what = f"stage {self.stage!r}" if kind == "output" else "the rejects of stage " + repr(self.stage)
            raise OutputSchemaError(
                f"{what} returned range {row_range.id} with a schema other than the one the output's committed "
                f"ranges have ({self.ledger.display_path}): {problem}. Nothing of the range is committed; a stage "
                "must return the same columns and types for every batch (fix it, then rerun with mode='overwrite')"
            )
        return recorded

    def _conform(self, path: str, schema: pa.Schema, kind: str, row_range: RowRange) -> str:
        """Check a written range file against the recorded schema; rewrite it if it needs a promotion."""
        recorded = self._recorded(kind, schema, row_range)
        if not promotion_needed(recorded, schema):
            return path
        with self.ledger.fs.open(path, "rb") as f:
            table = pq.read_table(f).cast(recorded)
        promoted = self.ledger.tmp_file(row_range.id)
        with self.ledger.fs.open(promoted, "wb") as f:
            pq.write_table(table, f)
        self.ledger.fs.rm(path)
        return promoted

    def _ids(self, table: pa.Table, id_column: str, row_range: RowRange) -> pa.ChunkedArray:
        expected = self.plan.schema.field(id_column).type
        column = table.column(id_column) if id_column in table.column_names else None
        if column is None or (column.type != expected and not pa.types.is_null(column.type)):
            found = "no such column" if column is None else f"type {column.type}"
            nulls = ""
            if column is not None and pa.types.is_floating(column.type):
                nulls = f", {column.null_count + int(pc.sum(pc.is_nan(column)).as_py() or 0)} of them null or NaN"
            raise RowKeyError(
                f"stage {self.stage!r} returned id_column {id_column!r} with {found} for range {row_range.id} "
                f"(of {self.plan.files[row_range.file_index].path!r}){nulls}, where the input's is {expected}: "
                "a stage must not change the row key (a predictor that echoes its batch turns null ids into NaN); "
                "nothing of the range is committed"
            )
        return column

    def _check_ids(self, current: _OpenRange, row_range: RowRange) -> None:
        """The range's ids (output and rejects together) are a key: none null, none twice."""
        if not current.ids:
            return
        key_type = self.plan.schema.field(self.config.id_column).type
        ids = pa.chunked_array([c.cast(key_type) for i in current.ids for c in i.chunks], type=key_type)
        source = self.plan.files[row_range.file_index].path
        if ids.null_count:
            raise RowKeyError(
                f"id_column {self.config.id_column!r} holds {ids.null_count} null(s) in rows {row_range.start}-"
                f"{row_range.end} of {source!r} (range {row_range.id}): the id column is the row key and must be set "
                "on every row; nothing of the range is committed"
            )
        counts = pc.value_counts(ids)
        repeated = counts.filter(pc.greater(counts.field("counts"), 1))
        if len(repeated):
            example = repeated.field("values")[0].as_py()
            raise RowKeyError(
                f"id_column {self.config.id_column!r} holds {len(repeated)} duplicated id(s) in range {row_range.id} "
                f"(rows {row_range.start}-{row_range.end} of {source!r}), e.g. {example!r}: the id column is the "
                "row key and must be unique; nothing of the range is committed"
            )

    def _flush(self, current: _OpenRange) -> None:
        try:
            table = pa.concat_tables(current.buffered, promote_options="permissive")
        except pa.ArrowInvalid as e:
            raise StageError(f"the stages returned batches with incompatible schemas: {e}") from e
        if current.writer is None:
            current.writer = pq.ParquetWriter(current.file, table.schema)
        elif table.schema != current.writer.schema:
            try:
                table = table.cast(current.writer.schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
                raise StageError(f"the stages returned batches with incompatible schemas: {e}") from e
        current.writer.write_table(table, row_group_size=max(table.num_rows, 1))
        current.buffered, current.buffered_rows = [], 0

    def check_done(self) -> None:
        """After the stream: every range it carried must have been committed."""
        if self.open:
            short = [self.plan.ranges[i].id for i in self.open]
            raise RayBatchError(f"the stream ended before ranges {short} were complete")

    def abort(self) -> None:
        """Close what is open; the files are left for the next run's cleanup."""
        for current in self.open.values():
            for closeable in (current.writer, current.file):
                try:
                    if closeable is not None:
                        closeable.close()
                except Exception:  # noqa: BLE001 - already failing; the next run removes the file
                    pass
        self.open.clear()
