"""Storage credentials from Airflow connections, resolved by each cloud's own Airflow provider.

``aws_conn_id`` goes through the Amazon provider's ``AwsBaseHook`` (its session: keys, profile,
assume-role, region and endpoint), ``gcp_conn_id`` through the Google provider's hook when it is
installed (else google-auth reads the same connection fields), ``azure_conn_id`` through the Azure
provider's ``WasbHook``. The result is fsspec ``storage_options`` keyed by store
(``{"s3": {...}, "gs": {...}, "abfs": {...}}``), which :func:`~airflow_provider_raybatch.pipeline.store.files.resolve`
picks from per path. Providers are imported here, inside the resolution, never when an operator is imported.

Used by the task only: a Ray Job on a cluster never receives them (it uses the cluster's
environment), and they are never logged, returned or written with the output. Each secret is
registered with Airflow's log masker as it is resolved.
"""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.store.urls import AZURE, GCS, S3, Store
from airflow_provider_raybatch.version_compat import AirflowNotFoundException

#: The scope gcsfs needs (the Google provider's default is cloud-platform, which includes it).
GCS_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
AZURE_STORAGE_SCOPE = "https://storage.azure.com/.default"


def storage_options(
    aws_conn_id: str | None = None, gcp_conn_id: str | None = None, azure_conn_id: str | None = None
) -> dict[str, Any]:
    """fsspec options for every store a connection is given for, keyed by store scheme.

    A store without a connection is absent: its filesystem reads the environment's credentials.

    :raises ConfigError: a connection that does not exist, yields no credentials, or whose
        provider is not installed; the message names the connection.
    """
    options: dict[str, Any] = {}
    if aws_conn_id:
        options[S3.scheme] = s3_options(aws_conn_id)
    if gcp_conn_id:
        options[GCS.scheme] = gcs_options(gcp_conn_id)
    if azure_conn_id:
        options[AZURE.scheme] = azure_options(azure_conn_id)
    return options


def _connection(store: Store, conn_id: str) -> Any:
    """The connection, or a ConfigError naming it (providers' hooks may fall back to the environment silently)."""
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ConfigError(
            f"{store.conn_arg}={conn_id!r}: no such Airflow connection (create a {store.conn_type!r} connection "
            f"of that id, or pass {store.conn_arg}=None to use the environment's credentials)"
        ) from None


def _missing_provider(store: Store, conn_id: str, package: str) -> ConfigError:
    return ConfigError(
        f"{store.conn_arg}={conn_id!r} needs {package}: pip install 'airflow-provider-raybatch[{store.extra}]'"
    )


def _masked(*secrets: str | None) -> None:
    for secret in secrets:
        if secret:
            mask_secret(secret)


# --- Amazon S3 -------------------------------------------------------------------------------


def s3_options(conn_id: str) -> dict[str, Any]:
    """s3fs options from the Amazon provider's session for ``conn_id``: frozen credentials, region, endpoint.

    Frozen: an assumed role's credentials are fetched once, here, and last for the role's session
    duration (an hour by default); a retry resolves them again.
    """
    _connection(S3, conn_id)
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError:
        raise _missing_provider(S3, conn_id, "the Amazon provider (apache-airflow-providers-amazon)") from None
    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
    session = hook.get_session()
    credentials = session.get_credentials()
    if credentials is None:
        raise ConfigError(
            f"aws_conn_id={conn_id!r}: the connection yields no AWS credentials (no login/password, role, "
            "profile or web identity in it, and none in the worker's environment)"
        )
    try:
        frozen = credentials.get_frozen_credentials()  # an assumed role is assumed here
    except Exception as e:
        raise ConfigError(f"aws_conn_id={conn_id!r}: could not get credentials: {type(e).__name__}: {e}") from None
    _masked(frozen.secret_key, frozen.token)
    options: dict[str, Any] = {"key": frozen.access_key, "secret": frozen.secret_key}
    if frozen.token:
        options["token"] = frozen.token
    client_kwargs: dict[str, Any] = {}
    endpoint = hook.conn_config.get_service_endpoint_url("s3")
    if endpoint:
        client_kwargs["endpoint_url"] = endpoint
    region = hook.conn_config.region_name or session.region_name
    if region:
        client_kwargs["region_name"] = region
    if hook.conn_config.verify is not None:
        client_kwargs["verify"] = hook.conn_config.verify
    if client_kwargs:
        options["client_kwargs"] = client_kwargs
    return options


# --- Google Cloud Storage --------------------------------------------------------------------


def gcs_options(conn_id: str) -> dict[str, Any]:
    """gcsfs options from a ``google_cloud_platform`` connection: its credentials and project.

    With the Google provider installed its hook resolves them (key file or JSON, credential
    configuration file, impersonation chain, application default credentials). Without it,
    google-auth reads the same connection fields (``keyfile_dict``, ``key_path``,
    ``credential_config_file``, ``scope``, ``project``; none: application default credentials).
    A connection marked anonymous (the Google connection's ``is_anonymous`` field, for public
    buckets) reads without credentials, as the Google provider's hook does. An ``endpoint_url``
    extra points gcsfs at another endpoint (an emulator).
    """
    conn = _connection(GCS, conn_id)
    extra = _unprefixed(conn.extra_dejson, "extra__google_cloud_platform__")
    if _is_set(extra.get("is_anonymous")):
        credentials, project = "anon", None  # gcsfs's anonymous access
    else:
        credentials, project = _gcp_credentials(conn_id, extra)
    options: dict[str, Any] = {"token": credentials}
    if extra.get("project") or project:
        options["project"] = extra.get("project") or project
    if extra.get("endpoint_url"):
        options["endpoint_url"] = extra["endpoint_url"]
    return options


