"""Where a table output's rows wait before a table commit adds them, and which run writes them.

Layout under the table's root (Delta) or location (Iceberg), per partition and writer::

    <column>=<value>/<writer key>/_raybatch/lease/          the lease of every run of this writer on
                                                             this partition: one at a time, fenced
    <column>=<value>/<writer key>/_raybatch/leases/<key>/   the lease of one mapped shard's task
                                                             (its ranges), as for a folder output
    <column>=<value>/<writer key>/_raybatch/generation.json  the generation being written
    <column>=<value>/<writer key>/g<N>/                      generation N: a Parquet output of its own
                                                             (part files, ``_rejects/``, ``_raybatch/``
                                                             ledger) whose part files the table's
                                                             commits add where they are
    <column>=<value>/<writer key>/g<N>/_raybatch/table/<seq>.json
                                                             its table commits (:mod:`.table_commits`)

This module is the one that builds these paths: the writers (:mod:`.table_commits`, the run's
preparation) and the readers (:mod:`..status`, :mod:`.verify`) go through :func:`staged_writers`,
:func:`intents` and the functions below.

A generation is what one run (and its retries) writes for the partition. ``mode="resume"``
continues the current one (a first run makes ``g0``, whose commits append). ``mode="overwrite"``
from another run makes the next one, whose single commit replaces the partition at its end:
until then the table's readers see the previous generation's rows, whose files are left where
they are (the table's history still names them, for time travel; the table's own maintenance,
VACUUM or orphan-file removal, deletes them once it may). The folders starting with ``_`` are
hidden from both formats' maintenance and readers.

A mapped run (``plan_shards``) is one writer, its planning task's: that task chooses the
generation under the writer's lease and records its plan; each shard's task then takes the
lease of its ranges (the writer's lease and those exclude each other, as for a folder output)
and writes into that generation, which it checks is still the current one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import re
from dataclasses import asdict, dataclass
from typing import Any

from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.commit.ledger import META_DIR
from airflow_provider_raybatch.pipeline.config import TableOutput
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.store.files import exists, ls, read_json, write_json
from airflow_provider_raybatch.pipeline.tables.writer_commits import DataFile

log = logging.getLogger(__name__)

GENERATION_RECORD = "generation.json"
INTENTS_DIR = "table"


@dataclass(frozen=True)
class Generation:
    """The staging output of one run of a writer on a partition.

    :param number: N of ``g<N>``.
    :param relpath: its folder, relative to the table's root (``ds=2026-11-24/<writer key>/g0``).
    :param replace: its commit replaces the partition (it was started by ``mode="overwrite"``).
    :param writer_id: the id of its commits in the table (unique per table, partition, writer and
        generation; the same across the retries of its run).
    """

    number: int
    relpath: str
    replace: bool
    writer_id: str


@dataclass(frozen=True)
class StagedWriter:
    """A writer that staged rows for a partition, and the generation it writes now.

    :param relpath: its folder, relative to the table's root (``ds=2026-11-24/<writer key>``).
    :param generation: N of its current generation, ``g<N>``.
    """

    relpath: str
    generation: int

    @property
    def generation_relpath(self) -> str:
        """The current generation's folder (a Parquet output of its own), relative to the table's root."""
        return f"{self.relpath}/g{self.generation}"


@dataclass(frozen=True)
class TableIntent:
    """A table commit as decided (``_raybatch/table/<seq>.json`` of a generation).

    :param seq: its number in the generation (0, 1, ...: applied in this order).
    :param ranges: the range ids it adds.
    :param files: their data files, relative to the table's root.
    :param replace: it replaces the partition (a generation of ``mode="overwrite"``).
    """

    seq: int
    ranges: list[str]
    files: list[DataFile]
    replace: bool

    def to_json(self) -> bytes:
        """The intent's file content."""
        return json.dumps(asdict(self), sort_keys=True).encode()


def partition_folder(partition: dict[str, str]) -> str:
    """A table partition's folder, relative to the table's root (``ds=2026-11-24``)."""
    return "/".join(f"{column}={value}" for column, value in partition.items())


