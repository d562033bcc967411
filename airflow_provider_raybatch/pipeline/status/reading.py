"""An output an :class:`.output_ref.OutputRef` names, read: its status per writer, its rejects, the
verifier's faults. The one place that tells a Parquet folder from a table's partition (the command
line and the UI plugin call these, whatever the output)."""

from __future__ import annotations

from collections.abc import Callable

from airflow_provider_raybatch.pipeline.commit.verify import verify_output
from airflow_provider_raybatch.pipeline.config import DEFAULT_LEASE_TIMEOUT_S
from airflow_provider_raybatch.pipeline.output_ref import OutputRef
from airflow_provider_raybatch.pipeline.status.output_status import (
    OutputStatus,
    read_status,
    read_table_status,
    table_writers,
)
from airflow_provider_raybatch.pipeline.status.rejects import RejectsSample, read_rejects
from airflow_provider_raybatch.pipeline.store.files import resolve


def read_output(
    output: OutputRef,
    *,
    lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S,
    now: float | None = None,
    detail: bool = False,
) -> list[OutputStatus]:
    """The status of a Parquet output (one), or of each writer that staged rows for a table's partition.

    :param output: the output.
    :param lease_timeout_s: for a lease recorded without its holder's timeout (:func:`.read_status`).
    :param now: the time to measure ages against (default: the clock).
    :param detail: with the input plan per file and which ranges are committed.
    :raises OutputNotFoundError: nothing of this provider there.
    """
    if output.is_table:
        return read_table_status(
            output.path,
            output.partition,
            output.storage_options,
            lease_timeout_s=lease_timeout_s,
            now=now,
            detail=detail,
        )
    return [read_status(output.path, output.storage_options, lease_timeout_s=lease_timeout_s, now=now, detail=detail)]


def read_output_rejects(output: OutputRef, limit: int | None = 20) -> list[RejectsSample]:
    """The rejects of a Parquet output, or of each writer of a table's partition (:func:`.read_rejects`).

    :param limit: rows to read at most, per writer (None: all of them).
    :raises OutputNotFoundError: nothing of this provider there.
    """
    if not output.is_table:
        return [read_rejects(output.path, output.storage_options, limit)]
    # Only where each writer's rows are: its status (every commit record) is not needed for that.
    fs, root = resolve(output.path, output.storage_options)
    table_root = output.path.rstrip("/")
    return [
        read_rejects(f"{table_root}/{w.generation_relpath}", output.storage_options, limit)
        for w in table_writers(fs, root, output.path, output.partition)
    ]


def verify(
    output: OutputRef,
    progress: Callable[[int, int], None] | None = None,
    warnings: list[str] | None = None,
) -> list[str]:
    """The verifier's faults of the output (empty: none): :func:`.commit.verify.verify_output` of a
    Parquet output, :func:`.tables.verify.verify_table` of a table's partition.

    :param progress: told of the files read.
    :param warnings: a Parquet output's warnings are added to it (worth knowing, no fault).
    """
    if output.is_table:
        from airflow_provider_raybatch.pipeline.tables.verify import verify_table

        return verify_table(output, progress)
    return verify_output(output.path, output.storage_options, progress, warnings)
