"""S3, GCS and Azure through each cloud's Airflow connection, against real servers on loopback.

moto's S3 (credentials by an assumed role through moto's STS), gcp-storage-emulator (a service
account key whose token comes from a loopback OAuth endpoint), Azurite (an account key of our own).
On each: conditional creates (the lease), a SIGKILLed run resumed exactly once, the operator
through ``dag.test()`` with its credentials nowhere but in fsspec, and missing credentials
failing at once naming the connection. On GCS and Azure: a Delta table written through the
connection (delta-rs given the connection's credentials), and writers racing for its log; an Iceberg
table written through the connection (pyiceberg's fsspec FileIO given gcsfs's and adlfs's options).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from airflow.sdk import DAG

from airflow_provider_raybatch.hooks.object_stores import storage_options
from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator
from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.commit.verify import verify_output
from airflow_provider_raybatch.pipeline.store.files import absent, create_file, holds, ls, read_json, resolve
from benchmarks.support.processes import kill_ray_leftovers
from tests.conftest import run_dag
from tests.support.data import assert_exactly_once, features_table, read_output

#: Starts the storage servers.
pytestmark = pytest.mark.servers

LOGICAL_DATE = datetime(2026, 11, 20, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[1]


@dataclass
class StoreUnderTest:
    """One store: where to write, the connection the operator gets, a plain filesystem for the test's own reads."""

    name: str
    bucket: str
    conn_id: str
    conn: dict[str, Any]
    fs: Any
    secrets: list[str] = field(default_factory=list)
    #: secrets issued while the test ran (a GCS service account's access tokens)
    issued: Any = list

    @property
    def conn_kwargs(self) -> dict[str, str]:
        arg = {"s3": "aws_conn_id", "gs": "gcp_conn_id", "abfs": "azure_conn_id"}[self.name]
        return {arg: self.conn_id}

    @property
    def env(self) -> dict[str, str]:
        return {f"AIRFLOW_CONN_{self.conn_id.upper()}": json.dumps(self.conn)}

    def url(self, *parts: str) -> str:
        return "/".join([f"{self.name}://{self.bucket}", *parts])

    def write_input(self, folder: str, sizes: list[int]) -> None:
        start = 0
        for i, n in enumerate(sizes):
            with self.fs.open(f"{self.bucket}/{folder}/part-{i}.parquet", "wb") as f:
                pq.write_table(features_table(n, start), f, row_group_size=50)
            start += n

    def read_output(self, folder: str):
        self.fs.invalidate_cache()
        return pq.read_table(f"{self.bucket}/{folder}", filesystem=self.fs)


def _s3(s3_server) -> StoreUnderTest:
    import s3fs

    endpoint = s3_server["client_kwargs"]["endpoint_url"]
    password = "aws-secret-" + uuid.uuid4().hex
    conn = {
        "conn_type": "aws",
        "login": "AKIARAYBATCHTEST",
        "password": password,
        "extra": {
            "endpoint_url": endpoint,
            "region_name": "us-east-1",
            # Assumed through moto's STS: the task writes with the role's temporary credentials.
            "role_arn": "arn:aws:iam::123456789012:role/raybatch-writer",
            "assume_role_method": "assume_role",
            "service_config": {"sts": {"endpoint_url": endpoint}},
        },
    }
    return StoreUnderTest("s3", "raybatch-test", "s3_store", conn, s3fs.S3FileSystem(**s3_server), [password])


def _gs(gcs_server) -> StoreUnderTest:
    import gcsfs

    from tests.support.storage_servers import service_account_key

    key = service_account_key(gcs_server.extra["token_endpoint"].url)
    fs = gcsfs.GCSFileSystem(endpoint_url=gcs_server.endpoint, token="anon", project="raybatch-test")
    if not fs.exists("raybatch-test"):
        fs.mkdir("raybatch-test")
    conn = {
        "conn_type": "google_cloud_platform",
        "extra": {"keyfile_dict": json.dumps(key), "project": "raybatch-test", "endpoint_url": gcs_server.endpoint},
    }
    # A line from the middle of the PEM: the private key's body.
    private = key["private_key"].splitlines()[5]
    tokens = gcs_server.extra["token_endpoint"].tokens
    return StoreUnderTest("gs", "raybatch-test", "gcs_store", conn, fs, [private], lambda: list(tokens))


