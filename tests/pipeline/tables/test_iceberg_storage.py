"""pyiceberg's FileIO properties from the fsspec options the provider builds from each cloud's Airflow
connection (the real hooks), what pyiceberg builds from them (its fsspec FileIO, with gcsfs and adlfs
given the connection's credentials), and the refusals of what it cannot be given. Fast: no server, no Ray.

Tables written with these properties on the GCS emulator and Azurite: tests/test_object_stores.py.
"""

from __future__ import annotations

import json

import pytest

from airflow_provider_raybatch.hooks.object_stores import storage_options
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, Stage, TableOutput
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.tables.iceberg_storage import FSSPEC_FILE_IO, file_io_properties
from tests.support.storage_servers import service_account_key

pytest.importorskip("pyiceberg")

ENDPOINT = "http://127.0.0.1:4443"


def connection(monkeypatch, conn_id: str, conn: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def file_io(tmp_path, properties: dict, location: str):
    """The FileIO pyiceberg gives a table at ``location`` of a SQL catalog opened with ``properties``
    (as the writer opens it: through the provider's ``load_catalog``)."""
    from airflow_provider_raybatch.pipeline.tables.iceberg import load_catalog

    catalog = load_catalog({**properties, "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db"})
    return catalog._load_file_io(location=location)


def test_the_property_names_are_pyiceberg_s():
    from pyiceberg.io import PY_IO_IMPL, fsspec

    from airflow_provider_raybatch.pipeline.tables import iceberg_storage

    assert f"{fsspec.FsspecFileIO.__module__}.{fsspec.FsspecFileIO.__name__}" == FSSPEC_FILE_IO
    assert PY_IO_IMPL == "py-io-impl"
    names = {*iceberg_storage._GCS_PROPERTIES.values(), *iceberg_storage._AZURE_PROPERTIES.values()}
    # fsspec's FileIO imports each property it reads by its constant's name.
    assert names <= {getattr(fsspec, n) for n in dir(fsspec) if n.startswith(("GCS_", "ADLS_"))}


# --- Google Cloud Storage ----------------------------------------------------------------------------


def test_a_service_account_connection_gives_gcsfs_in_pyiceberg_its_credentials(monkeypatch, tmp_path):
    from pyiceberg.io.fsspec import FsspecFileIO

    key = service_account_key("http://127.0.0.1:1/token")
    extra = {"keyfile_dict": json.dumps(key), "project": "raybatch-test", "endpoint_url": ENDPOINT}
    connection(monkeypatch, "gcs_key", {"conn_type": "google_cloud_platform", "extra": extra})
    options = storage_options(gcp_conn_id="gcs_key")["gs"]

    properties = file_io_properties("gs://bucket/table", options)
    assert properties == {
        "gcs.oauth2.token": options["token"],  # google-auth's credentials: gcsfs refreshes their tokens
        "gcs.project-id": "raybatch-test",
        "gcs.service.host": ENDPOINT,
        "py-io-impl": FSSPEC_FILE_IO,
    }
    io = file_io(tmp_path, properties, "gs://bucket/table/metadata/v1.metadata.json")
    assert isinstance(io, FsspecFileIO)
    fs = io.get_fs("gs")
    assert fs.credentials.credentials is options["token"] and fs._endpoint == ENDPOINT
    assert fs.project == "raybatch-test"


def test_anonymous_and_gcsfs_options_given_as_storage_options(monkeypatch, tmp_path):
    extra = {"is_anonymous": True, "endpoint_url": ENDPOINT}
    connection(monkeypatch, "gcs_anon", {"conn_type": "google_cloud_platform", "extra": extra})
    properties = file_io_properties("gs://bucket/table", storage_options(gcp_conn_id="gcs_anon")["gs"])
    assert properties == {"gcs.oauth2.token": "anon", "gcs.service.host": ENDPOINT, "py-io-impl": FSSPEC_FILE_IO}

    key = service_account_key("http://127.0.0.1:1/token")
    options = {"token": key, "project": "p", "requester_pays": True, "endpoint_url": None}
    properties = file_io_properties("gcs://bucket/table", options)
    assert properties == {
        "gcs.oauth2.token": key,  # a key's content, kept a dict: gcsfs builds the service account from it
        "gcs.project-id": "p",
        "gcs.requester-pays": "True",
        "py-io-impl": FSSPEC_FILE_IO,
    }
    fs = file_io(tmp_path, properties, "gcs://bucket/table").get_fs("gcs")
    assert fs.credentials.credentials.service_account_email == key["client_email"] and fs.requester_pays
    # No options: pyiceberg picks its FileIO and the environment's credentials, as before.
    assert file_io_properties("gs://bucket/table", {}) == {}


# --- Azure Blob Storage / ADLS Gen2 ----------------------------------------------------------------------


def test_an_account_key_connection_gives_adlfs_in_pyiceberg_its_connection_string(monkeypatch, tmp_path):
    conn = {
        "conn_type": "wasb",
        "login": "raybatchacct",
        "password": "a2V5LXNlY3JldA==",
        "host": ENDPOINT + "/raybatchacct",
    }
    connection(monkeypatch, "azure_key", conn)
    options = storage_options(azure_conn_id="azure_key")["abfs"]
    for url in ("abfs://container/table", "abfss://container/table"):
        assert file_io_properties(url, options) == {
            "adls.connection-string": options["connection_string"],
            "adls.account-name": "raybatchacct",
            "py-io-impl": FSSPEC_FILE_IO,
        }
    fs = file_io(tmp_path, file_io_properties("abfs://container/table", options), "abfs://container/t").get_fs(
        "abfs", "container"
    )
    assert fs.connection_string == options["connection_string"] and fs.account_name == "raybatchacct"
    assert fs.service_client.url.startswith(ENDPOINT + "/raybatchacct")


def test_a_service_principal_connection_gives_adlfs_the_principal(monkeypatch):
    conn = {"conn_type": "wasb", "login": "client-id", "password": "pr1ncipal-secret", "extra": {"tenant_id": "t"}}
    connection(monkeypatch, "azure_sp", conn)
    properties = file_io_properties("abfs://c/t", storage_options(azure_conn_id="azure_sp")["abfs"])
    assert properties == {
        "adls.account-name": "client-id",  # WasbHook's account: the login, with a principal
        "adls.tenant-id": "t",
        "adls.client-id": "client-id",
        "adls.client-secret": "pr1ncipal-secret",
        "py-io-impl": FSSPEC_FILE_IO,
    }


def test_adlfs_options_given_as_storage_options_keep_their_types(tmp_path):
    from azure.identity.aio import ClientSecretCredential

    credential = ClientSecretCredential("tenant", "client", "cr3dential-secret")
    options = {"account_name": "a", "credential": credential, "account_host": "a.blob.core.example", "anon": False}
    properties = file_io_properties("abfs://c/t", options)
    assert properties == {
        "adls.account-name": "a",
        "adls.credential": credential,
        "adls.account-host": "a.blob.core.example",
        "adls.anon": False,  # a bool: adlfs would take the text "False" as true
        "py-io-impl": FSSPEC_FILE_IO,
    }
    fs = file_io(tmp_path, properties, "abfs://c/t").get_fs("abfs", "c")
    assert fs.credential is credential and fs.anon is False and fs.account_host == "a.blob.core.example"
    anon = file_io(tmp_path, file_io_properties("abfs://c/t", {"account_name": "a", "anon": True}), "abfs://c/t")
    assert anon.get_fs("abfs", "c").anon is True
    sas = file_io_properties("abfs://c/t", {"account_name": "a", "sas_token": "?sv=1&sig=x"})
    assert sas == {"adls.account-name": "a", "adls.sas-token": "?sv=1&sig=x", "py-io-impl": FSSPEC_FILE_IO}


# --- refusals ------------------------------------------------------------------------------------------


def test_what_pyiceberg_cannot_be_given_is_refused_naming_it():
    key = service_account_key("http://127.0.0.1:1/token")
    with pytest.raises(ConfigError, match=r"gcp_conn_id / storage option 'session_kwargs' for an Iceberg table") as e:
        file_io_properties("gs://b/t", {"token": key, "session_kwargs": {"trust_env": "s3ssion-secret"}})
    assert key["private_key"] not in str(e.value) and "s3ssion-secret" not in str(e.value)
    with pytest.raises(ConfigError, match=r"azure_conn_id / storage option 'socket_timeout'.*pyiceberg has no such"):
        file_io_properties("abfs://c/t", {"account_key": "k3y-secret", "socket_timeout": 5})
    with pytest.raises(ConfigError, match=r"azure_conn_id / storage option anon .*True or False") as e:
        file_io_properties("abfs://c/t", {"account_key": "k3y-secret", "anon": "false"})
    assert "k3y-secret" not in str(e.value)
    # pyiceberg has no FileIO for az:// (neither fsspec's nor pyarrow's), with or without options.
    for options in ({}, {"account_name": "a"}):
        with pytest.raises(ConfigError, match=r"az://: write its location as abfs://"):
            file_io_properties("az://c/t", options)
    with pytest.raises(ConfigError, match=r"storage options for an Iceberg table on memory://"):
        file_io_properties("memory://t", {"x": 1})


def test_s3_options_map_as_before():
    options = {
        "key": "AKIA1",
        "secret": "s3cret",
        "token": "t0ken",
        "client_kwargs": {"endpoint_url": ENDPOINT, "region_name": "eu-west-1"},
    }
    assert file_io_properties("s3://bucket/t", options) == {
        "s3.access-key-id": "AKIA1",
        "s3.secret-access-key": "s3cret",
        "s3.session-token": "t0ken",
        "s3.endpoint": ENDPOINT,
        "s3.region": "eu-west-1",
    }
    assert file_io_properties("/local/table", {}) == {}


def test_a_table_output_with_an_option_pyiceberg_cannot_take_is_refused_before_any_work(tmp_path):
    from airflow_provider_raybatch.pipeline.tables.table_commits import check_table_output

    config = BatchInferenceConfig(
        str(tmp_path / "in"),
        "abfs://container/table",
        [Stage("tests.support.predictors:score")],
        id_column="id",
        storage_options={"abfs": {"account_name": "a", "account_key": "k3y-secret", "max_concurrency": 4}},
        table=TableOutput("iceberg", {"ds": "2026-11-24"}, "daily.score", identifier="ns.t"),
    )
    with pytest.raises(ConfigError, match=r"storage option 'max_concurrency' for an Iceberg table") as e:
        check_table_output(config)
    assert "k3y-secret" not in str(e.value)
