"""The driver's side of writing: each range committed once its files hold all its rows.

:class:`RangeCommits` receives only the metadata of the files the write steps wrote on the Ray
workers (:func:`.block_writer.write_block`) and commits a range through the ledger, which
publishes the files under their final names. A range that arrived in several blocks has its ids
checked as a key across them by reading back only the id column.

Records are batched: a range's files are published as soon as they are complete, and its commit
record is written with those of the ranges published around it, at most :func:`record_interval`
seconds later (and at once at the end of the stream, or when it fails). The range counts as
committed only then; a crash in between leaves its files published without a record, which the
next run removes before redoing the range. Batching keeps the ledger's objects few (a segment per
batch, not per range) at the price of redoing up to that interval's ranges after a crash. The
run's first range is recorded at once: its first result is safe without waiting for a batch.

When the stream fails (a stage raised on another range), the metadata in flight is lost with it,
but the write steps' receipts are there: the driver commits the ranges they complete
(:meth:`RangeCommits.salvage`), so a retry redoes only what was really unfinished.
"""

from __future__ import annotations

import logging
import posixpath
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_raybatch.pipeline.columns import COUNT_KEYS
from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord
from airflow_provider_raybatch.pipeline.commit.crash_points import crash_point
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.commit.output_schema import promotion_needed, schema_mismatch
from airflow_provider_raybatch.pipeline.config import ROW_ID_COLUMN, BatchInferenceConfig
from airflow_provider_raybatch.pipeline.errors import OutputSchemaError, RayBatchError, RowKeyError
from airflow_provider_raybatch.pipeline.execution.block_writer import OUTPUT, RECEIPT_SUFFIX, REJECTS, key_problem
from airflow_provider_raybatch.pipeline.planning.planner import Plan, RowRange
from airflow_provider_raybatch.pipeline.store.retries import seconds_from_env
from airflow_provider_raybatch.pipeline.summary import Progress

log = logging.getLogger(__name__)

#: Environment variable: the longest a published range waits for its commit record, in seconds
#: (0: each range is recorded as soon as it is published, in a segment of its own).
RECORD_INTERVAL_ENV = "RAYBATCH_RECORD_INTERVAL_S"
#: A second: what a crash can cost in redone ranges is small next to a task's start-up, and a
#: run of a million ranges writes a few segments a second rather than hundreds.
DEFAULT_RECORD_INTERVAL_S = 1.0
#: Records written in one segment at most: a burst of small ranges is recorded without waiting.
MAX_RECORDS_PER_BATCH = 1000


def record_interval() -> float:
    """:data:`DEFAULT_RECORD_INTERVAL_S`, or the value of :data:`RECORD_INTERVAL_ENV`."""
    return seconds_from_env(RECORD_INTERVAL_ENV, DEFAULT_RECORD_INTERVAL_S)


@dataclass
class _Arrived:
    """The files of one range received so far."""

    files: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {OUTPUT: [], REJECTS: []})
    blocks: set[str] = field(default_factory=set)
    rows: int = 0
    rejected: int = 0
    engine_errors: int = 0
    #: The sums of the counted columns over its rows, by key (None: no file counted any).
    counts: dict[str, int | None] = field(default_factory=lambda: dict.fromkeys(COUNT_KEYS))