def _abfs(azure_server) -> StoreUnderTest:
    import adlfs

    account, key = azure_server.extra["account"], azure_server.extra["key"]
    connection_string = f"AccountName={account};AccountKey={key};BlobEndpoint={azure_server.endpoint};"
    fs = adlfs.AzureBlobFileSystem(connection_string=connection_string)
    if "raybatch-test" not in {p.rstrip("/") for p in fs.ls("")}:
        fs.mkdir("raybatch-test")
    conn = {"conn_type": "wasb", "login": account, "password": key, "host": azure_server.endpoint}
    return StoreUnderTest("abfs", "raybatch-test", "azure_store", conn, fs, [key])


@pytest.fixture(params=["s3", "gs", "abfs"])
def store(request, monkeypatch) -> StoreUnderTest:
    server = {"s3": "s3_server", "gs": "gcs_server", "abfs": "azure_server"}[request.param]
    built = {"s3": _s3, "gs": _gs, "abfs": _abfs}[request.param](request.getfixturevalue(server))
    for name, value in built.env.items():
        monkeypatch.setenv(name, value)
    return built


def resolved_secrets(store: StoreUnderTest, options: dict[str, Any]) -> list[str]:
    """The store's secrets: the connection's, and what its provider resolved (temporary keys, tokens)."""
    found = list(store.secrets)
    opts = options[store.name]
    if store.name == "s3":
        assert opts["key"].startswith("ASIA") and opts["key"] != store.conn["login"], "not the assumed role's keys"
        found += [opts["secret"], opts["token"]]
    return found + list(store.issued())


# --- conditional creates: the lease's one-winner guarantee -------------------------------------------


def test_a_second_create_of_one_name_is_refused(store, request):
    options = storage_options(**store.conn_kwargs)
    fs, path = resolve(store.url("create", uuid.uuid4().hex, "000000000001.json"), options)
    log = request.getfixturevalue("gcs_server").log if store.name == "gs" else None
    seen = len(log.read_text().splitlines()) if log else 0
    assert create_file(fs, path, b'{"holder": "first"}') is True
    second = create_file(fs, path, b'{"holder": "second"}')
    if store.name != "gs":
        assert second is False
        assert fs.cat(path) == b'{"holder": "first"}'
        return
    # gcp-storage-emulator ignores GCS preconditions: the second create overwrites (real GCS answers
    # 412). What can be checked here is that gcsfs sent the precondition real GCS enforces.
    assert second is True, "the emulator now honours ifGenerationMatch: update the README and this test"
    # The object's name travels in the multipart body: the two uploads are the log's new upload lines.
    uploads = [
        line for line in log.read_text().splitlines()[seen:] if "POST /upload/storage/v1/b/raybatch-test/o" in line
    ]
    assert len(uploads) == 2 and all("ifGenerationMatch=0" in line for line in uploads), uploads


def test_a_file_created_after_its_folder_was_listed_is_read_not_taken_as_missing(store):
    """A client that listed a folder keeps the listing: a file created there since (by another
    writer, or by this one's own create whose reply was lost) must still be read from the store."""
    options = storage_options(**store.conn_kwargs)
    folder = store.url("listed", uuid.uuid4().hex)
    fs, root = resolve(folder, options)
    assert create_file(fs, f"{root}/000000000001.json", b'{"n": 1}')
    assert ls(fs, root) == [f"{root}/000000000001.json"]  # the listing is cached now
    other, _ = resolve(folder, {store.name: {**options[store.name], "skip_instance_cache": True}})
    assert create_file(other, f"{root}/000000000002.json", b'{"n": 2}')
    assert read_json(fs, f"{root}/000000000002.json") == {"n": 2}
    assert holds(fs, f"{root}/000000000002.json", b'{"n": 2}')
    assert not absent(fs, f"{root}/000000000002.json")


