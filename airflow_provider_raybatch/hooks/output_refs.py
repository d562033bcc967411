"""An output named by a task's arguments (the UI plugin) or the command line's flags, with its
connections resolved: :func:`resolve_output`, the one place a reader's credentials come from.

Airflow is imported only when a connection is named (the command line reads an output with the
environment's credentials without Airflow's configuration).
"""

from __future__ import annotations

from typing import Any

from airflow_provider_raybatch.pipeline.output_ref import OutputRef


def resolve_output(
    path: str,
    output_format: str = "parquet",
    partition: dict[str, str] | None = None,
    identifier: str | None = None,
    catalog: dict[str, Any] | None = None,
    *,
    aws_conn_id: str | None = None,
    gcp_conn_id: str | None = None,
    azure_conn_id: str | None = None,
    iceberg_conn_id: str | None = None,
) -> OutputRef:
    """The output, with its stores' fsspec options and (Iceberg) its catalog's properties.

    :param path: the output folder, or a table's root (Delta) or location (Iceberg).
    :param output_format: ``parquet``, ``delta`` or ``iceberg``.
    :param partition: a table output's partition (column -> value).
    :param identifier: an Iceberg output's table, ``namespace.table``.
    :param catalog: the Iceberg catalog's properties as given; None: those of ``iceberg_conn_id``
        (or the embedded default catalog), as the operators resolve them.
    :param aws_conn_id: the connection whose credentials read ``s3://`` (likewise ``gcp_conn_id``,
        ``azure_conn_id``); none: the environment's credentials.
    :param iceberg_conn_id: the Iceberg catalog's connection.
    :raises ConfigError: a connection that does not resolve (the message names it).
    """
    options = None
    if aws_conn_id or gcp_conn_id or azure_conn_id:
        from airflow_provider_raybatch.hooks.object_stores import storage_options

        options = storage_options(aws_conn_id, gcp_conn_id, azure_conn_id)
    if catalog is None and output_format == "iceberg":
        from airflow_provider_raybatch.hooks.iceberg_catalog import IcebergCatalogHook

        catalog = IcebergCatalogHook(iceberg_conn_id).catalog_properties()
    return OutputRef(path, output_format, partition or {}, identifier, catalog or {}, options)
