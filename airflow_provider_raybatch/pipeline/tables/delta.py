"""Delta Lake table commits, each applied exactly once (the ``deltalake`` package, delta-rs).

A writer adds files it has already written and committed to its own ledger (Parquet files under
the table's root) in table commits numbered 0, 1, 2... per writer. Commit ``seq`` carries the
application transaction ``(writer id, seq)`` and names its ranges in the commit's metadata.

Delta records the transaction but does not refuse a number it has seen (delta-rs 1.6 accepted the
same ``(app id, version)`` twice and added the rows twice), so the number is checked here: before
each attempt the table's latest version for the writer id is read, and a commit at or below it
was applied already (a retry whose first attempt's reply was lost, a resumed run). Two commits
with the same writer id racing for the table make one fail with ``CommitFailedError`` (delta-rs
checks a transaction id against the commits that landed since it read the table), and the loser,
reading again, finds its number applied or commits after the winner.

Readers see a table commit whole or not at all: rows appear a commit at a time, and a partition's
replacement removes its old files and adds the new ones in one commit.

Two writers never both create one version of the log: delta-rs writes a version with the store's
create-if-absent PUT, and the store refuses the second (S3: ``If-None-Match: *``; GCS: the XML API's
``x-goog-if-generation-match: 0``, 412; Azure Blob / ADLS Gen2: ``If-None-Match: *``). No lock or
locking service is involved on GCS and Azure (delta-rs's default log store); the loser reads the
winner's commit and tries the next version, or fails with ``CommitFailedError`` as above. The
store's options (from the same connections as folder outputs) are mapped by
:func:`.delta_storage.delta_storage_options`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from airflow_provider_raybatch.pipeline.tables.writer_commits import (
    DataFile,
    apply_once,
    columns_to_add,
    commit_metadata,
)


class DeltaTableWriter:
    """One writer's commits to a Delta table partitioned by ``partition_by``.

    :param uri: the table's root (a local path, ``s3://``, ``gs://``, ``abfs://``).
    :param schema: the table's schema, partition columns included; the table is created with it on
        the first commit, and a table that exists must have it (None: commits add no files).
    :param partition_by: the partition columns (e.g. ``["ds"]``).
    :param writer_id: the application transaction id of this writer's commits: stable across the
        retries and resumptions of one output, unique per output.
    :param storage_options: delta-rs's options for the store (credentials, endpoint).
    :param fence: called before each attempt at a commit; raises when this writer may no longer
        commit (its output's lease was taken over).
    :param add_columns: add the columns of ``schema`` that the table lacks (nullable) before a
        commit of files, when they are its only difference from the table's schema; False: refuse
        any difference.
    """

    def __init__(
        self,
        uri: str,
        schema: pa.Schema | None,
        partition_by: Sequence[str],
        writer_id: str,
        storage_options: Mapping[str, str] | None = None,
        *,
        fence: Callable[[], None] = lambda: None,
        add_columns: bool = False,
    ):
        self.uri, self.schema, self.partition_by = uri, schema, list(partition_by)
        self.writer_id, self.fence, self.add_columns = writer_id, fence, add_columns
        self.storage_options = dict(storage_options or {})

    def applied(self) -> int:
        """The highest commit number of this writer in the table; -1 for none (or no table yet)."""
        table = self._open()
        return -1 if table is None else _applied(table, self.writer_id)

    def version(self) -> int | None:
        """The table's current version (None: no table yet)."""
        table = self._open()
        return None if table is None else int(table.version())

    def partition_files(self, partition: Mapping[str, str]) -> list[str]:
        """The files of ``partition`` in the table's current version, relative to its root."""
        table = self._open()
        if table is None:
            return []
        adds = pa.table(table.get_add_actions(flatten=True))
        keep = [
            all(adds.column(f"partition.{k}")[i].as_py() == v for k, v in partition.items())
            for i in range(adds.num_rows)
        ]
        return [p for p, k in zip(adds.column("path").to_pylist(), keep, strict=True) if k]

    def commit(
        self,
        seq: int,
        files: Sequence[DataFile],
        partition: Mapping[str, str],
        ranges: Sequence[str],
        *,
        replace_partition: bool = False,
    ) -> bool:
        """Apply this writer's commit ``seq`` once: add ``files`` to ``partition``.

        :param replace_partition: remove the partition's current files in the same commit (a
            rerun of a date): readers see the old rows until then and the new ones after, never both.
        :return: True if this call applied it, False if the table had it already.
        :raises StoreUnavailableError: the table kept conflicting or failing (retryable: whether the
            commit landed is read again by the next try before anything is written).
        """
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError

        if set(partition) != set(self.partition_by):
            raise ValueError(f"partition {dict(partition)} does not name the table's columns {self.partition_by}")
        properties = CommitProperties(
            app_transactions=[Transaction(self.writer_id, seq)],
            custom_metadata=commit_metadata(self.writer_id, seq, ranges),
        )
        adds = [_add_action(f, partition) for f in files]

        def attempt() -> bool | None:
            self.fence()
            table = self._open()
            if table is None:
                if not adds:
                    return True  # no table, so no partition to empty
                return True if self._create(adds, properties) else None  # None: another writer created it
            if _applied(table, self.writer_id) >= seq:
                return False
            new_columns = self._check_schema(table)
            if new_columns:
                # A commit of its own, before the files': one that races another writer's commit
                # fails (delta-rs refuses a commit after a metadata change it did not read), and
                # the next attempt reads the table again and finds the columns added, by whichever
                # writer (a retry, or another date adding the same column).
                self._add_columns(table, new_columns)
                return None
            table.create_write_transaction(
                adds,
                mode="overwrite" if replace_partition else "append",
                # The table's own schema: the output's columns may be in another order (an added
                # column goes last); delta-rs reads the files' columns by name.
                schema=table.schema(),
                partition_by=self.partition_by,
                partition_filters=[(k, "=", v) for k, v in partition.items()] if replace_partition else None,
                commit_properties=properties,
            )
            return True

        return apply_once(attempt, (CommitFailedError,), f"table commit {seq} of writer {self.writer_id} to {self.uri}")

    def _open(self) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None

    def _create(self, adds: list[Any], properties: Any) -> bool:
        """Create the table with the first commit; False if another writer created it first."""
        from deltalake import Schema
        from deltalake.exceptions import DeltaError
        from deltalake.transaction import create_table_with_add_actions

        try:
            create_table_with_add_actions(
                self.uri,
                Schema.from_arrow(self.schema),
                adds,
                mode="error",
                partition_by=self.partition_by,
                storage_options=self.storage_options or None,
                commit_properties=properties,
            )
        except DeltaError:
            if self._open() is None:
                raise
            return False
        return True

    def _check_schema(self, table: Any) -> list[Any]:
        """The output's fields to add to the table (``add_columns``): none when it has the output's columns.

        :raises OutputSchemaError: the table's columns differ from the output's otherwise.
        """
        from deltalake import Schema

        if self.schema is None:
            return []
        output = Schema.from_arrow(self.schema)
        if table.schema() == output:
            return []
        # Delta's fields (type and nullability) decide; the error shows Arrow's types.
        found = {f.name: f for f in table.schema().fields}
        expected = {f.name: f for f in output.fields}
        shown = (_shown(pa.schema(table.schema().to_arrow())), _shown(self.schema))
        new = columns_to_add(
            f"Delta table {self.uri}",
            found,
            expected,
            add_columns=self.add_columns,
            not_null=[f.name for f in output.fields if not f.nullable],
            shown=shown,
        )
        return [expected[name] for name in new]

    def _add_columns(self, table: Any, fields: list[Any]) -> None:
        """Add ``fields`` (Delta fields, nullable) to the table's schema, in a commit of their own."""
        table.alter.add_columns(fields)


def _shown(schema: pa.Schema) -> dict[str, str]:
    """A schema's columns as errors name them: the type, and whether it may hold nulls when it may not."""
    return {f.name: str(f.type) + ("" if f.nullable else " not null") for f in schema}


def _applied(table: Any, writer_id: str) -> int:
    version = table.transaction_version(writer_id)
    return -1 if version is None else int(version)


def _add_action(file: DataFile, partition: Mapping[str, str]) -> Any:
    from deltalake.transaction import AddAction

    return AddAction(
        path=file.path,
        size=file.size,
        partition_values=dict(partition),
        modification_time=int(time.time() * 1000),
        data_change=True,
        stats=json.dumps({"numRecords": file.rows}),
    )