# --- exactly once after a SIGKILL ------------------------------------------------------------------

RUN_SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
from airflow_provider_raybatch.hooks.object_stores import storage_options
from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
cfg = BatchInferenceConfig(sys.argv[1], sys.argv[2], [Stage("tests.support.predictors:score", batch_size=100)],
                           id_column="id", rows_per_range=100, storage_options=storage_options(**json.loads(sys.argv[3])))
print("SUMMARY " + json.dumps(run_batch_inference(cfg).to_dict()))
"""


@pytest.mark.usefixtures("ray_local")
def test_a_run_killed_between_publish_and_commit_resumes_exactly_once(store):
    run = uuid.uuid4().hex[:8]
    store.write_input(f"{run}/in", [300, 300, 200])
    src, out = store.url(run, "in"), store.url(run, "out")
    ray_tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")
    env = {
        **os.environ,
        "RAY_TMPDIR": ray_tmp,
        "PYTHONPATH": str(REPO),
        "RAYBATCH_TEST_CRASH": "published:3",
        "RAYBATCH_RECORD_INTERVAL_S": "0",
    }
    crashed = subprocess.run(
        [sys.executable, "-c", RUN_SCRIPT, src, out, json.dumps(store.conn_kwargs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    kill_ray_leftovers(ray_tmp)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-3000:] + crashed.stderr[-3000:]
    options = storage_options(**store.conn_kwargs)
    assert len(OutputLedger.open(out, options).committed()) == 2

    from airflow_provider_raybatch.pipeline.runner import run_batch_inference

    config = BatchInferenceConfig(
        src,
        out,
        [Stage("tests.support.predictors:score", batch_size=100)],
        id_column="id",
        rows_per_range=100,
        storage_options=options,
    )
    summary = run_batch_inference(config)
    assert summary.ranges_skipped == 2 and summary.ranges_done == 6 and summary.rows_processed == 600
    assert_exactly_once(store.read_output(f"{run}/out"), range(800))
    assert verify_output(out, options) == []
    again = run_batch_inference(config)
    assert again.ranges_skipped == 8 and again.rows_processed == 0


# --- the operator: credentials only in fsspec ---------------------------------------------------------


@pytest.mark.usefixtures("airflow_db")
def test_the_operator_reads_and_writes_the_store_and_no_secret_leaks(store, capfd):
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    from airflow_provider_raybatch.pipeline.job import entrypoint

    run = uuid.uuid4().hex[:8]
    store.write_input(f"{run}/in/2026-11-20", [120])
    dag_id = f"store_{store.name}_{run}"
    with DAG(dag_id, schedule=None, start_date=LOGICAL_DATE) as dag:
        RayBatchInferenceOperator(
            task_id="score",
            predictor="tests.support.predictors:score",
            input_path=store.url(run, "in", "{{ ds }}/"),
            output_path=store.url(run, "out", "{{ ds }}/"),
            id_column="id",
            rows_per_range=60,
            **store.conn_kwargs,
        )
    ti = run_dag(dag, LOGICAL_DATE).get_task_instance("score")
    assert ti.state == "success"
    summary = ti.xcom_pull(task_ids="score")
    assert summary["rows_out"] == 120 and summary["output_path"] == store.url(run, "out", "2026-11-20/")
    assert_exactly_once(store.read_output(f"{run}/out/2026-11-20"), range(120))

    options = storage_options(**store.conn_kwargs)
    secrets = resolved_secrets(store, options)
    if store.name == "gs":
        assert store.issued(), "the service account's token was never fetched"  # every one is checked below
    with create_session() as session:
        events = [
            e.extra
            for e in session.query(AssetEvent).all()
            if e.extra.get("output_path", "").startswith(store.url(run))
        ]
    assert events and events[-1]["rows_out"] == 120
    # Where a Ray Job would get the run: its entrypoint (the spec) holds no credential either.
    config = BatchInferenceConfig(
        store.url(run, "in"), store.url(run, "out"), [Stage("tests.support.predictors:score")], storage_options=options
    )
    job = entrypoint(config.to_spec(), "raybatch-x-0", None)
    bookkeeping = b"".join(store.fs.cat(p) for p in store.fs.find(f"{store.bucket}/{run}/out/2026-11-20/_raybatch"))
    logs = "".join(capfd.readouterr())
    for secret in secrets:
        assert secret not in json.dumps(summary)
        assert secret not in json.dumps(events)
        assert secret not in json.dumps(job)
        assert secret.encode() not in bookkeeping
        assert secret not in logs


# --- missing credentials: the task fails at once, naming the connection --------------------------


@pytest.mark.usefixtures("airflow_db")
def test_missing_or_empty_connections_fail_the_task_at_once_naming_them(tmp_path, monkeypatch, capfd):
    # No credentials anywhere in the environment, and no metadata servers to ask.
    for name in [k for k in os.environ if k.startswith(("AWS_", "AZURE_", "GOOGLE_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.setenv("AIRFLOW_CONN_AWS_EMPTY", json.dumps({"conn_type": "aws"}))
    monkeypatch.setenv("AIRFLOW_CONN_GCP_EMPTY", json.dumps({"conn_type": "google_cloud_platform"}))
    (tmp_path / "in").mkdir()
    cases = {
        "aws_missing": ({"aws_conn_id": "no_such_aws"}, "aws_conn_id='no_such_aws': no such Airflow connection"),
        "gcp_missing": ({"gcp_conn_id": "no_such_gcp"}, "gcp_conn_id='no_such_gcp': no such Airflow connection"),
        "azure_missing": (
            {"azure_conn_id": "no_such_azure"},
            "azure_conn_id='no_such_azure': no such Airflow connection",
        ),
        "aws_empty": (
            {"aws_conn_id": "aws_empty"},
            "aws_conn_id='aws_empty': the connection yields no AWS credentials",
        ),
        "gcp_empty": ({"gcp_conn_id": "gcp_empty"}, "gcp_conn_id='gcp_empty': the connection has no key"),
    }
    with DAG("missing_credentials", schedule=None, start_date=LOGICAL_DATE) as dag:
        for task_id, (conn, _) in cases.items():
            RayBatchInferenceOperator(
                task_id=task_id,
                predictor="tests.support.predictors:score",
                input_path=str(tmp_path / "in"),
                output_path=str(tmp_path / task_id),
                retries=2,
                **conn,
            )
    run = run_dag(dag, LOGICAL_DATE)
    logs = "".join(capfd.readouterr())
    for task_id, (_, message) in cases.items():
        ti = run.get_task_instance(task_id)
        assert ti.state == "failed" and ti.try_number == 1, task_id  # not retried: a retry fails the same way
        assert message in logs, (task_id, logs[-3000:])
        assert not (tmp_path / task_id).exists()  # failed before anything was written


# --- connections as their providers define them -----------------------------------------------------


@pytest.mark.usefixtures("airflow_db", "ray_local")
@pytest.mark.parametrize("flag", [True, "True"], ids=["json", "form_text"])
def test_an_anonymous_google_connection_reads_a_public_bucket_without_credentials(
    gcs_server, tmp_path, monkeypatch, flag
):
    # No credentials anywhere: only the connection's anonymous flag lets the run read.
    for name in [k for k in os.environ if k.startswith("GOOGLE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    extra = {"is_anonymous": flag, "endpoint_url": gcs_server.endpoint}
    monkeypatch.setenv("AIRFLOW_CONN_GCP_PUBLIC", json.dumps({"conn_type": "google_cloud_platform", "extra": extra}))
    store = _gs(gcs_server)
    run = uuid.uuid4().hex[:8]
    store.write_input(f"{run}/in", [150])

    options = storage_options(gcp_conn_id="gcp_public")
    assert options["gs"]["token"] == "anon" and "private_key" not in json.dumps(options, default=str)
    from airflow_provider_raybatch.pipeline.runner import run_batch_inference

    out = tmp_path / "out"
    config = BatchInferenceConfig(
        store.url(run, "in"),
        str(out),
        [Stage("tests.support.predictors:score", batch_size=100)],
        id_column="id",
        rows_per_range=100,
        storage_options=options,
    )
    assert run_batch_inference(config).rows_processed == 150
    assert_exactly_once(read_output(out), range(150))


# --- a Delta table on the store, through the same connection -------------------------------------------


def delta_options(store: StoreUnderTest, root: str) -> dict[str, str]:
    """delta-rs's options for ``root``, mapped from the fsspec options the store's connection gives."""
    from airflow_provider_raybatch.pipeline.store.urls import options_for
    from airflow_provider_raybatch.pipeline.tables.delta_storage import delta_storage_options

    return delta_storage_options(root, options_for(root, storage_options(**store.conn_kwargs)))


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("store", ["gs", "abfs"], indirect=True)
def test_a_delta_table_through_the_connection_gets_each_row_once(store, capfd):
    # gs: the emulator speaks the XML API calls delta-rs makes (tests/support/gcs_emulator.py).
    pytest.importorskip("deltalake")
    from deltalake import DeltaTable

    from airflow_provider_raybatch.pipeline.config import TableOutput
    from airflow_provider_raybatch.pipeline.output_ref import OutputRef
    from airflow_provider_raybatch.pipeline.runner import run_batch_inference
    from airflow_provider_raybatch.pipeline.tables.verify import verify_table

    run = uuid.uuid4().hex[:8]
    store.write_input(f"{run}/in", [150, 100])
    root = store.url(run, "table")
    options = storage_options(**store.conn_kwargs)
    config = BatchInferenceConfig(
        store.url(run, "in"),
        root,
        [Stage("tests.support.predictors:score", batch_size=100)],
        id_column="id",
        rows_per_range=100,
        storage_options=options,
        table=TableOutput("delta", {"ds": "2026-11-24"}, "daily.score"),
    )
    summary = run_batch_inference(config)
    assert summary.rows_out == 250 and summary.table_version is not None
    table = DeltaTable(root, storage_options=delta_options(store, root))
    rows = table.to_pyarrow_table()
    assert_exactly_once(rows, range(250))
    assert rows["ds"].unique().to_pylist() == ["2026-11-24"]
    assert verify_table(OutputRef.of(config)) == []

    again = run_batch_inference(config)
    assert again.ranges_skipped == summary.ranges_total and again.rows_processed == 0
    assert again.table_version == summary.table_version  # nothing committed
    assert DeltaTable(root, storage_options=delta_options(store, root)).version() == table.version()
    logs = "".join(capfd.readouterr())
    for secret in store.secrets:
        assert secret not in logs


# --- an Iceberg table on the store, through the same connection ---------------------------------------


def iceberg_catalog(store: StoreUnderTest, root: str, catalog: dict[str, str]):
    """The table's catalog with pyiceberg's FileIO properties for ``root``, mapped from the fsspec options
    the store's connection gives (as the writer gets them)."""
    from airflow_provider_raybatch.pipeline.store.urls import options_for
    from airflow_provider_raybatch.pipeline.tables.iceberg import load_catalog
    from airflow_provider_raybatch.pipeline.tables.iceberg_storage import file_io_properties

    io = file_io_properties(root, options_for(root, storage_options(**store.conn_kwargs)))
    assert io["py-io-impl"] == "pyiceberg.io.fsspec.FsspecFileIO"
    return load_catalog({**io, **catalog})


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("store", ["gs", "abfs"], indirect=True)
def test_an_iceberg_table_through_the_connection_gets_each_row_once(store, tmp_path, capfd):
    """The table's data and metadata on the store, reached with the connection's credentials only (no
    environment credentials here: GCS through the service account's tokens from the loopback token
    endpoint, Azure through the account key); the SQL catalog on SQLite."""
    pytest.importorskip("pyiceberg")
    from airflow_provider_raybatch.pipeline.config import TableOutput
    from airflow_provider_raybatch.pipeline.output_ref import OutputRef
    from airflow_provider_raybatch.pipeline.runner import run_batch_inference
    from airflow_provider_raybatch.pipeline.tables.verify import verify_table

    run = uuid.uuid4().hex[:8]
    store.write_input(f"{run}/in", [150, 100])
    root = store.url(run, "table")
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": store.url(run, "warehouse")}
    config = BatchInferenceConfig(
        store.url(run, "in"),
        root,
        [Stage("tests.support.predictors:score", batch_size=100)],
        id_column="id",
        rows_per_range=100,
        storage_options=storage_options(**store.conn_kwargs),
        table=TableOutput("iceberg", {"ds": "2026-11-24"}, "daily.score", identifier="daily.scores", catalog=catalog),
    )
    issued = len(store.issued())
    summary = run_batch_inference(config)
    assert summary.rows_out == 250 and summary.table_version is not None
    table = iceberg_catalog(store, root, catalog).load_table("daily.scores")
    assert table.metadata_location.startswith(f"{root}/metadata/")  # the metadata on the store too
    rows = table.scan().to_arrow()
    assert_exactly_once(rows, range(250))
    assert rows["ds"].unique().to_pylist() == ["2026-11-24"]
    assert verify_table(OutputRef.of(config)) == []
    if store.name == "gs":
        assert len(store.issued()) > issued, "no token was issued for the service account: not its credentials"

    again = run_batch_inference(config)
    assert again.ranges_skipped == summary.ranges_total and again.rows_processed == 0
    assert again.table_version == summary.table_version  # nothing committed
    table = iceberg_catalog(store, root, catalog).load_table("daily.scores")
    assert table.current_snapshot().snapshot_id == summary.table_version
    assert_exactly_once(table.scan().to_arrow(), range(250))
    logs = "".join(capfd.readouterr())
    for secret in [*store.secrets, *store.issued()]:
        assert secret not in logs


