"""A generation's table commits: ranges committed to its ledger join the table, each exactly once.

A table commit is decided before it is applied. Commit ``seq`` of a generation is first written
as an intent, ``_raybatch/table/<seq>.json`` in the generation's folder (created only if absent:
of two writers deciding the same number, one wins and both apply the winner's), naming its
ranges and their files; then it is applied (:meth:`.delta.DeltaTableWriter.commit`,
:meth:`.iceberg.IcebergTableWriter.commit`), which finds it in the table when it landed already.
A run starts by applying the intents it finds, in order, so a commit whose try crashed (or whose
reply was lost) is completed with the same files under the same number, never made twice.

Intent ``seq + 1`` is decided only once commit ``seq`` is in the table, so commits land in
order and "the writer's highest number in the table is at least ``seq``" means ``seq`` landed.
Only ranges recorded in the ledger (durable, their files in place) enter an intent, and a range
enters one intent at most.

Cadence: a run that appends (``mode="resume"``) commits every ``commit_interval`` seconds
(default a minute) whatever was recorded since the last, and once at its end. A minute keeps a
day's run to a few hundred commits at most, however small its ranges (the table's log and
metadata grow with each commit), and readers see the day grow by whole ranges. A generation
that replaces its partition (``mode="overwrite"``) commits once, at its end.
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord
from airflow_provider_raybatch.pipeline.commit.crash_points import crash_point
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.output_ref import OutputRef
from airflow_provider_raybatch.pipeline.store.files import create_file
from airflow_provider_raybatch.pipeline.store.urls import options_for
from airflow_provider_raybatch.pipeline.tables.staging import Generation, TableIntent, intent_path, intents
from airflow_provider_raybatch.pipeline.tables.writer_commits import DataFile

log = logging.getLogger(__name__)

Records = dict[str, CommitRecord]


class TableCommits:
    """Makes and applies a generation's table commits.

    Use it as a context manager around the stream of a run that appends: a thread then commits
    every ``commit_interval`` seconds what ``recorded()`` returns.

    :param ledger: the generation's ledger (fenced by the writer's lease).
    :param config: the run's settings (``config.table`` is set).
    :param generation: the generation.
    :param recorded: the ranges recorded in the ledger so far (range id -> commit record).
    """

    def __init__(
        self,
        ledger: OutputLedger,
        config: BatchInferenceConfig,
        generation: Generation,
        recorded: Callable[[], Records],
    ):
        assert config.table is not None
        self.ledger, self.config, self.table, self.generation = ledger, config, config.table, generation
        self.recorded = recorded
        self.intents: list[TableIntent] = []
        self._writer: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def catch_up(self) -> None:
        """Apply the intents that earlier tries left, in order (each is skipped if it landed)."""
        with self._lock:
            self.intents = []
            self._apply_new_intents()

    def commit(self, *, final: bool = False) -> None:
        """Commit the recorded ranges that no intent holds yet (a replacing generation: only when ``final``)."""
        with self._lock:
            if self._failure is not None:
                failure, self._failure = self._failure, None
                raise failure
            if self.generation.replace and not final:
                return
            records = self._to_commit()
            while records is not None:
                # The tasks of a mapped run share the generation's commits: apply what the others decided first.
                self._apply_new_intents()
                held = {range_id for intent in self.intents for range_id in intent.ranges}
                new = {range_id: r for range_id, r in records.items() if range_id not in held}
                with_files = {range_id: r for range_id, r in new.items() if r.data_files}
                # A replacing generation commits once even without rows: the partition is then emptied.
                if not with_files and not (self.generation.replace and not self.intents):
                    return
                intent = TableIntent(
                    len(self.intents), sorted(new), self._data_files(with_files), self.generation.replace
                )
                self.ledger.fence()
                path = intent_path(self.ledger.root, intent.seq)
                if not create_file(self.ledger.fs, path, intent.to_json()):
                    continue  # another task or try decided this number first: its commit is applied next
                crash_point("table_intent")
                self.intents.append(intent)
                self._apply(intent)

    def version(self) -> int | None:
        """The table's version (Delta) or current snapshot id (Iceberg) once this writer committed."""
        return None if self._writer is None else self._writer.version()

    def __enter__(self) -> TableCommits:
        if not self.generation.replace:
            self._thread = threading.Thread(target=self._commit_when_due, name="raybatch-table", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _commit_when_due(self) -> None:
        while not self._stop.wait(self.table.commit_interval):
            try:
                self.commit()
            except BaseException as e:  # noqa: BLE001 - raised on the driver's thread by the next commit()
                self._failure = e
                return

    def _to_commit(self) -> Records | None:
        """The ranges to commit: this run's recorded ones; for a mapped run's replacing generation,
        every range of the plan once all are recorded (None before: the last task to finish commits)."""
        if not (self.generation.replace and self.config.range_ids is not None):
            return self.recorded()
        records = self.ledger.committed()
        plan = self.ledger.load_plan()
        missing = [] if plan is None else [r for r in plan.range_ids() if r not in records]
        if missing:
            log.info(
                "%d range(s) of other shards of %s are not committed yet: the shard's task that "
                "finishes last replaces the table partition with all of them",
                len(missing),
                self.generation.writer_id,
            )
            return None
        return records

    def _apply_new_intents(self) -> None:
        """Read the intents decided since this writer last read them, and apply those, in order."""
        known = len(self.intents)
        self.intents += intents(self.ledger.fs, self.ledger.root, known)
        for n, intent in enumerate(self.intents):
            if intent.seq != n:
                seqs = [i.seq for i in self.intents]
                raise RuntimeError(f"table commit intents of {self.ledger.display_path} are not numbered 0..n: {seqs}")
        for intent in self.intents[known:]:
            self._apply(intent)

    def _apply(self, intent: TableIntent) -> None:
        writer = self._open_writer()
        applied = writer.commit(
            intent.seq, intent.files, self.table.partition, intent.ranges, replace_partition=intent.replace
        )
        crash_point("table_commit")
        rows = sum(f.rows for f in intent.files)
        verb = "replaced the partition with" if intent.replace else "added"
        log.info(
            "Table commit %d of %s %s %d range(s), %d row(s)%s",
            intent.seq,
            self.generation.writer_id,
            verb,
            len(intent.ranges),
            rows,
            "" if applied else " (found in the table: it had landed before)",
        )

    def _data_files(self, records: Records) -> list[DataFile]:
        """The records' data files, relative to the table's root, with their sizes and row counts."""
        fs, root = self.ledger.fs, self.ledger.root
        fs.invalidate_cache(root)
        # Files only: adlfs lists the staging's sub-folders (_raybatch/, _rejects/) with no size.
        entries = fs.ls(root, detail=True)
        sizes = {posixpath.basename(e["name"]): int(e["size"]) for e in entries if e.get("type") != "directory"}
        out = []
        for record in records.values():
            names = record.data_files
            for name in names:
                if len(names) == 1:
                    rows = record.rows
                else:  # a range that arrived in several blocks: its count is per range
                    with fs.open(f"{root}/{name}", "rb") as f:
                        rows = pq.ParquetFile(f).metadata.num_rows
                out.append(DataFile(f"{self.generation.relpath}/{name}", sizes[name], rows))
        return out

    def _open_writer(self) -> Any:
        if self._writer is None:
            self._writer = open_table_writer(
                OutputRef.of(self.config),
                self.generation.writer_id,
                self.ledger.recorded_schema("output"),
                self.ledger.fence,
                add_columns=self.table.add_columns,
            )
        return self._writer


def check_table_output(config: BatchInferenceConfig) -> None:
    """What can be checked of a table output before any work: its library, its store's credentials.

    :raises ConfigError: the extra is not installed, or the store's connection cannot be given to it.
    """
    assert config.table is not None
    package = {"delta": "deltalake", "iceberg": "pyiceberg"}[config.table.format]
    try:
        __import__(package)
    except ImportError:
        raise ConfigError(
            f"output_format={config.table.format!r} needs {package}: "
            f"pip install 'airflow-provider-raybatch[{config.table.format}]'"
        ) from None
    options = options_for(config.output_path, config.storage_options)
    if config.table.format == "delta":
        from airflow_provider_raybatch.pipeline.tables.delta_storage import delta_storage_options

        delta_storage_options(config.output_path, options)
    else:
        from airflow_provider_raybatch.pipeline.tables.iceberg_storage import file_io_properties

        file_io_properties(config.output_path, options)


def open_table_writer(
    output: OutputRef,
    writer_id: str = "",
    schema: pa.Schema | None = None,
    fence: Callable[[], None] = lambda: None,
    *,
    add_columns: bool = False,
) -> Any:
    """The :class:`.delta.DeltaTableWriter` or :class:`.iceberg.IcebergTableWriter` of the table
    ``output`` names (without ``writer_id``: to read the table only).

    :param add_columns: the writer may add the columns the table lacks (:attr:`.config.TableOutput.add_columns`).
    """
    path = output.path
    partition_by = list(output.partition)
    options = options_for(path, output.storage_options)
    if output.format == "delta":
        from airflow_provider_raybatch.pipeline.tables.delta import DeltaTableWriter
        from airflow_provider_raybatch.pipeline.tables.delta_storage import delta_storage_options

        return DeltaTableWriter(
            path,
            schema,
            partition_by,
            writer_id,
            delta_storage_options(path, options),
            fence=fence,
            add_columns=add_columns,
        )
    from airflow_provider_raybatch.pipeline.tables.iceberg import IcebergTableWriter, load_catalog
    from airflow_provider_raybatch.pipeline.tables.iceberg_storage import file_io_properties

    # pyiceberg names local files by URL: the table's files are found however the path was given.
    location = path if "://" in path else f"file://{os.path.abspath(path)}"
    # The files' store is reached with the output's credentials, unless the catalog's properties say otherwise.
    io = file_io_properties(path, options)
    return IcebergTableWriter(
        load_catalog({**io, **output.catalog}),
        output.identifier,
        location,
        schema,
        partition_by,
        writer_id,
        fence=fence,
        add_columns=add_columns,
    )
