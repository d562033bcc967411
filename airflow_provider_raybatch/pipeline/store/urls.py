"""Which object store a path is on, and which Airflow connection argument gives its credentials.

The one place that knows URL schemes: storage options are picked by it, assets and lineage name
outputs with its canonical scheme, and the operator resolves a connection per store. Everything
else (planning, the ledger, the lease, commits) goes through fsspec and treats every store alike.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Store:
    """An object store: its canonical URL scheme, the operator argument naming its connection, its extra.

    :param scheme: the scheme assets and lineage use (``s3``, ``gs``, ``abfs``).
    :param conn_arg: the operator argument naming the Airflow connection with its credentials.
    :param conn_type: the Airflow connection type that argument names.
    :param extra: the ``airflow-provider-raybatch[...]`` extra that installs its filesystem and provider.
    """

    scheme: str
    conn_arg: str
    conn_type: str
    extra: str


S3 = Store("s3", "aws_conn_id", "aws", "amazon")
GCS = Store("gs", "gcp_conn_id", "google_cloud_platform", "google")
AZURE = Store("abfs", "azure_conn_id", "wasb", "azure")

#: fsspec protocol -> store. ``abfs``, ``abfss`` and ``az`` are all adlfs (Blob Storage and ADLS Gen2).
STORES: dict[str, Store] = {
    "s3": S3,
    "s3a": S3,
    "s3n": S3,
    "gs": GCS,
    "gcs": GCS,
    "abfs": AZURE,
    "abfss": AZURE,
    "az": AZURE,
}

#: The keys of store-keyed storage options.
CANONICAL = frozenset(store.scheme for store in STORES.values())
LOCAL_SCHEMES = ("file", "local")


def scheme_of(path: str) -> str:
    """The path's URL scheme in lower case; ``file`` for a plain path."""
    head, sep, _ = path.partition("://")
    return head.lower() if sep else "file"


def store_of(path: str) -> Store | None:
    """The object store of ``path`` (None: a local path, or another fsspec protocol)."""
    return STORES.get(scheme_of(path))


def options_for(path: str, storage_options: dict | None) -> dict:
    """The fsspec options for ``path`` out of ``storage_options``.

    ``storage_options`` is either one filesystem's options, given to every remote path (as
    before), or keyed by canonical scheme (``{"s3": {...}, "gs": {...}, "abfs": {...}}``), so that
    an input on one store and an output on another each get their own credentials.
    """
    if not storage_options or scheme_of(path) in LOCAL_SCHEMES:
        return {}
    if not is_keyed(storage_options):
        return dict(storage_options)
    store = store_of(path)
    return dict(storage_options.get(store.scheme if store else scheme_of(path)) or {})


def is_keyed(storage_options: dict) -> bool:
    """True when the options are keyed by store scheme (no filesystem takes an option named s3, gs or abfs)."""
    return bool(storage_options) and all(k in CANONICAL and isinstance(v, dict) for k, v in storage_options.items())