@pytest.mark.parametrize("store", ["gs", "abfs"], indirect=True)
def test_the_store_refuses_a_second_writer_of_one_delta_log_version(store, request):
    """Writers racing for the table's next version: the store refuses all but one, each loser commits
    after the winner, and no commit is lost. (Without the refusal a loser overwrites the winner's
    version: on a GCS emulator that ignores the precondition, 4 of 20 such commits were lost.)"""
    pytest.importorskip("deltalake")
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    server = request.getfixturevalue({"gs": "gcs_server", "abfs": "azure_server"}[store.name])
    root = store.url(uuid.uuid4().hex[:8], "race")
    table_options = delta_options(store, root)
    write_deltalake(root, pa.table({"id": pa.array([], pa.int64())}), storage_options=table_options)
    seen = len(server.log.read_text().splitlines())
    writers, commits = 4, 5

    def write(w: int) -> None:
        for k in range(commits):
            write_deltalake(root, pa.table({"id": [w * commits + k]}), storage_options=table_options, mode="append")

    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(write, range(writers)))
    table = DeltaTable(root, storage_options=table_options)
    assert table.version() == writers * commits
    assert_exactly_once(table.to_pyarrow_table(), range(writers * commits))
    # The race did happen: log versions' creates refused (GCS: 412 Precondition Failed; Azure: 409 Conflict).
    refused = [
        line
        for line in server.log.read_text().splitlines()[seen:]
        if '"PUT ' in line
        and ("delta_log" in line or "%5Fdelta%5Flog" in line)
        and (" 412 " in line or " 409 " in line)
    ]
    assert refused, "no writer lost a race: nothing was checked"
