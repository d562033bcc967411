"""pyiceberg's FileIO properties for an Iceberg table on S3, GCS or Azure Blob Storage / ADLS Gen2, from
the fsspec options the provider builds for its stores (an Airflow connection's credentials and endpoint,
``hooks/object_stores.py``; or a user's own ``storage_options``), as :mod:`.delta_storage` does for delta-rs.

**Which FileIO.** pyiceberg 0.12 picks a FileIO by the table location's scheme: pyarrow's
(``PyArrowFileIO``) for ``s3://`` and ``gs://``, fsspec's (``FsspecFileIO``: s3fs, gcsfs, adlfs) for
``abfs://`` / ``abfss://``. On S3 the connection's frozen keys (and endpoint, region) go to pyarrow's,
as before. On GCS and Azure the connection's options are gcsfs's and adlfs's own, and fsspec's FileIO
hands its properties to those very filesystems, so the table's files are reached exactly as the
folder outputs are; ``py-io-impl`` pins it, because pyarrow's cannot take what the connections give:

- pyarrow's ``GcsFileSystem`` takes an access token only, which it never refreshes (an hour, then
  every commit fails), not the connection's google-auth credentials, a service account's key or
  anonymous access; gcsfs takes them all and refreshes the token itself.
- pyarrow's ``AzureFileSystem`` takes no connection string (what a key or SAS connection resolves to),
  account host, credential object or anonymous access. pyiceberg would pick fsspec's for ``abfs://``
  anyway; pinned, the options cannot reach the one that drops them.

FsspecFileIO reads a fixed set of properties: an fsspec option outside it is refused with a
:class:`ConfigError` naming it (never its value), before the run (``check_table_output``), not dropped.
``az://`` is refused with or without options: neither of pyiceberg's FileIOs knows that scheme.
The property names were checked against pyiceberg 0.12's ``pyiceberg/io/__init__.py`` and
``pyiceberg/io/fsspec.py`` (``_gs``, ``_adls``); this module imports no pyiceberg.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.store.urls import AZURE, GCS, S3, scheme_of, store_of
from airflow_provider_raybatch.pipeline.tables.delta_storage import azure_anon, unknown_options
from airflow_provider_raybatch.pipeline.tables.writer_commits import s3_settings

#: pyiceberg's ``py-io-impl`` value for fsspec's FileIO.
FSSPEC_FILE_IO = "pyiceberg.io.fsspec.FsspecFileIO"

#: FileIO properties whose values FsspecFileIO hands to gcsfs / adlfs as they are, so they must stay
#: what the connection resolved (google-auth or Azure credentials objects, a key's dict, a bool: the
#: text "False" would be a true ``anon``). :func:`.iceberg.load_catalog` makes every other property text.
OBJECT_PROPERTIES = frozenset({"gcs.oauth2.token", "adls.credential", "adls.anon"})

#: gcsfs's option -> the property FsspecFileIO's ``_gs`` gives gcsfs back under that option's name.
_GCS_PROPERTIES = {
    "token": "gcs.oauth2.token",
    "project": "gcs.project-id",
    "endpoint_url": "gcs.service.host",
    "access": "gcs.access",
    "consistency": "gcs.consistency",
    "requester_pays": "gcs.requester-pays",
    "default_location": "gcs.default-bucket-location",
    "version_aware": "gcs.version-aware",
}

#: adlfs's option -> the property FsspecFileIO's ``_adls`` gives adlfs back under that option's name.
_AZURE_PROPERTIES = {
    "connection_string": "adls.connection-string",
    "account_name": "adls.account-name",
    "account_key": "adls.account-key",
    "sas_token": "adls.sas-token",
    "tenant_id": "adls.tenant-id",
    "client_id": "adls.client-id",
    "client_secret": "adls.client-secret",
    "account_host": "adls.account-host",
    "credential": "adls.credential",
    "anon": "adls.anon",
}

_WHERE = {"table": "an Iceberg table", "library": "pyiceberg"}


def file_io_properties(url: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """pyiceberg's FileIO properties for the table at ``url`` from the fsspec options of its store.

    :param url: the table's location.
    :param options: the fsspec options of that store (s3fs, gcsfs or adlfs names), as
        :func:`~airflow_provider_raybatch.pipeline.store.urls.options_for` picks them.
    :return: the properties (none without options: pyiceberg reads the environment's credentials).
        Values are text, but for :data:`OBJECT_PROPERTIES`, which hold what the connection resolved.
    :raises ConfigError: an option pyiceberg's FileIO cannot be given, naming it (and the connection
        argument it may come from); options for a store pyiceberg is not given options for; ``az://``.
    """
    scheme, store = scheme_of(url), store_of(url)
    if scheme == "az":
        raise ConfigError(
            "an Iceberg table on az://: write its location as abfs://... or abfss://... (pyiceberg has no "
            "FileIO for az://; the same container and path, read with the same azure_conn_id)"
        )
    if not options:
        return {}
    if store is S3:
        names = {
            "key": "s3.access-key-id",
            "secret": "s3.secret-access-key",
            "token": "s3.session-token",
            "endpoint": "s3.endpoint",
            "region": "s3.region",
        }
        return {names[name]: value for name, value in s3_settings(options).items()}
    if store is GCS:
        return {**_mapped(GCS.conn_arg, options, _GCS_PROPERTIES), "py-io-impl": FSSPEC_FILE_IO}
    if store is AZURE:
        azure_anon(options, **_WHERE)  # True or False only
        return {**_mapped(AZURE.conn_arg, options, _AZURE_PROPERTIES), "py-io-impl": FSSPEC_FILE_IO}
    raise ConfigError(
        f"storage options for an Iceberg table on {scheme}:// cannot be given to pyiceberg: leave them unset, "
        "or set the catalog's FileIO properties"
    )


def _mapped(conn_arg: str, options: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """``options`` under FsspecFileIO's property names; unset ones left out.

    :raises ConfigError: an option FsspecFileIO does not read, naming it.
    """
    unknown = set(options) - set(names)
    if unknown:
        raise unknown_options(conn_arg, unknown, ", ".join(names), **_WHERE)
    out: dict[str, Any] = {}
    for option, value in options.items():
        if value is None or value == "":
            continue
        prop = names[option]
        out[prop] = value if prop in OBJECT_PROPERTIES else str(value)
    return out
