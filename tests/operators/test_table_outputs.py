"""Operators writing Delta and Iceberg tables in a real Airflow (`dag.test()`) on a real local Ray:
one partition per logical date, reruns that add nothing, the Iceberg catalog from a connection
(the embedded SQLite default, and a real PostgreSQL server).

Each test here checks what Airflow brings (logical dates, reruns, mapped tasks, connections) on one format: both
formats' commits, partitions, schema changes and mapped shards are tested in tests/pipeline/tables/, and the
operator hands either format to the same pipeline."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow.compute as pc
import pytest
from airflow.sdk import DAG

from airflow_provider_raybatch.hooks.iceberg_catalog import IcebergCatalogHook, embedded_catalog
from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator
from tests.conftest import run_dag
from tests.support.data import assert_exactly_once, write_input
from tests.support.tables import IDENTIFIER, read_table, snapshot_files

pytestmark = pytest.mark.usefixtures("ray_local", "airflow_db")
DAY_1, DAY_2 = datetime(2026, 11, 23, tzinfo=UTC), datetime(2026, 11, 24, tzinfo=UTC)


def daily_dag(tmp_path, fmt: str, dag_id: str, **kwargs) -> DAG:
    with DAG(dag_id, schedule="@daily", start_date=DAY_1, catchup=False) as dag:
        RayBatchInferenceOperator(
            task_id="score",
            predictor="tests.support.predictors:score",
            input_path=str(tmp_path / "in"),
            output_path=str(tmp_path / "table"),
            output_format=fmt,
            table=IDENTIFIER if fmt == "iceberg" else None,
            id_column="id",
            rows_per_range=100,
            **{"keep_columns": ["group"], **kwargs},
        )
    return dag


def own_catalog(tmp_path, monkeypatch) -> dict:
    """An Iceberg catalog of the test's own, connection ``iceberg_tmp`` (SQLite in ``tmp_path``): its
    tables are the test's alone (the embedded one is the session's). Returns its properties."""
    sqlite = {"conn_type": "sqlite", "host": f"{tmp_path}/catalog.db", "extra": {"warehouse": f"file://{tmp_path}/wh"}}
    monkeypatch.setenv("AIRFLOW_CONN_ICEBERG_TMP", json.dumps(sqlite))
    return IcebergCatalogHook("iceberg_tmp").catalog_properties()


@pytest.mark.parametrize("fmt", ["iceberg"])  # on the embedded catalog, which only this test uses
def test_a_daily_dag_writes_a_partition_per_date_once(tmp_path, fmt):
    pytest.importorskip("deltalake" if fmt == "delta" else "pyiceberg")
    write_input(tmp_path / "in", [250])
    # Iceberg without a connection: the embedded SQL catalog on SQLite under $AIRFLOW_HOME.
    dag = daily_dag(tmp_path, fmt, f"daily_{fmt}_table", iceberg_conn_id=None)
    summaries = {}
    for day in (DAY_1, DAY_2, DAY_1):  # the last: the first date's task again, as a clear would run it
        run = run_dag(dag, day)
        ti = run.get_task_instance("score")
        assert ti.state == "success"
        summaries.setdefault(day, []).append(ti.xcom_pull(task_ids="score"))
    catalog = embedded_catalog() if fmt == "iceberg" else None
    for day in (DAY_1, DAY_2):
        assert_exactly_once(read_table(tmp_path, fmt, day.strftime("%Y-%m-%d"), catalog), range(250))
    first, again = summaries[DAY_1]
    assert first["rows_out"] == 250 and first["table_version"] is not None
    assert again["ranges_skipped"] == 3 and again["rows_processed"] == 0
    # The table's newest version is the second date's: the rerun committed nothing.
    assert again["table_version"] == summaries[DAY_2][0]["table_version"]


@pytest.mark.parametrize("fmt", ["delta"])
def test_table_add_columns_lets_a_rerun_add_the_column_the_table_lacks(tmp_path, fmt, monkeypatch):
    pytest.importorskip("deltalake" if fmt == "delta" else "pyiceberg")
    write_input(tmp_path / "in", [200])
    own_catalog(tmp_path, monkeypatch)
    dag_id, args = f"add_columns_{fmt}", {"iceberg_conn_id": "iceberg_tmp"}
    wider = {**args, "keep_columns": ["group", "features"]}
    assert run_dag(daily_dag(tmp_path, fmt, dag_id, **args), DAY_1).get_task_instance("score").state == "success"
    refused = run_dag(daily_dag(tmp_path, fmt, dag_id, **wider), DAY_2).get_task_instance("score")
    assert refused.state == "failed"
    catalog = IcebergCatalogHook("iceberg_tmp").catalog_properties()
    assert read_table(tmp_path, fmt, DAY_2.strftime("%Y-%m-%d"), catalog).num_rows == 0
    # The DAG fixed with the option, and the date's task cleared: its staged rows join the table.
    fixed = run_dag(daily_dag(tmp_path, fmt, dag_id, table_add_columns=True, **wider), DAY_2)
    assert fixed.get_task_instance("score").state == "success"
    rows = read_table(tmp_path, fmt, catalog=catalog)
    for day, has_features in ((DAY_1, False), (DAY_2, True)):
        date = rows.filter(pc.equal(rows["ds"], day.strftime("%Y-%m-%d")))
        assert_exactly_once(date, range(200))
        assert date["features"].null_count == (0 if has_features else 200)


def test_an_iceberg_catalog_on_postgresql_from_a_connection(tmp_path, monkeypatch):
    pytest.importorskip("pyiceberg")
    pytest.importorskip("psycopg2")
    from tests.support.postgres import postgres_server

    write_input(tmp_path / "in", [200])
    with postgres_server(database="catalog", user="iceberg") as server:
        connection = {
            "conn_type": "postgres",
            "host": "127.0.0.1",
            "port": server.port,
            "login": server.user,
            "password": server.password,
            "schema": server.database,
            "extra": {"warehouse": f"file://{tmp_path}/warehouse"},
        }
        monkeypatch.setenv("AIRFLOW_CONN_ICEBERG_PG", json.dumps(connection))
        properties = IcebergCatalogHook("iceberg_pg").catalog_properties()
        assert properties["type"] == "sql" and properties["uri"].startswith("postgresql+psycopg2://iceberg:")
        run = run_dag(daily_dag(tmp_path, "iceberg", "iceberg_on_postgres", iceberg_conn_id="iceberg_pg"), DAY_2)
        ti = run.get_task_instance("score")
        assert ti.state == "success"
        assert server.password not in json.dumps(ti.xcom_pull(task_ids="score"))
        assert_exactly_once(read_table(tmp_path, "iceberg", "2026-11-24", properties), range(200))
        # The catalog's tables are in PostgreSQL.
        assert server.query("SELECT table_namespace, table_name FROM iceberg_tables") == [("predictions", "scores")]


@pytest.mark.parametrize("fmt", ["delta"])
def test_a_mapped_run_writes_its_date_of_the_table_from_every_shard_once(tmp_path, fmt, monkeypatch):
    """A planning task and its mapped tasks write one date of the table: every row once, and the
    date's rerun with mode="overwrite" replaces it in one commit (made by the last mapped task)."""
    pytest.importorskip("deltalake" if fmt == "delta" else "pyiceberg")
    write_input(tmp_path / "in", [250])
    common = {
        "predictor": "tests.support.predictors:score",
        "input_path": str(tmp_path / "in"),
        "output_path": str(tmp_path / "table"),
        "output_format": fmt,
        "table": IDENTIFIER if fmt == "iceberg" else None,
        "iceberg_conn_id": "iceberg_tmp",
        "id_column": "id",
        "rows_per_range": 50,
        "keep_columns": ["group"],
        "mode": "overwrite",
    }
    with DAG(f"mapped_{fmt}_table", schedule="@daily", start_date=DAY_1, catchup=False) as dag:
        plan = RayBatchInferenceOperator(task_id="plan", plan_shards=2, **common)
        RayBatchInferenceOperator.partial(task_id="score", **common).expand(shard=plan.output)
    catalog = own_catalog(tmp_path, monkeypatch)
    for rows in (250, 150):  # the second time on new input: the date is replaced
        write_input(tmp_path / "in", [rows])
        run = run_dag(dag, DAY_2)
        scores = [ti for ti in run.get_task_instances() if ti.task_id == "score"]
        assert len(scores) == 2 and all(ti.state == "success" for ti in scores)
        assert_exactly_once(read_table(tmp_path, fmt, "2026-11-24", catalog), range(rows))
    # One writer for the date (the planning task's), in its second generation.
    writers = {p.parent.name for p in (tmp_path / "table").glob("ds=2026-11-24/*/g*")}
    assert len(writers) == 1 and next(iter(writers)).startswith(f"mapped_{fmt}_table.plan-")
    assert all("/g1/" in f for f in snapshot_files(tmp_path, fmt, catalog))
