"""OpenLineage datasets of a run, following OpenLineage's dataset naming conventions.

The OpenLineage provider is optional: it is imported only when lineage is asked for, and
without it :func:`operator_lineage` returns None.
"""

from __future__ import annotations

import posixpath
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_raybatch.pipeline.store.files import GLOB_CHARS
from airflow_provider_raybatch.pipeline.store.urls import store_of


def dataset_name(path: str) -> tuple[str, str]:
    """(namespace, name) of a path: ``("file", "/data/in")``, ``("s3://bucket", "in/2026-11-20")``.

    Object stores get their canonical scheme (``s3a://`` is ``s3://``, ``gcs://`` is ``gs://``,
    ``az://`` and ``abfss://`` are ``abfs://``) and the bucket or container (with its account, when
    the URL names it: ``abfs://container@account.dfs.core.windows.net``) as the namespace.
    A glob names the folder before its first wildcard; trailing slashes are dropped.
    """
    cut = min((path.find(c) for c in GLOB_CHARS if c in path), default=-1)
    if cut >= 0:
        path = path[:cut].rsplit("/", 1)[0] or "/"
    if "://" not in path:
        return "file", posixpath.normpath(path)
    parts = urlsplit(path)
    if parts.scheme in ("file", "local"):
        return "file", posixpath.normpath(parts.path or "/")
    store = store_of(path)
    scheme = store.scheme if store else parts.scheme
    return f"{scheme}://{parts.netloc}", parts.path.strip("/") or "/"


def catalog_namespace(properties: dict[str, Any]) -> str:
    """An Iceberg catalog as an OpenLineage namespace: its URI without credentials (or its type)."""
    uri = str(properties.get("uri") or "")
    if not uri:
        return f"iceberg://{properties.get('type', 'catalog')}"
    parts = urlsplit(uri)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme.split('+')[0]}://{host}{port}{parts.path}"


def operator_lineage(
    input_path: str, output_path: str, table: str | None = None, catalog: dict[str, Any] | None = None
) -> Any | None:
    """An ``OperatorLineage`` reading ``input_path`` and writing ``output_path``; None without OpenLineage.

    A table output is named by its location, as OpenLineage's integrations name Delta and Iceberg
    tables; an Iceberg table also gets its catalog name as a ``TABLE`` symlink (namespace: the
    catalog's URI without credentials, name: ``namespace.table``).
    """
    try:
        from airflow.providers.common.compat.openlineage.facet import Dataset, Identifier, SymlinksDatasetFacet
        from airflow.providers.openlineage.extractors import OperatorLineage
    except ImportError:
        return None
    facets = {}
    if table:
        identifier = Identifier(namespace=catalog_namespace(catalog or {}), name=table, type="TABLE")
        facets["symlinks"] = SymlinksDatasetFacet(identifiers=[identifier])
    return OperatorLineage(
        inputs=[Dataset(*dataset_name(input_path))],
        outputs=[Dataset(*dataset_name(output_path), facets=facets)],
    )
