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
from airflow_provider_raybatch.pipeline.errors import RayBatchError, StageError
from airflow_provider_raybatch.pipeline.faults import crash_point
from airflow_provider_raybatch.pipeline.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.planner import Plan
from airflow_provider_raybatch.pipeline.stages import ENGINE_ERROR, rejects_table
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


class RangeWriters:
    """The ranges being written; each is committed when its last row arrives."""

    def __init__(self, ledger: OutputLedger, plan: Plan, progress: Progress, config: BatchInferenceConfig):
        self.ledger, self.plan, self.progress, self.config = ledger, plan, progress, config
        self.open: dict[int, _OpenRange] = {}

    def write(self, index: int, table: pa.Table, rejected: pa.Table) -> None:
        """Add rows of range ``index``: ``table`` to its output, ``rejected`` to its rejects."""
        row_range = self.plan.ranges[index]
        current = self.open.setdefault(index, _OpenRange())
        if table.num_rows:
            if current.file is None:
                current.path = self.ledger.tmp_file(row_range.id)
                current.file = self.ledger.fs.open(current.path, "wb")
            current.buffered.append(table)
            current.buffered_rows += table.num_rows
            current.rows += table.num_rows
        if rejected.num_rows:
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
        if current.file is not None:
            if current.buffered:
                self._flush(current)
            current.writer.close()
            current.file.close()
        rejects_path, errors = None, 0
        if current.rejects:
            rejects = pa.concat_tables(current.rejects, promote_options="permissive")
            errors = int(pc.sum(pc.equal(rejects.column("kind"), ENGINE_ERROR)).as_py() or 0)
            rejects_path = self.ledger.tmp_file(f"rejects-{row_range.id}")
            with self.ledger.fs.open(rejects_path, "wb") as f:
                pq.write_table(rejects, f)
        del self.open[index]
        self.ledger.commit(row_range.id, current.path, current.rows, rejects_path, current.rejected, errors)
        crash_point("committed")
        self.progress.committed(index, current.rows, current.rejected, errors)
        self.progress.check_errors(self.config.max_error_fraction, self.config.output_path, final=False)

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
