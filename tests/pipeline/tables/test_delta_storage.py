"""delta-rs's storage options from the fsspec options the provider builds from each cloud's Airflow
connection (the real hooks: the Google credentials google-auth builds from a key, the Azure client
WasbHook builds), and the refusals of what delta-rs cannot be given. Fast: no server, no Ray.

Tables written with these options on the GCS emulator and Azurite: tests/test_object_stores.py.
"""

from __future__ import annotations

import json

import pytest

from airflow_provider_raybatch.hooks.object_stores import storage_options
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.tables.delta_storage import delta_storage_options
from tests.support.storage_servers import service_account_key

ENDPOINT = "http://127.0.0.1:4443"


def connection(monkeypatch, conn_id: str, conn: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


# --- Google Cloud Storage ----------------------------------------------------------------------------


def test_a_service_account_connection_gives_delta_rs_its_key_and_endpoint(monkeypatch):
    key = service_account_key("http://127.0.0.1:1/token")
    extra = {"keyfile_dict": json.dumps(key), "project": "raybatch-test", "endpoint_url": ENDPOINT + "/"}
    connection(monkeypatch, "gcs_key", {"conn_type": "google_cloud_platform", "extra": extra})
    options = storage_options(gcp_conn_id="gcs_key")["gs"]
    assert not isinstance(options["token"], (str, dict))  # google-auth's credentials, as gcsfs gets them

    mapped = delta_storage_options("gs://bucket/table", options)
    assert set(mapped) == {"google_service_account_key", "google_base_url"}
    assert mapped["google_base_url"] == ENDPOINT
    rebuilt = json.loads(mapped["google_service_account_key"])
    assert rebuilt["type"] == "service_account"
    for field in ("private_key", "private_key_id", "client_email"):
        assert rebuilt[field] == key[field], field  # the key itself (PKCS#8 PEM both)


def test_an_anonymous_connection_gives_unsigned_requests(monkeypatch):
    extra = {"is_anonymous": True, "endpoint_url": ENDPOINT}
    connection(monkeypatch, "gcs_anon", {"conn_type": "google_cloud_platform", "extra": extra})
    mapped = delta_storage_options("gs://bucket/table", storage_options(gcp_conn_id="gcs_anon")["gs"])
    assert mapped == {"google_skip_signature": "true", "google_base_url": ENDPOINT}


def test_gcsfs_tokens_given_as_storage_options(tmp_path):
    key = service_account_key("http://127.0.0.1:1/token")
    path = tmp_path / "key.json"
    path.write_text(json.dumps(key))
    assert json.loads(delta_storage_options("gs://b/t", {"token": key})["google_service_account_key"]) == key
    without_id = {k: v for k, v in key.items() if k != "private_key_id"}  # object_store requires the field
    mapped = json.loads(delta_storage_options("gs://b/t", {"token": without_id})["google_service_account_key"])
    assert mapped == {**without_id, "private_key_id": ""}
    assert delta_storage_options("gs://b/t", {"token": str(path)}) == {"google_application_credentials": str(path)}
    # Application default credentials: delta-rs finds the same ones itself.
    assert delta_storage_options("gs://b/t", {"token": "google_default", "project": "p"}) == {}
    assert delta_storage_options("gs://b/t", {}) == {}


def test_what_delta_rs_cannot_be_given_on_gcs_is_refused_naming_it(tmp_path):
    from google.auth.credentials import AnonymousCredentials

    key = service_account_key("http://127.0.0.1:1/token")
    with pytest.raises(ConfigError, match=r"gcp_conn_id / storage option 'requester_pays'.*no such setting") as e:
        delta_storage_options("gs://b/t", {"token": key, "requester_pays": True})
    assert key["private_key"] not in str(e.value)
    with pytest.raises(
        ConfigError, match=r"token \(google\.auth\.credentials\.AnonymousCredentials\).*service account"
    ):
        delta_storage_options("gs://b/t", {"token": AnonymousCredentials()})
    with pytest.raises(ConfigError, match=r"token .*not this kind of key") as e:
        delta_storage_options("gs://b/t", {"token": {"type": "authorized_user", "refresh_token": "r3fresh-secret"}})
    assert "r3fresh-secret" not in str(e.value)
    with pytest.raises(ConfigError, match=r"token .*neither a service account's or user's key file"):
        delta_storage_options("gs://b/t", {"token": "browser"})
    external = tmp_path / "external.json"
    external.write_text(json.dumps({"type": "external_account", "audience": "//iam.googleapis.com/x"}))
    with pytest.raises(ConfigError, match=r"token .*neither a service account's or user's key file"):
        delta_storage_options("gs://b/t", {"token": str(external)})
    with pytest.raises(ConfigError, match=r"gcs:// with gcp_conn_id: write its path as gs://"):
        delta_storage_options("gcs://b/t", {"token": key})


# --- Azure Blob Storage / ADLS Gen2 ----------------------------------------------------------------------


def test_an_account_key_connection_gives_delta_rs_the_account_key_and_endpoint(monkeypatch):
    conn = {
        "conn_type": "wasb",
        "login": "raybatchacct",
        "password": "a2V5LXNlY3JldA==",
        "host": ENDPOINT + "/raybatchacct",
    }
    connection(monkeypatch, "azure_key", conn)
    options = storage_options(azure_conn_id="azure_key")["abfs"]
    assert set(options) == {"connection_string", "account_name"}  # as adlfs gets them
    for url in ("abfs://container/table", "abfss://container/table", "az://container/table"):
        assert delta_storage_options(url, options) == {
            "azure_storage_account_name": "raybatchacct",
            "azure_storage_account_key": "a2V5LXNlY3JldA==",
            "azure_storage_endpoint": ENDPOINT + "/raybatchacct",
            "azure_allow_http": "true",
        }


def test_a_sas_connection_gives_delta_rs_the_sas(monkeypatch):
    sas = "sv=2024-01-01&ss=b&srt=sco&sp=rwdl&se=2030-01-01&sig=c2lnbmF0dXJl%3D"
    conn = {"conn_type": "wasb", "login": "acct", "host": ENDPOINT + "/acct", "extra": {"sas_token": sas}}
    connection(monkeypatch, "azure_sas", conn)
    mapped = delta_storage_options("abfs://c/t", storage_options(azure_conn_id="azure_sas")["abfs"])
    assert mapped == {
        "azure_storage_account_name": "acct",
        "azure_storage_sas_key": sas,
        "azure_storage_endpoint": ENDPOINT + "/acct",
        "azure_allow_http": "true",
    }


def test_a_service_principal_connection_gives_delta_rs_the_principal(monkeypatch):
    conn = {"conn_type": "wasb", "login": "client-id", "password": "pr1ncipal-secret", "extra": {"tenant_id": "t"}}
    connection(monkeypatch, "azure_sp", conn)
    mapped = delta_storage_options("abfs://c/t", storage_options(azure_conn_id="azure_sp")["abfs"])
    assert mapped == {
        "azure_storage_account_name": "client-id",  # WasbHook's account: the login, with a principal
        "azure_storage_tenant_id": "t",
        "azure_storage_client_id": "client-id",
        "azure_storage_client_secret": "pr1ncipal-secret",
    }


def test_connection_strings_and_adlfs_options_given_as_storage_options():
    cs = "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5;EndpointSuffix=core.chinacloudapi.cn"
    assert delta_storage_options("abfs://c/t", {"connection_string": cs}) == {
        "azure_storage_account_name": "acct",
        "azure_storage_account_key": "a2V5",
        "azure_storage_endpoint": "https://acct.blob.core.chinacloudapi.cn",
    }
    assert delta_storage_options("az://c/t", {"connection_string": "UseDevelopmentStorage=true"}) == {
        "azure_storage_use_emulator": "true"
    }
    assert delta_storage_options("abfs://c/t", {"account_name": "a", "sas_token": "?sv=1&sig=x"}) == {
        "azure_storage_account_name": "a",
        "azure_storage_sas_key": "sv=1&sig=x",
    }
    assert delta_storage_options("abfs://c/t", {"account_name": "a", "anon": True}) == {
        "azure_storage_account_name": "a",
        "azure_skip_signature": "true",
    }
    # DefaultAzureCredential in adlfs: delta-rs reads the environment's credentials for the account.
    assert delta_storage_options("abfs://c/t", {"account_name": "a"}) == {"azure_storage_account_name": "a"}


def test_what_delta_rs_cannot_be_given_on_azure_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"azure_conn_id / storage option 'credential'.*no such setting") as e:
        delta_storage_options("abfs://c/t", {"account_name": "a", "credential": "cr3dential-secret"})
    assert "cr3dential-secret" not in str(e.value)
    cs = "AccountName=a;AccountKey=k3y-secret;DevelopmentStorageProxyUri=http://proxy"
    with pytest.raises(ConfigError, match=r"connection_string's DevelopmentStorageProxyUri") as e:
        delta_storage_options("abfs://c/t", {"connection_string": cs})
    assert "k3y-secret" not in str(e.value)


# --- other stores ---------------------------------------------------------------------------------------


def test_s3_options_map_as_before_and_other_stores_refuse_options():
    options = {
        "key": "AKIA1",
        "secret": "s3cret",
        "client_kwargs": {"endpoint_url": ENDPOINT, "region_name": "eu-west-1"},
    }
    assert delta_storage_options("s3://bucket/t", options) == {
        "AWS_ACCESS_KEY_ID": "AKIA1",
        "AWS_SECRET_ACCESS_KEY": "s3cret",
        "AWS_ENDPOINT_URL": ENDPOINT,
        "AWS_REGION": "eu-west-1",
        "AWS_ALLOW_HTTP": "true",
    }
    with pytest.raises(ConfigError, match=r"storage options for a Delta table on memory://"):
        delta_storage_options("memory://t", {"x": 1})
    assert delta_storage_options("/local/table", {}) == {}