def _gcp_credentials(conn_id: str, extra: dict[str, Any]) -> tuple[Any, str | None]:
    try:
        from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
    except ImportError:
        return _google_auth_credentials(conn_id, extra)
    try:
        return GoogleBaseHook(gcp_conn_id=conn_id).get_credentials_and_project_id()
    except Exception as e:
        raise ConfigError(f"gcp_conn_id={conn_id!r}: no usable credentials: {type(e).__name__}: {e}") from None


def _google_auth_credentials(conn_id: str, extra: dict[str, Any]) -> tuple[Any, str | None]:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError
    from google.oauth2 import service_account

    scopes = [s.strip() for s in str(extra.get("scope") or GCS_SCOPE).split(",") if s.strip()]
    try:
        if extra.get("keyfile_dict"):
            info = extra["keyfile_dict"]
            info = json.loads(info) if isinstance(info, str) else info
            _masked(info.get("private_key"))
            return service_account.Credentials.from_service_account_info(info, scopes=scopes), info.get("project_id")
        if extra.get("key_path"):
            creds = service_account.Credentials.from_service_account_file(extra["key_path"], scopes=scopes)
            return creds, creds.project_id
        if extra.get("credential_config_file"):
            return google.auth.load_credentials_from_file(extra["credential_config_file"], scopes=scopes)
        return google.auth.default(scopes=scopes)
    except DefaultCredentialsError as e:
        raise ConfigError(
            f"gcp_conn_id={conn_id!r}: the connection has no key (keyfile_dict, key_path or "
            f"credential_config_file) and no application default credentials were found: {e}"
        ) from None
    except (ValueError, KeyError, OSError) as e:
        raise ConfigError(f"gcp_conn_id={conn_id!r}: unusable key: {type(e).__name__}: {e}") from None


def _is_set(flag: Any) -> bool:
    """A connection's boolean field: ``true`` in JSON, or its text as a form or URI gives it."""
    return flag is True or (isinstance(flag, str) and flag.strip().lower() in ("true", "1", "yes", "on"))


def _unprefixed(extra: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Extras as the providers read them: ``extra__<type>__name`` (older forms) or ``name``."""
    return {(k.removeprefix(prefix)): v for k, v in extra.items() if v not in (None, "")}


# --- Azure Blob Storage / ADLS Gen2 ----------------------------------------------------------


def azure_options(conn_id: str) -> dict[str, Any]:
    """adlfs options from the Azure provider's ``WasbHook`` client for ``conn_id``.

    The hook builds the account's client as for its own operators (connection string, shared key,
    SAS token, service principal with ``tenant_id``, or DefaultAzureCredential / managed identity);
    adlfs gets the same credential: a key or SAS with the client's endpoint (any endpoint, such as
    an emulator's), or the service principal's fields, or the account alone (adlfs then uses
    DefaultAzureCredential itself, as its clients are asynchronous).
    """
    conn = _connection(AZURE, conn_id)
    try:
        from airflow.providers.microsoft.azure.hooks.wasb import WasbHook
    except ImportError:
        raise _missing_provider(
            AZURE, conn_id, "the Azure provider (apache-airflow-providers-microsoft-azure)"
        ) from None
    try:
        client = WasbHook(wasb_conn_id=conn_id).get_conn()
    except Exception as e:
        raise ConfigError(f"azure_conn_id={conn_id!r}: unusable connection: {type(e).__name__}: {e}") from None
    endpoint = client.primary_endpoint.split("?", 1)[0].rstrip("/")
    credential = client.credential
    account_key = getattr(credential, "account_key", None)
    if account_key:
        _masked(account_key)
        connection_string = (
            f"AccountName={client.account_name};AccountKey={account_key};BlobEndpoint={endpoint};"
            f"DefaultEndpointsProtocol={endpoint.split('://', 1)[0]}"
        )
        _masked(connection_string)
        return {"connection_string": connection_string, "account_name": client.account_name}
    sas = getattr(credential, "signature", None) or (client.url.split("?", 1)[1] if "?" in client.url else None)
    if sas:
        _masked(sas)
        connection_string = f"BlobEndpoint={endpoint};SharedAccessSignature={sas.lstrip('?')}"
        _masked(connection_string)
        return {"connection_string": connection_string, "account_name": client.account_name}
    options: dict[str, Any] = {"account_name": client.account_name}
    host = endpoint.split("://", 1)[1]
    if host != f"{client.account_name}.blob.core.windows.net":
        options["account_host"] = host
    tenant = _unprefixed(conn.extra_dejson, "extra__wasb__").get("tenant_id")
    if tenant and conn.login and conn.password:
        options.update(tenant_id=tenant, client_id=conn.login, client_secret=conn.password)
    else:
        # DefaultAzureCredential / managed identity: adlfs builds its own (asynchronous) one from the
        # same environment, so the hook's is only used to fail here, naming the connection, when none works.
        try:
            credential.get_token(AZURE_STORAGE_SCOPE)
        except Exception as e:
            raise ConfigError(
                f"azure_conn_id={conn_id!r}: the connection has no connection string, key, SAS token or service "
                f"principal, and no default Azure credential works here: {type(e).__name__}: {str(e)[:500]}"
            ) from None
    return options
