"""Apache Iceberg table commits, each applied exactly once (``pyiceberg``, any catalog it supports).

The same contract as :class:`.delta.DeltaTableWriter`: a writer adds files already written under
the table's location in commits numbered 0, 1, 2... Iceberg has no transaction id, so each
snapshot a writer makes carries its id and number in the snapshot summary, and the writer's
applied number is the highest one among the current snapshot's ancestors. It is read before
every attempt: a commit whose reply was lost, or a resumed run, finds its number applied.

A catalog commit is a compare-and-swap of the table's metadata location: a writer that loses a
race (``CommitFailedException``) or whose replacement conflicts with another writer's files of the
same partition (``ValidationException``) reads the table again and goes on. A partition's
replacement removes its files and adds the new ones in one snapshot (operation ``overwrite``) of
one catalog commit: every snapshot of the table's history, not only the current one, holds the
partition's old rows or its new ones, never both and never none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from airflow_provider_raybatch.pipeline.errors import OutputSchemaError
from airflow_provider_raybatch.pipeline.tables.iceberg_storage import OBJECT_PROPERTIES
from airflow_provider_raybatch.pipeline.tables.writer_commits import (
    SEQ_KEY,
    WRITER_KEY,
    DataFile,
    apply_once,
    columns_error,
    columns_to_add,
    commit_metadata,
)

#: Properties of a table this writer creates. Each Iceberg commit writes the whole table metadata
#: anew, with the list of every earlier metadata file: without a bound the metadata folder grows
#: with the square of the commits (996 one-file commits: 372 MiB, 0.7 s a commit at the end).
TABLE_PROPERTIES = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}


class IcebergTableWriter:
    """One writer's commits to an Iceberg table with identity partitions on ``partition_by``.

    :param catalog: a pyiceberg catalog (e.g. ``SqlCatalog``).
    :param identifier: the table's identifier (``namespace.table``); the namespace and the table
        are created on the first commit if missing.
    :param location: where the writer's files are (``file://``, ``s3://``...): the commits' file
        paths are relative to it, and a table created here gets it as its location.
    :param schema: the table's schema, partition columns included.
    :param partition_by: the partition columns; each data file holds one value of each (Iceberg
        reads a file's partition from its column statistics).
    :param writer_id, fence, add_columns: as for :class:`.delta.DeltaTableWriter`.
    """

    def __init__(
        self,
        catalog: Any,
        identifier: str,
        location: str,
        schema: pa.Schema | None,
        partition_by: Sequence[str],
        writer_id: str,
        *,
        fence: Callable[[], None] = lambda: None,
        add_columns: bool = False,
    ):
        self.catalog, self.identifier, self.location, self.schema = catalog, identifier, location.rstrip("/"), schema
        self.partition_by, self.writer_id, self.fence = list(partition_by), writer_id, fence
        self.add_columns = add_columns

    def applied(self) -> int:
        """The highest commit number of this writer in the table's current history; -1 for none."""
        table = self._load()
        return -1 if table is None else self._applied(table)

    def version(self) -> int | None:
        """The id of the table's current snapshot (None: no table or no snapshot yet)."""
        table = self._load()
        snapshot = None if table is None else table.current_snapshot()
        return None if snapshot is None else int(snapshot.snapshot_id)

    def partition_files(self, partition: Mapping[str, str]) -> list[str]:
        """The files of ``partition`` in the table's current snapshot, relative to ``location``
        (a file elsewhere keeps its full path)."""
        table = self._load()
        if table is None:
            return []
        return [f.file_path.removeprefix(f"{self.location}/") for f in _partition_files(table, partition)]

    def commit(
        self,
        seq: int,
        files: Sequence[DataFile],
        partition: dict[str, str],
        ranges: Sequence[str],
        *,
        replace_partition: bool = False,
    ) -> bool:
        """As :meth:`.delta.DeltaTableWriter.commit`; ``files`` are relative to ``location``."""
        from pyiceberg.exceptions import CommitFailedException, ValidationException

        properties = commit_metadata(self.writer_id, seq, ranges)
        paths = [f"{self.location}/{f.path}" for f in files]

        def attempt() -> bool | None:
            self.fence()
            table = self._load()
            if table is None:
                if not files:
                    return True  # no table, so no partition to empty
                table = self._create()
            if self._applied(table) >= seq:
                return False
            new_columns = self._check_schema(table)
            if new_columns:
                # A catalog commit of its own, before the files': one that races another writer's
                # schema change fails (CommitFailedException: the schema it read is not current),
                # and the next attempt reads the table again and finds the columns added.
                self._add_columns(table, new_columns)
                return None
            _without_retries(table)
            with table.transaction() as tx:
                if replace_partition:
                    self._replace(table, tx, partition, paths, properties)
                elif files:
                    # No scan of every file of the table for duplicates (pyiceberg's default): a
                    # file joins the table only through its range's one commit, checked above.
                    tx.add_files(
                        paths,
                        snapshot_properties=properties,
                        check_duplicate_files=False,
                    )
            return True

        conflicts = (CommitFailedException, ValidationException)
        return apply_once(attempt, conflicts, f"table commit {seq} of writer {self.writer_id} to {self.identifier}")

    def snapshots_of(self, seq: int) -> list[str]:
        """The operations of the snapshots among the current snapshot's ancestors that carry this
        writer's commit ``seq``, oldest first: one for a commit this writer made (none once expired)."""
        from pyiceberg.table.snapshots import ancestors_of

        table = self._load()
        if table is None:
            return []
        return [
            str(s.summary.operation.value)
            for s in reversed(list(ancestors_of(table.current_snapshot(), table.metadata)))
            if s.summary is not None
            and s.summary.get(WRITER_KEY) == self.writer_id
            and s.summary.get(SEQ_KEY) == str(seq)
        ]

    def _replace(
        self, table: Any, tx: Any, partition: Mapping[str, str], paths: list[str], properties: dict[str, str]
    ) -> None:
        """Stage in ``tx`` the replacement of ``partition``'s files by ``paths``, in ONE snapshot
        (operation ``overwrite``; ``append`` on a table without snapshots).

        Not pyiceberg's ``delete`` then ``add_files``: in one transaction they make two snapshots, a
        DELETE in which the partition is empty, then an APPEND. Readers of the current snapshot never
        see the first, but time travel, incremental readers walking the snapshots and change-data
        consumers would see the date vanish.
        """
        from pyiceberg.io.pyarrow import parquet_file_to_data_file
        from pyiceberg.table import TableProperties
        from pyiceberg.utils.concurrent import ExecutorFactory

        if tx.table_metadata.name_mapping() is None:
            # As add_files does: the files carry no field ids, and are read by the columns' names.
            mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
            tx.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING: mapping})
        metadata = tx.table_metadata
        new = list(
            ExecutorFactory.get_or_create().map(lambda p: parquet_file_to_data_file(table.io, metadata, p), paths)
        )
        with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
            for old in _partition_files(table, partition):
                overwrite.delete_data_file(old)
            for data_file in new:
                overwrite.append_data_file(data_file)

    def _applied(self, table: Any) -> int:
        from pyiceberg.table.snapshots import ancestors_of

        mine = [
            int(s.summary[SEQ_KEY])
            for s in ancestors_of(table.current_snapshot(), table.metadata)
            if s.summary is not None and s.summary.get(WRITER_KEY) == self.writer_id
        ]
        return max(mine, default=-1)

    def _load(self) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            return None

    def _create(self) -> Any:
        # Writers of several dates create them at once: a creation that fails is fine when the
        # namespace or table exists now (the SQL catalog reports a namespace created meanwhile as
        # a database IntegrityError, not as NamespaceAlreadyExistsError).
        namespace = self.identifier.rsplit(".", 1)[0]
        try:
            self.catalog.create_namespace(namespace)
        except Exception:
            if not self.catalog.namespace_exists(namespace):
                raise
        try:
            # The table and its partition spec in one catalog commit: no writer sees it unpartitioned.
            with (
                self.catalog.create_table_transaction(
                    self.identifier, schema=self.schema, location=self.location, properties=TABLE_PROPERTIES
                ) as tx,
                tx.update_spec() as spec,
            ):
                for column in self.partition_by:
                    spec.add_identity(column)
        except Exception:
            if not self.catalog.table_exists(self.identifier):
                raise
        return self.catalog.load_table(self.identifier)

    def _check_schema(self, table: Any) -> list[pa.Field]:
        """The output's fields to add to the table (``add_columns``): none when it has the output's columns.

        :raises OutputSchemaError: the table's columns differ from the output's otherwise.
        """
        if self.schema is None:
            return []
        found = {f.name: _type_name(f.type) for f in table.schema().as_arrow()}
        expected = {f.name: _type_name(f.type) for f in self.schema}
        new = columns_to_add(
            f"Iceberg table {self.identifier}",
            found,
            expected,
            add_columns=self.add_columns,
            not_null=[f.name for f in self.schema if not f.nullable],
        )
        return [self.schema.field(name) for name in new]

    def _add_columns(self, table: Any, fields: list[pa.Field]) -> None:
        """Add ``fields`` to the table's schema (optional columns: the rows so far read null in them).

        pyiceberg extends the table's name mapping (``schema.name-mapping.default``) in the same
        commit: the files added by ``add_files`` carry no field ids, and are read by those names.
        """
        from pyiceberg.io.pyarrow import UnsupportedPyArrowTypeException

        tx = table.transaction()
        try:
            with tx.update_schema() as update:
                update.union_by_name(pa.schema(fields))
        except (UnsupportedPyArrowTypeException, TypeError, ValueError) as e:  # a type Iceberg has not
            raise OutputSchemaError(
                f"the output's column(s) {[f.name for f in fields]} cannot be added to the Iceberg table "
                f"{self.identifier}: {e}"
            ) from e
        # A type that Iceberg would keep as another (uint64 as int64, a dictionary as its values)
        # would leave the table with a column no run can write: refused before the commit.
        staged = {f.name: _type_name(f.type) for f in tx.table_metadata.schema().as_arrow()}
        expected = {f.name: _type_name(f.type) for f in fields}
        wrong = [f.name for f in fields if staged.get(f.name) != expected[f.name]]
        if wrong:
            raise columns_error(f"Iceberg table {self.identifier} (as it would keep them)", staged, expected, wrong)
        tx.commit_transaction()


