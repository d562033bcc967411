"""Operators writing Delta and Iceberg tables in a real Airflow (`dag.test()`) on a real local Ray:
one partition per logical date, reruns that add nothing, the Iceberg catalog from a connection
(the embedded SQLite default, and a real PostgreSQL server)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from airflow.sdk import DAG

from airflow_provider_raybatch.hooks.iceberg_catalog import IcebergCatalogHook, embedded_catalog
from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator
from tests.conftest import run_dag
from tests.support.data import assert_exactly_once, write_input
from tests.support.tables import IDENTIFIER, read_table

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
            keep_columns=["group"],
            rows_per_range=100,
            **kwargs,
        )
    return dag


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
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


def test_mapped_partitions_of_a_table_output_are_refused_when_the_dag_is_parsed(tmp_path):
    with pytest.raises(ValueError, match="plan: a delta output does not take mapped partitions"):
        RayBatchInferenceOperator(
            task_id="plan",
            predictor="m:f",
            input_path="/in",
            output_path="/table",
            output_format="delta",
            plan_partitions=4,
        )