def staged_writers(fs: AbstractFileSystem, root: str, partition: dict[str, str]) -> list[StagedWriter]:
    """The writers that staged rows for ``partition`` under the table at ``root``, in the order of
    their folders' names (a folder without a generation record is no writer's)."""
    partition_dir = partition_folder(partition)
    writers = []
    for folder in sorted(ls(fs, f"{root}/{partition_dir}")):
        relpath = f"{partition_dir}/{posixpath.basename(folder.rstrip('/'))}"
        try:
            number = read_json(fs, f"{root}/{relpath}/{META_DIR}/{GENERATION_RECORD}")["number"]
        except (FileNotFoundError, NotADirectoryError):  # a file, or a folder of no writer
            continue
        writers.append(StagedWriter(relpath, number))
    return writers


def intent_path(generation_root: str, seq: int) -> str:
    """Where table commit ``seq`` of the generation at ``generation_root`` is decided."""
    return f"{generation_root}/{META_DIR}/{INTENTS_DIR}/{seq:08d}.json"


def intents(fs: AbstractFileSystem, generation_root: str, start: int = 0) -> list[TableIntent]:
    """The table commits decided for the generation at ``generation_root``, in order, from the
    ``start``-th (listed afresh)."""
    folder = f"{generation_root}/{META_DIR}/{INTENTS_DIR}"
    paths = sorted(p for p in ls(fs, folder) if p.endswith(".json"))
    found = []
    for path in paths[start:]:
        record = read_json(fs, path)
        files = [DataFile(**f) for f in record["files"]]
        found.append(TableIntent(record["seq"], record["ranges"], files, record["replace"]))
    return found


def writer_folder(table: TableOutput) -> str:
    """The writer's folder for the partition, relative to the table's root."""
    partition = partition_folder(table.partition)
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", table.writer).strip("_.")[:80]
    digest = hashlib.sha256(table.writer.encode()).hexdigest()[:8]
    return f"{partition}/{readable}-{digest}"


def open_generation(
    fs: AbstractFileSystem, root: str, table: TableOutput, mode: str, run_key: str | None, *, new: bool = False
) -> Generation:
    """The generation this run writes: the current one, or (``mode="overwrite"`` from another run,
    or ``new``) the next one.

    Called under the writer's lease: the choice and its record are this writer's alone.
    """
    record_path = _record_path(root, table)
    current = _current(fs, record_path)
    same_run = current is not None and run_key is not None and current["run_key"] == run_key
    if current is not None and not new and (mode != "overwrite" or same_run):
        return _generation(table, current)
    number = 0 if current is None else current["number"] + 1
    record = {"number": number, "run_key": run_key, "replace": mode == "overwrite"}
    if current is not None:
        log.info(
            "mode='overwrite': the rows of generation %d of %s stay in the table until generation %d replaces them",
            current["number"],
            writer_folder(table),
            number,
        )
    write_json(fs, record_path, record)
    return _generation(table, record)


def planned_generation(fs: AbstractFileSystem, root: str, table: TableOutput) -> Generation:
    """The generation a mapped shard's task writes: the one its planning task chose
    (``table.generation``), which must still be the writer's current one.

    :raises ConfigError: it is not (the planning task ran again since: its shards are another
        generation's), or nothing was planned.
    """
    current = _current(fs, _record_path(root, table))
    if current is None or current["number"] != table.generation:
        found = "none" if current is None else f"generation {current['number']}"
        raise ConfigError(
            f"this shard of table {root}, partition {table.partition}, writer {table.writer!r} was planned "
            f"for generation {table.generation}, and the writer's current one is {found}: the planning task "
            "ran again since (or never ran); rerun the planning task, then its shards' tasks"
        )
    return _generation(table, current)


def _record_path(root: str, table: TableOutput) -> str:
    return f"{root}/{writer_folder(table)}/{META_DIR}/{GENERATION_RECORD}"


def _current(fs: AbstractFileSystem, record_path: str) -> dict[str, Any] | None:
    return read_json(fs, record_path) if exists(fs, record_path) else None


def _generation(table: TableOutput, record: dict[str, Any]) -> Generation:
    relpath = f"{writer_folder(table)}/g{record['number']}"
    return Generation(record["number"], relpath, bool(record["replace"]), relpath)