class RangeCommits:
    """Collects the write steps' metadata; publishes each range when its files hold all its rows,
    and records the published ranges in batches (:meth:`flush`).

    Use it as a context manager around the stream: a thread then writes the records of ranges
    published :func:`record_interval` seconds ago even while no metadata arrives, and the records
    still pending are written on the way out.
    """

    def __init__(
        self,
        ledger: OutputLedger,
        plan: Plan,
        progress: Progress,
        config: BatchInferenceConfig,
        committed: dict[str, CommitRecord] | None = None,
    ):
        self.ledger, self.plan, self.progress, self.config = ledger, plan, progress, config
        #: The ranges recorded (range id -> commit record): ``committed`` before the run, and those since.
        self._records: dict[str, CommitRecord] = dict(committed or {})
        self.interval = record_interval()
        #: Published ranges waiting for their record: (plan index, record), oldest first.
        self.pending: list[tuple[int, CommitRecord]] = []
        self._pending_since = 0.0
        self._first_recorded = False
        self._lock = threading.RLock()  # the driver's thread and the flushing thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None  # a flush that failed on the flushing thread
        self.arrived: dict[int, _Arrived] = defaultdict(_Arrived)
        self.blocks_seen: set[str] = set()
        self.schemas: dict[str, pa.Schema] = {}  # kind -> recorded schema, once read or recorded
        self.stage = config.stages[-1].display_name
        #: Bytes of the files written (data and rejects), and of the metadata received for them.
        self.file_bytes = self.metadata_bytes = 0

    def write_step_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`write_block` for this output."""
        id_column = self.config.id_column
        self.ledger.fs.makedirs(self.ledger.tmp_dir, exist_ok=True)
        return {
            "fs": self.ledger.fs,
            "folder": self.ledger.tmp_dir,
            "output_path": self.config.output_path,
            "stage": self.stage,
            "id_column": id_column,
            "key_type": None if id_column is None else self.plan.schema.field(id_column).type,
            "partition": None if self.config.table is None else self.config.table.partition,
        }

    def __enter__(self) -> RangeCommits:
        if self.interval > 0:
            self._thread = threading.Thread(target=self._flush_when_due, name="raybatch-records", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc_type is None:
            self.flush()
            return
        try:  # the ranges published before the failure are kept; its error is the one to report
            self.flush()
        except Exception as e:  # noqa: BLE001
            log.warning("Could not record the ranges published before the failure: %s", e)

    def _flush_when_due(self) -> None:
        while not self._stop.wait(min(self.interval, 1.0) / 4):
            with self._lock:
                if self.pending and time.monotonic() - self._pending_since >= self.interval:
                    try:
                        self.flush()
                    except BaseException as e:  # noqa: BLE001 - raised on the driver's thread
                        self._failure = e
                        return

    def flush(self) -> None:
        """Write the records of the published ranges (one segment): they are committed now."""
        with self._lock:
            if self._failure is not None:
                failure, self._failure = self._failure, None
                raise failure
            if not self.pending:
                return
            batch, self.pending = self.pending, []
            # As written: their commit time is the one the output's status measures rates by.
            written = self.ledger.record([record for _, record in batch])
            self._records.update((record.range_id, record) for record in written)
            self._first_recorded = True
            for (index, _), record in zip(batch, written, strict=True):
                crash_point("committed")
                self.progress.committed(index, record)
            self.progress.check_errors(self.config.max_error_fraction, self.ledger.display_path, final=False)

    def recorded(self) -> dict[str, CommitRecord]:
        """The ranges recorded so far, range id -> commit record (a copy: for another thread)."""
        with self._lock:
            return dict(self._records)

    def _published(self, index: int, record: CommitRecord) -> None:
        with self._lock:
            if not self.pending:
                self._pending_since = time.monotonic()
            self.pending.append((index, record))
            if self.interval == 0 or not self._first_recorded or len(self.pending) >= MAX_RECORDS_PER_BATCH:
                self.flush()

    def add(self, metadata: pa.Table) -> None:
        """Take in the metadata of files written; publish the ranges they complete."""
        with self._lock:
            if self._failure is not None:
                self.flush()  # raises it
            self._add(metadata)

    def _add(self, metadata: pa.Table) -> None:
        self.metadata_bytes += metadata.nbytes
        for file in metadata.to_pylist():
            index = file["range"]
            row_range = self.plan.ranges[index]
            if file["problem"]:
                raise RowKeyError(
                    f"{file['problem']}. Found in range {row_range.id} (rows {row_range.start}-{row_range.end} of "
                    f"{self._source(row_range)!r}); nothing of the range is committed"
                )
            self.blocks_seen.add(file["block"])
            arrived = self.arrived[index]
            arrived.files[file["kind"]].append(file)
            arrived.blocks.add(file["block"])
            self.progress.rows_written += file["rows"]
            if file["kind"] == OUTPUT:
                arrived.rows += file["rows"]
            else:
                arrived.rejected += file["rows"]
                arrived.engine_errors += file["engine_errors"]
            for key in COUNT_KEYS:  # .get: receipts written before a count existed lack it
                if file.get(key) is not None:
                    arrived.counts[key] = (arrived.counts[key] or 0) + file[key]
            self.file_bytes += file["bytes"]
            received = arrived.rows + arrived.rejected
            if received > row_range.rows:
                raise RayBatchError(f"range {row_range.id} received {received} rows but holds {row_range.rows}")
            if received == row_range.rows:
                self._commit(index, self.arrived.pop(index))

    def commit_empty(self, index: int, keep: list[str]) -> None:
        """Commit a range without rows (an empty input file)."""
        row_range = self.plan.ranges[index]
        files = []
        if self.plan.input_rows == 0 and row_range.file_index == 0:
            # An output with no rows still gets one (empty) file so that any Parquet reader opens it.
            fields = [pa.field(ROW_ID_COLUMN, pa.int64())] if self.config.id_column is None else []
            schema = pa.schema(fields + [self.plan.schema.field(c) for c in keep])
            if self.config.table is not None:
                schema = pa.schema([*schema, *(pa.field(c, pa.string()) for c in self.config.table.partition)])
            files.append(self.ledger.tmp_file(row_range.id))
            with self.ledger.fs.open(files[0], "wb") as f:
                pq.write_table(schema.empty_table(), f)
        self._published(index, self.ledger.publish(row_range.id, files, 0))

    def salvage(self) -> None:
        """After the stream failed: commit the ranges completed by files whose metadata never arrived.

        Never raises: the stream's own error is the one to report.
        """
        fs, folder = self.ledger.fs, self.ledger.tmp_dir
        committed = self.progress.done + len(self.pending)
        try:
            fs.invalidate_cache(folder)
            for path in sorted(fs.ls(folder, detail=False)):
                name = posixpath.basename(path)
                if not name.endswith(RECEIPT_SUFFIX) or name[len("block-") : -len(RECEIPT_SUFFIX)] in self.blocks_seen:
                    continue
                with fs.open(path, "rb") as f:
                    self.add(pa.ipc.open_file(f).read_all())
            self.flush()
        except Exception as e:  # noqa: BLE001 - the run is failing already; its retry redoes the rest
            log.warning("Could not commit every range written before the failure: %s", e)
        if self.progress.done > committed:
            log.info("Committed %d range(s) written before the failure", self.progress.done - committed)

    def check_done(self) -> None:
        """After the stream: every range it carried must have been committed (and is recorded now)."""
        self.flush()
        if self.arrived:
            short = [self.plan.ranges[i].id for i in self.arrived]
            raise RayBatchError(f"the stream ended before ranges {short} were complete")

    def _commit(self, index: int, arrived: _Arrived) -> None:
        row_range = self.plan.ranges[index]
        if self.config.id_column is not None and len(arrived.blocks) > 1:
            self._check_key_across_blocks(arrived, row_range)
        paths = {
            kind: [
                self._conform(f["path"], pa.ipc.read_schema(pa.py_buffer(f["schema"])), kind, row_range) for f in files
            ]
            for kind, files in arrived.files.items()
        }
        record = self.ledger.publish(
            row_range.id,
            paths[OUTPUT],
            arrived.rows,
            paths[REJECTS],
            arrived.rejected,
            arrived.engine_errors,
            counts=arrived.counts,
        )
        self._published(index, record)

    def _check_key_across_blocks(self, arrived: _Arrived, row_range: RowRange) -> None:
        """A range's ids are a key across its blocks' files (each block's were checked where it was written)."""
        id_column = self.config.id_column
        key_type = self.plan.schema.field(id_column).type
        ids = []
        for files in arrived.files.values():
            for file in files:
                with self.ledger.fs.open(file["path"], "rb") as f:
                    ids.append(pq.read_table(f, columns=[id_column]).column(id_column).cast(key_type))
        if problem := key_problem(ids, id_column):
            raise RowKeyError(
                f"{problem}. Found in range {row_range.id} (rows {row_range.start}-{row_range.end} of "
                f"{self._source(row_range)!r}); nothing of the range is committed"
            )

    def _source(self, row_range: RowRange) -> str:
        return self.plan.files[row_range.file_index].path

    def _recorded(self, kind: str, schema: pa.Schema, row_range: RowRange) -> pa.Schema:
        """The output's recorded schema of ``kind`` (recording ``schema`` if none is), checked against ``schema``."""
        if kind not in self.schemas:
            self.schemas[kind] = self.ledger.recorded_schema(kind) or self.ledger.record_schema(kind, schema)
        recorded = self.schemas[kind]
        if problem := schema_mismatch(recorded, schema):
            what = f"stage {self.stage!r}" if kind == OUTPUT else "the rejects of stage " + repr(self.stage)
            raise OutputSchemaError(
                f"{what} returned range {row_range.id} with a schema other than the one the output's committed "
                f"ranges have ({self.ledger.display_path}): {problem}. Nothing of the range is committed; a stage "
                "must return the same columns and types for every batch (fix it, then rerun with mode='overwrite')"
            )
        return recorded

    def _conform(self, path: str, schema: pa.Schema, kind: str, row_range: RowRange) -> str:
        """Check a written file against the recorded schema; rewrite it if it needs a promotion.

        The promotion (a column of type null in this file) is rare; only then does the driver
        read the file's rows.
        """
        recorded = self._recorded(kind, schema, row_range)
        if not promotion_needed(recorded, schema):
            return path
        with self.ledger.fs.open(path, "rb") as f:
            table = pq.read_table(f).cast(recorded)
        promoted = self.ledger.tmp_file(row_range.id)
        with self.ledger.fs.open(promoted, "wb") as f:
            pq.write_table(table, f)
        self.ledger.fence()  # a fenced writer removes nothing, not even a file of its own
        self.ledger.fs.rm(path)
        return promoted
