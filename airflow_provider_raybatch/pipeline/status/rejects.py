"""An output's rejected rows: counts from the commit records, rows from the committed rejects files.

A range's rejected rows are in ``_rejects/part-<range id>...parquet`` (the row key, the kept
columns, ``reason`` and ``kind``: ``invalid_input`` or ``engine_error``), named by its commit
record. Only committed ranges' files are read: a killed try's uncommitted files are not rejects
of the output (the next try removes and redoes them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.errors import OutputNotFoundError
from airflow_provider_raybatch.pipeline.status.output_status import rejects_files


@dataclass(frozen=True)
class RejectsSample:
    """An output's rejects: counts over the whole output, and the first rows read.

    :param rejected: rejected rows, as the commit records count them.
    :param engine_errors: of which failed in a model (``kind == "engine_error"``); the others are
        invalid input.
    :param rows: up to the limit asked for, in range order: the row key and kept columns, ``reason``, ``kind``.
    :param files: the committed rejects files (relative to the output).
    """

    path: str
    rejected: int
    engine_errors: int
    rows: pa.Table
    files: list[str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (binary values as hex text)."""
        rows = [{k: v.hex() if isinstance(v, bytes) else v for k, v in row.items()} for row in self.rows.to_pylist()]
        return {
            "path": self.path,
            "rejected": self.rejected,
            "engine_errors": self.engine_errors,
            "invalid_input": self.rejected - self.engine_errors,
            "files": len(self.files),
            "rows": rows,
        }


def read_rejects(
    output_path: str, storage_options: dict[str, Any] | None = None, limit: int | None = 20
) -> RejectsSample:
    """The rejects of the output at ``output_path``: its committed rejects files, read in range
    order until ``limit`` rows (None: all of them, to export).

    :param output_path: the output folder (for a table output, a writer's staging output).
    :param storage_options: fsspec options for a remote path.
    :param limit: rows to read at most.
    :raises OutputNotFoundError: nothing was planned at ``output_path``.
    """
    ledger = OutputLedger.open(output_path, storage_options)
    ledger.fs.invalidate_cache()
    if ledger.load_plan() is None:
        raise OutputNotFoundError(f"{output_path}: no _raybatch/plan.json there: not an output of this provider")
    committed = ledger.committed()
    files = rejects_files(committed)
    return RejectsSample(
        path=output_path,
        rejected=sum(r.rejected for r in committed.values()),
        engine_errors=sum(r.engine_errors for r in committed.values()),
        rows=_read_rows(ledger, files, limit),
        files=files,
    )


def sample_rejects(
    output_path: str, files: list[str], storage_options: dict[str, Any] | None = None, limit: int | None = 20
) -> pa.Table:
    """The first ``limit`` rejected rows of ``files`` (committed rejects files, relative to the
    output: :attr:`.OutputStatus.rejects_files`), without reading the commit records again.

    :param output_path: the output folder (for a table output, a writer's staging output).
    :param files: the rejects files, in range order.
    :param storage_options: fsspec options for a remote path.
    :param limit: rows to read at most.
    """
    return _read_rows(OutputLedger.open(output_path, storage_options), files, limit)


def _read_rows(ledger: OutputLedger, files: list[str], limit: int | None) -> pa.Table:
    tables: list[pa.Table] = []
    read = 0
    for name in files:
        if limit is not None and read >= limit:
            break
        with ledger.fs.open(f"{ledger.root}/{name}", "rb") as f:
            table = pq.read_table(f)
        if limit is not None:
            table = table.slice(0, limit - read)
        tables.append(table)
        read += table.num_rows
    return pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})
