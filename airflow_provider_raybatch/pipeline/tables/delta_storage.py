"""delta-rs's storage options for a Delta table on S3, GCS or Azure Blob Storage / ADLS Gen2, from the
fsspec options the provider builds for its stores (an Airflow connection's credentials and endpoint,
``hooks/object_stores.py``; or a user's own ``storage_options``).

delta-rs reaches each store through the ``object_store`` crate and drops an option name it does not
know without a word (delta-rs 1.6: its GCS and Azure factories keep only the keys ``object_store``
parses). So each fsspec option is mapped to a key ``object_store`` reads (``google_*``,
``azure_*``, names checked against object_store 0.13, the version deltalake 1.6.6 is built with), or
refused with a :class:`ConfigError` naming the setting: never passed on unread, never dropped. The
errors name options, never their values.

**Concurrent commits.** On GCS and Azure delta-rs uses its default log store, which writes version N
of the log with object_store's create-if-absent PUT: on GCS the XML API's
``x-goog-if-generation-match: 0`` (GCS answers 412 when the object exists), on Azure ``If-None-Match: *``
(409/412). object_store reports either as "already exists", and delta-rs as a version that exists:
it reads the winner's commit, checks for a conflict and tries the next version, or raises
``CommitFailedError``. No lock and no locking service is involved; the store itself refuses the
second writer of one version. On S3 the same holds with ``If-None-Match`` (see :func:`_s3`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.store.urls import AZURE, GCS, scheme_of, store_of
from airflow_provider_raybatch.pipeline.tables.writer_commits import s3_settings

#: Connection-string keys that name other Azure services than Blob Storage: nothing a Delta table uses.
_OTHER_AZURE_SERVICES = frozenset({"QueueEndpoint", "TableEndpoint", "FileEndpoint"})


def delta_storage_options(url: str, options: Mapping[str, Any]) -> dict[str, str]:
    """delta-rs's options for the table at ``url`` from the fsspec options of its store.

    :param url: the table's root.
    :param options: the fsspec options of that store (s3fs, gcsfs or adlfs names), as
        :func:`~airflow_provider_raybatch.pipeline.store.urls.options_for` picks them.
    :raises ConfigError: an option delta-rs cannot be given, naming it (and the connection argument
        it comes from when it comes from one); or options for a store delta-rs is not given options for.
    """
    scheme = scheme_of(url)
    if scheme in ("s3", "s3a"):
        return _s3(options)
    if not options:
        return {}
    store = store_of(url)
    if store is GCS and scheme == "gs":
        return _gcs(options)
    if store is AZURE:
        return _azure(options)
    if store is GCS:
        # delta-rs hands gcs:// to another backend (OpenDAL), which reads none of these options.
        raise ConfigError(
            f"a Delta table on {scheme}:// with {GCS.conn_arg}: write its path as gs://... (delta-rs's name)"
        )
    raise ConfigError(
        f"{store.conn_arg if store else 'storage options'} for a Delta table on {scheme}:// cannot be given to "
        "delta-rs: leave it unset, and delta-rs reads the environment's credentials"
    )


def _s3(options: Mapping[str, Any]) -> dict[str, str]:
    """delta-rs commits to S3 with conditional PUTs (``If-None-Match``): two writers can never both
    create one version of the log, with no locking service."""
    names = {
        "key": "AWS_ACCESS_KEY_ID",
        "secret": "AWS_SECRET_ACCESS_KEY",
        "token": "AWS_SESSION_TOKEN",
        "endpoint": "AWS_ENDPOINT_URL",
        "region": "AWS_REGION",
    }
    out = {names[name]: value for name, value in s3_settings(options).items()}
    if out.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        out["AWS_ALLOW_HTTP"] = "true"
    return out


def refused(
    store_conn_arg: str, what: str, why: str, *, table: str = "a Delta table", library: str = "delta-rs"
) -> ConfigError:
    """The error for an option of a store that a table library cannot be given: it names the option
    (and the connection argument it may come from), never its value.

    :param store_conn_arg: the store's connection argument (``gcp_conn_id``...).
    :param what: the option, as the user would find it.
    :param why: why it cannot be given.
    :param table: the kind of table, as the error names it.
    :param library: the library that writes that table.
    """
    return ConfigError(f"{store_conn_arg} / storage option {what} for {table} cannot be given to {library}: {why}")


def unknown_options(
    conn_arg: str, keys: set[str], known: str, *, table: str = "a Delta table", library: str = "delta-rs"
) -> ConfigError:
    """The error for options a table library has no setting for (:func:`refused`, naming them all).

    :param conn_arg: the store's connection argument.
    :param keys: the options.
    :param known: the options it does take, for the error.
    :param table, library: as for :func:`refused`.
    """
    names = ", ".join(repr(k) for k in sorted(keys))
    return refused(conn_arg, names, f"{library} has no such setting (it takes {known})", table=table, library=library)


# --- Google Cloud Storage (gcsfs's options) -----------------------------------------------------------


def _gcs(options: Mapping[str, Any]) -> dict[str, str]:
    """object_store's GCS keys for gcsfs's ``token``, ``endpoint_url`` and ``project``.

    ``token``: a service account (google-auth credentials, its key file's content as a dict, or the
    file's path) becomes the key itself (object_store signs its own tokens with it), ``"anon"``
    unsigned requests, ``None`` / ``"google_default"`` nothing (delta-rs reads the same application
    default credentials). ``project`` is dropped: object operations name only the bucket.
    """
    unknown = set(options) - {"token", "endpoint_url", "project"}
    if unknown:
        raise unknown_options(GCS.conn_arg, unknown, "token, endpoint_url and project")
    out: dict[str, str] = {}
    if options.get("endpoint_url"):
        out["google_base_url"] = str(options["endpoint_url"]).rstrip("/")
    token = options.get("token")
    if token is None or token == "google_default":
        return out
    if token == "anon":
        return {**out, "google_skip_signature": "true"}
    if isinstance(token, (str, os.PathLike)):
        if _key_file_type(token) not in ("service_account", "authorized_user"):
            raise refused(
                GCS.conn_arg,
                "token",
                "it is neither a service account's or user's key file nor 'anon' or 'google_default'",
            )
        # object_store reads a service account's or an authorized user's file from this path.
        return {**out, "google_application_credentials": os.fspath(token)}
    if isinstance(token, Mapping):
        if token.get("type") != "service_account":
            raise refused(GCS.conn_arg, "token", "delta-rs takes a service account's key, not this kind of key")
        # object_store requires the key's id (an unparsable key would fail every commit as a store error).
        return {**out, "google_service_account_key": json.dumps({"private_key_id": "", **token})}
    return {**out, "google_service_account_key": json.dumps(_service_account_key(token))}


def _key_file_type(path: str | os.PathLike) -> str | None:
    """The ``type`` of a Google key file (None: not a readable JSON key file)."""
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, ValueError):
        return None
    return content.get("type") if isinstance(content, dict) else None


def _service_account_key(credentials: Any) -> dict[str, str]:
    """A service account's key file content, rebuilt from the google-auth credentials made from it.

    google-auth keeps the key in the credentials' signer, not the file's content; the key is read
    from the signer (the attribute that google-auth's own pickling serializes).
    """
    try:
        from google.oauth2.service_account import Credentials
    except ImportError:  # no google-auth: the credentials cannot be a service account's
        Credentials = None  # noqa: N806 - the class's name
    kind = f"{type(credentials).__module__}.{type(credentials).__name__}"
    if Credentials is None or not isinstance(credentials, Credentials):
        raise refused(
            GCS.conn_arg,
            f"token ({kind})",
            "delta-rs takes a service account's key (the connection's keyfile_dict or key_path), not "
            "impersonated, user or external-account credentials: use a key, or leave gcp_conn_id unset and "
            "delta-rs reads the environment's application default credentials",
        )
    if getattr(credentials, "_subject", None):
        raise refused(GCS.conn_arg, "token", "domain-wide delegation (a subject) has no delta-rs setting")
    signer = credentials.signer
    key = getattr(getattr(signer, "_impl", signer), "_key", None)  # google-auth 2.x: the cryptography or rsa key
    if hasattr(key, "private_bytes"):
        from cryptography.hazmat.primitives import serialization

        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
    elif hasattr(key, "save_pkcs1"):
        pem = key.save_pkcs1().decode()
    else:
        raise refused(GCS.conn_arg, "token", f"this google-auth version does not expose the key of {kind}")
    return {
        "type": "service_account",
        "client_email": credentials.service_account_email,
        "private_key_id": signer.key_id or "",
        "private_key": pem,
    }


# --- Azure Blob Storage / ADLS Gen2 (adlfs's options) --------------------------------------------------

#: adlfs's option -> object_store's key (the values pass unchanged).
_AZURE_KEYS = {
    "account_name": "azure_storage_account_name",
    "account_key": "azure_storage_account_key",
    "sas_token": "azure_storage_sas_key",
    "tenant_id": "azure_storage_tenant_id",
    "client_id": "azure_storage_client_id",
    "client_secret": "azure_storage_client_secret",
}


def _azure(options: Mapping[str, Any]) -> dict[str, str]:
    """object_store's Azure keys for adlfs's options: a connection string (account and key or SAS,
    the Blob endpoint), the account's name, key or SAS, a service principal, ``account_host``, ``anon``.

    An account without a key, SAS or service principal (adlfs then uses DefaultAzureCredential)
    gives delta-rs the account alone: it reads the environment (``AZURE_CLIENT_ID`` /
    ``AZURE_CLIENT_SECRET`` / ``AZURE_TENANT_ID``, workload identity, managed identity), not an
    Azure CLI login.
    """
    unknown = set(options) - {*_AZURE_KEYS, "connection_string", "account_host", "anon"}
    if unknown:
        raise unknown_options(
            AZURE.conn_arg, unknown, f"connection_string, account_host, anon, {', '.join(_AZURE_KEYS)}"
        )
    out = {_AZURE_KEYS[k]: str(v) for k, v in options.items() if k in _AZURE_KEYS and v not in (None, "")}
    if "azure_storage_sas_key" in out:
        out["azure_storage_sas_key"] = out["azure_storage_sas_key"].lstrip("?")
    if options.get("account_host"):
        out["azure_storage_endpoint"] = f"https://{options['account_host']}"  # as adlfs builds it
    if options.get("connection_string"):
        out.update(_azure_connection_string(str(options["connection_string"])))
    if azure_anon(options):
        out["azure_skip_signature"] = "true"
    if out.get("azure_storage_endpoint", "").startswith("http://"):
        out["azure_allow_http"] = "true"  # object_store refuses plain HTTP otherwise (an emulator)
    return out


def azure_anon(options: Mapping[str, Any], **where: str) -> bool | None:
    """adlfs's ``anon`` option: True (unsigned requests), False, or None (unset).

    :param options: adlfs's options.
    :param where: ``table`` and ``library`` for the error, as for :func:`refused`.
    :raises ConfigError: it is something else (a string would be taken as true).
    """
    anon = options.get("anon")
    if anon not in (None, True, False):
        raise refused(AZURE.conn_arg, "anon", "it must be True or False", **where)
    return anon


def _azure_connection_string(connection_string: str) -> dict[str, str]:
    """object_store's keys for an Azure Storage connection string's fields."""
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in connection_string.split(";"))):
        name, sep, value = part.partition("=")  # values (keys, SAS) hold '=' themselves
        if not sep:
            raise refused(AZURE.conn_arg, "connection_string", "it has a field that is not name=value")
        fields[name] = value
    names = {
        "AccountName": "azure_storage_account_name",
        "AccountKey": "azure_storage_account_key",
        "SharedAccessSignature": "azure_storage_sas_key",
        "BlobEndpoint": "azure_storage_endpoint",
    }
    unknown = set(fields) - {*names, "DefaultEndpointsProtocol", "EndpointSuffix", "UseDevelopmentStorage"}
    unknown -= _OTHER_AZURE_SERVICES
    if unknown:
        raise unknown_options(AZURE.conn_arg, {f"connection_string's {k}" for k in unknown}, ", ".join(names))
    out = {names[k]: v for k, v in fields.items() if k in names}
    if "azure_storage_sas_key" in out:
        out["azure_storage_sas_key"] = out["azure_storage_sas_key"].lstrip("?")
    if "azure_storage_endpoint" in out:
        out["azure_storage_endpoint"] = out["azure_storage_endpoint"].rstrip("/")
    elif fields.get("EndpointSuffix") and "AccountName" in fields:
        protocol = fields.get("DefaultEndpointsProtocol") or "https"
        out["azure_storage_endpoint"] = f"{protocol}://{fields['AccountName']}.blob.{fields['EndpointSuffix']}"
    if fields.get("UseDevelopmentStorage", "").lower() == "true":
        out["azure_storage_use_emulator"] = "true"
    return out
