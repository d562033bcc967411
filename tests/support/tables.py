"""Table outputs in tests: a config writing a Delta or Iceberg table, and the table read back by
another reader than the one that wrote it (DuckDB's Parquet reader over the files that the
table's current snapshot names)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, TableOutput
from tests.support.pipeline_runs import config

IDENTIFIER = "predictions.scores"
FORMATS = ("delta", "iceberg")


def catalog_properties(tmp_path: Path) -> dict[str, str]:
    """The SQL catalog on SQLite, as the provider's embedded default sets it up."""
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}


def table_output(
    tmp_path: Path, fmt: str, ds: str = "2026-11-24", writer: str = "daily.score", **kwargs
) -> TableOutput:
    return TableOutput(
        fmt,
        {"ds": ds},
        writer,
        identifier=IDENTIFIER if fmt == "iceberg" else None,
        catalog=catalog_properties(tmp_path) if fmt == "iceberg" else {},
        **kwargs,
    )


def table_config(tmp_path: Path, fmt: str, ds: str = "2026-11-24", **kwargs) -> BatchInferenceConfig:
    """A run of ``tests.support.predictors:score`` writing date ``ds`` of a table at ``<tmp>/table``."""
    table = table_output(tmp_path, fmt, ds, **kwargs.pop("table_kwargs", {}))
    return config(tmp_path, **{"output_path": str(tmp_path / "table"), "table": table, **kwargs})


def table_spec(cfg: BatchInferenceConfig) -> dict[str, Any]:
    """``cfg.table`` as :func:`.pipeline_runs.run_in_subprocess` passes it on (the catalog included)."""
    return dataclasses.asdict(cfg.table)


def snapshot_files(tmp_path: Path, fmt: str, catalog: dict[str, str] | None = None) -> list[str]:
    """The data files of the table's current snapshot, as its log or metadata names them.

    :param catalog: the Iceberg catalog (default: :func:`catalog_properties`).
    """
    root = tmp_path / "table"
    if fmt == "delta":
        from deltalake import DeltaTable

        adds = DeltaTable(str(root)).get_add_actions(flatten=True)
        return [str(root / p) for p in pa.table(adds).column("path").to_pylist()]
    from airflow_provider_raybatch.pipeline.tables.iceberg import load_catalog

    table = load_catalog(catalog or catalog_properties(tmp_path)).load_table(IDENTIFIER)
    return [task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()]


def read_table(tmp_path: Path, fmt: str, ds: str | None = None, catalog: dict[str, str] | None = None) -> pa.Table:
    """The table's rows (of date ``ds``), read by DuckDB from the files of its current snapshot."""
    import duckdb

    files = snapshot_files(tmp_path, fmt, catalog)
    if not files:
        return pa.table({})
    with duckdb.connect() as db:
        # The file's own ds column, not one made up from the path's ds=... folder; columns matched
        # by name, as the table's readers do: a column added to the table reads null in older files.
        rows = db.read_parquet(files, hive_partitioning=False, union_by_name=True).to_arrow_table()
    rows = pa.table(rows)
    return rows if ds is None else rows.filter(pc.equal(rows["ds"], ds))


def history(tmp_path: Path, fmt: str, ds: str, catalog: dict[str, str] | None = None) -> list[pa.Table]:
    """The rows of date ``ds`` at every version (Delta) or snapshot (Iceberg) in the table's log, oldest
    first, as time travel reads them (by the table's own library)."""
    root = tmp_path / "table"
    if fmt == "delta":
        from deltalake import DeltaTable

        versions = range(DeltaTable(str(root)).version() + 1)
        tables = [DeltaTable(str(root), version=v).to_pyarrow_table() for v in versions]
    else:
        from airflow_provider_raybatch.pipeline.tables.iceberg import load_catalog

        table = load_catalog(catalog or catalog_properties(tmp_path)).load_table(IDENTIFIER)
        tables = [table.scan(snapshot_id=s.snapshot_id).to_arrow() for s in table.snapshots()]
    return [t.filter(pc.equal(t["ds"], ds)) for t in tables]