def load_catalog(properties: Mapping[str, Any]) -> Any:
    """The pyiceberg catalog of ``properties`` (``name`` names it; the rest are pyiceberg's
    properties, e.g. ``type="sql"``, ``uri``, ``warehouse``, ``s3.endpoint``, and the FileIO's
    from :func:`.iceberg_storage.file_io_properties`).

    :param properties: the properties; values are made text (a connection's extra may hold numbers),
        but for the FileIO's credential objects and flags (:data:`.iceberg_storage.OBJECT_PROPERTIES`),
        which fsspec's FileIO hands to gcsfs / adlfs as they are.
    """
    from pyiceberg.catalog import load_catalog as load

    properties = {k: v if k in OBJECT_PROPERTIES and not isinstance(v, str) else str(v) for k, v in properties.items()}
    name = properties.pop("name", "raybatch")
    try:
        return load(name, **properties)
    except Exception as e:
        # The SQL catalog creates its own tables when it opens a new database: tasks of a backfill
        # opening it at once race, and all but one are told the tables "already exist". They do now.
        if "already exists" not in str(e):
            raise
        return load(name, **properties)


def _partition_files(table: Any, partition: Mapping[str, str]) -> list[Any]:
    """The data files (pyiceberg's ``DataFile``) of ``partition`` in ``table``'s current snapshot."""
    from pyiceberg.expressions import AlwaysTrue, And, EqualTo

    if table.current_snapshot() is None:
        return []
    where: Any = AlwaysTrue()
    for column, value in partition.items():
        where = And(where, EqualTo(column, value))
    return [task.file for task in table.scan(row_filter=where).plan_files()]


def _without_retries(table: Any) -> None:
    """Turn off pyiceberg's own retries of a commit that lost a race, for this table object.

    pyiceberg rebases a commit that lost to another writer's and sends it again without asking
    whether its number landed meanwhile (another try of the same generation may have landed it):
    the retry is :func:`.writer_commits.apply_once`'s, which reads the table first. Only this
    process's copy of the metadata changes; the table's properties stay as they are.
    """
    from pyiceberg.table import TableProperties

    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    table.metadata = table.metadata.model_copy(update={"properties": properties})


def _type_name(t: pa.DataType) -> str:
    """An Arrow type as Iceberg keeps it: one string, one binary and one list type; no narrow integers."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t) or pa.types.is_string(t):
        return "string"
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t) or pa.types.is_binary(t):
        return "binary"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t):
        return f"list<{_type_name(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{_type_name(t.key_type)}, {_type_name(t.item_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{f.name}: {_type_name(f.type)}" for f in t) + ">"
    if t in (pa.int8(), pa.int16(), pa.uint8(), pa.uint16()):
        return "int32"
    if t == pa.uint32():
        return "int64"
    return str(t)
