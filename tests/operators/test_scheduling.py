"""What the operator gives Airflow's scheduling: an Asset event with the summary, lineage,
mapped shards equal to one task, progress in the task log, fast failures on bad paths.
All on a real Airflow (`dag.test()`) and a real local Ray."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from airflow.sdk import DAG, Asset, task

from airflow_provider_raybatch.assets import default_asset
from airflow_provider_raybatch.lineage import dataset_name
from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator
from airflow_provider_raybatch.version_compat import AirflowFailException
from tests.conftest import REPO, run_dag
from tests.support.assets import asset_events
from tests.support.data import assert_exactly_once, read_output, write_input

LOGICAL_DATE = datetime(2026, 11, 20, tzinfo=UTC)
ROWS = [430, 270]


@pytest.mark.usefixtures("ray_local", "airflow_db")
def test_the_output_asset_event_carries_the_summary(tmp_path, caplog):
    write_input(tmp_path / "in" / "2026-11-20", ROWS)
    with DAG("asset_summary", schedule=None, start_date=LOGICAL_DATE) as dag:
        operator = RayBatchInferenceOperator(
            task_id="score",
            predictor="tests.support.predictors:score",
            input_path=str(tmp_path / "in" / "{{ ds }}"),
            output_path=str(tmp_path / "out" / "{{ ds }}"),
            id_column="id",
            rows_per_range=100,
        )
    asset = Asset(uri=f"file://{tmp_path}/out")
    assert operator.outlets == [asset]  # derived from the static part of output_path

    with caplog.at_level(logging.INFO, logger="airflow_provider_raybatch"):
        run = run_dag(dag, LOGICAL_DATE)
    summary = run.get_task_instance("score").xcom_pull(task_ids="score")
    assert summary["output_path"] == str(tmp_path / "out" / "2026-11-20")
    (event,) = asset_events(asset.uri)
    assert event == {"extra": summary, "task_id": "score"}
    # Progress lines reach the task's log: ranges, rows, rate and time left.
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Committed ")]
    assert progress and progress[-1].startswith("Committed 8/8 ranges, 700/700 rows, ")
    assert " rows/s, about " in progress[-1] and progress[-1].endswith("s left")


def test_default_asset_is_the_static_part_of_the_output_path():
    assert default_asset("/data/preds/{{ ds }}/") == Asset(uri="file:///data/preds")
    assert default_asset("/data/preds/day={{ ds }}") == Asset(uri="file:///data/preds")
    assert default_asset("/data/preds/") == Asset(uri="file:///data/preds")
    assert default_asset("s3://bucket/preds/{{ ds }}/") == Asset(uri="s3://bucket/preds")
    # Every object store alike, under its canonical scheme.
    assert default_asset("gs://bucket/preds/{{ ds }}/") == Asset(uri="gs://bucket/preds")
    assert default_asset("gcs://bucket/preds/{{ ds }}") == Asset(uri="gs://bucket/preds")
    assert default_asset("abfs://container/preds/{{ ds }}/") == Asset(uri="abfs://container/preds")
    assert default_asset("az://container/preds/day={{ ds }}") == Asset(uri="abfs://container/preds")
    for no_static_part in (
        "{{ params.root }}/out/{{ ds }}",
        "s3://{{ var.value.bucket }}/x",
        "gs://{{ var.value.bucket }}/x",
        "abfs://{{ var.value.container }}/x",
        "relative/{{ ds }}",
        "/",
    ):
        assert default_asset(no_static_part) is None
    explicit = RayBatchInferenceOperator(
        task_id="a", input_path="/i", output_path="/o", predictor="m:f", asset="s3://b/x"
    )
    assert explicit.outlets == [Asset("s3://b/x")]
    assert (
        RayBatchInferenceOperator(task_id="b", input_path="/i", output_path="/o", predictor="m:f", asset=None).outlets
        == []
    )
    planning = RayBatchInferenceOperator(task_id="c", input_path="/i", output_path="/o", predictor="m:f", plan_shards=2)
    assert planning.outlets == []


def test_openlineage_datasets_follow_the_naming_conventions():
    assert dataset_name("/data/in/2026-11-20/") == ("file", "/data/in/2026-11-20")
    assert dataset_name("file:///data/in") == ("file", "/data/in")
    assert dataset_name("s3://bucket/in/2026-11-20/") == ("s3://bucket", "in/2026-11-20")
    assert dataset_name("s3a://bucket/in/*.parquet") == ("s3://bucket", "in")
    assert dataset_name("/data/in/part-*.parquet") == ("file", "/data/in")
    assert dataset_name("gs://bucket/x") == ("gs://bucket", "x")
    assert dataset_name("gcs://bucket/in/*.parquet") == ("gs://bucket", "in")
    assert dataset_name("abfs://container/in/2026-11-20/") == ("abfs://container", "in/2026-11-20")
    assert dataset_name("az://container/in") == ("abfs://container", "in")
    assert dataset_name("abfss://container@account.dfs.core.windows.net/in/") == (
        "abfs://container@account.dfs.core.windows.net",
        "in",
    )


def test_openlineage_facets_on_complete():
    pytest.importorskip("airflow.providers.openlineage", reason="the OpenLineage provider is optional")
    operator = RayBatchInferenceOperator(
        task_id="score", input_path="s3://bucket/in/2026-11-20/", output_path="/data/out/2026-11-20/", predictor="m:f"
    )
    lineage = operator.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("s3://bucket", "in/2026-11-20")]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("file", "/data/out/2026-11-20")]


def test_an_iceberg_output_is_its_location_with_its_catalog_table_as_a_symlink(monkeypatch):
    pytest.importorskip("airflow.providers.openlineage", reason="the OpenLineage provider is optional")
    catalog = {"conn_type": "postgres", "host": "db.internal", "port": 5432, "login": "u", "password": "s3cret"}
    monkeypatch.setenv("AIRFLOW_CONN_CATALOG", json.dumps({**catalog, "schema": "iceberg"}))
    operator = RayBatchInferenceOperator(
        task_id="score",
        input_path="/data/in",
        output_path="s3://lake/preds",
        output_format="iceberg",
        table="ml.preds",
        iceberg_conn_id="catalog",
        predictor="m:f",
    )
    (output,) = operator.get_openlineage_facets_on_complete(None).outputs
    assert (output.namespace, output.name) == ("s3://lake", "preds")
    (symlink,) = output.facets["symlinks"].identifiers
    assert (symlink.namespace, symlink.name, symlink.type) == (
        "postgresql://db.internal:5432/iceberg",
        "ml.preds",
        "TABLE",
    )


# What the operator would import from OpenLineage fails to import, as where it is not installed.
BLOCK_OPENLINEAGE = """
import sys

BLOCKED = ("airflow.providers.openlineage.extractors", "openlineage.")

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, Block())
from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

op = RayBatchInferenceOperator(task_id="t", input_path="/i", output_path="/o", predictor="m:f")
assert op.get_openlineage_facets_on_complete(None) is None
assert not [m for m in sys.modules if m.startswith(BLOCKED)]
print("ok")
"""


def test_the_operator_works_without_the_openlineage_provider():
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_OPENLINEAGE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.usefixtures("ray_local", "airflow_db")
def test_mapped_shards_write_exactly_what_one_task_writes(tmp_path):
    write_input(tmp_path / "in" / "2026-11-20", ROWS)
    common = {
        "predictor": "tests.support.predictors:score",
        "input_path": str(tmp_path / "in" / "{{ ds }}"),
        "id_column": "id",
        "keep_columns": ["group"],
        "rows_per_range": 100,
        "mode": "overwrite",
    }
    mapped_out = str(tmp_path / "mapped" / "{{ ds }}")
    with DAG("mapped_vs_unmapped", schedule=None, start_date=LOGICAL_DATE) as dag:
        RayBatchInferenceOperator(task_id="whole", output_path=str(tmp_path / "whole" / "{{ ds }}"), **common)
        plan = RayBatchInferenceOperator(task_id="plan", output_path=mapped_out, plan_shards=3, **common)
        mapped = RayBatchInferenceOperator.partial(task_id="part", output_path=mapped_out, **common).expand(
            shard=plan.output
        )

        @task
        def combine(summaries):
            from airflow_provider_raybatch.pipeline.summary import RunSummary

            return RunSummary.combine(summaries).to_dict()

        combine(mapped.output)

    run = run_dag(dag, LOGICAL_DATE)
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
    assert states == {
        ("whole", -1): "success",
        ("plan", -1): "success",
        **{("part", i): "success" for i in range(3)},
        ("combine", -1): "success",
    }
    ti = run.get_task_instance("combine")
    shards = ti.xcom_pull(task_ids="plan")
    assert [len(p["range_ids"]) for p in shards] == [2, 3, 3]  # 5 + 3 ranges, as equal as can be
    combined = ti.xcom_pull(task_ids="combine")
    whole_summary = ti.xcom_pull(task_ids="whole")
    for key in ("rows_in", "rows_out", "rows_processed", "ranges_total", "ranges_done"):
        assert combined[key] == whole_summary[key], key
    assert combined["shards"] == 3

    whole, parts = tmp_path / "whole" / "2026-11-20", tmp_path / "mapped" / "2026-11-20"
    assert sorted(p.name for p in parts.glob("part-*")) == sorted(p.name for p in whole.glob("part-*"))
    one, many = read_output(whole).sort_by("id"), read_output(parts).sort_by("id")
    assert_exactly_once(many, range(sum(ROWS)))
    assert many.equals(one)


@pytest.mark.usefixtures("ray_local", "airflow_db")
def test_a_dag_written_with_the_old_argument_names_still_maps_its_shards(tmp_path):
    """``plan_partitions``, ``.expand(partition=...)`` and a ``map_index_template`` reading ``task.partition``."""
    write_input(tmp_path / "in" / "2026-11-20", [300])
    common = {
        "predictor": "tests.support.predictors:score",
        "input_path": str(tmp_path / "in" / "{{ ds }}"),
        "output_path": str(tmp_path / "out" / "{{ ds }}"),
        "id_column": "id",
        "rows_per_range": 100,
    }
    with DAG("mapped_with_old_names", schedule=None, start_date=LOGICAL_DATE) as dag:
        plan = RayBatchInferenceOperator(task_id="plan", plan_partitions=2, **common)
        RayBatchInferenceOperator.partial(
            task_id="part", map_index_template="partition {{ task.partition['index'] }}", **common
        ).expand(partition=plan.output)

    run = run_dag(dag, LOGICAL_DATE)
    parts = sorted(
        (ti.map_index, ti.state, ti.rendered_map_index) for ti in run.get_task_instances() if ti.task_id == "part"
    )
    assert parts == [(0, "success", "partition 0"), (1, "success", "partition 1")]
    assert_exactly_once(read_output(tmp_path / "out" / "2026-11-20"), range(300))


def test_a_relative_path_fails_the_task_at_once_naming_the_argument(tmp_path):
    operator = RayBatchInferenceOperator(
        task_id="bad",
        predictor="tests.support.predictors:score",
        input_path=str(tmp_path),
        output_path="out/x",
        retries=3,
    )
    context = {
        "ti": type("TI", (), {"dag_id": "d", "run_id": "r", "task_id": "bad", "map_index": -1, "try_number": 1})()
    }
    with pytest.raises(AirflowFailException, match="output_path must be an absolute path or a URL"):
        operator.execute(context)
    operator.plan_shards = 2
    with pytest.raises(AirflowFailException, match="output_path must be an absolute path or a URL"):
        operator.execute(context)


def test_a_lease_timeout_below_the_floor_fails_the_task_at_once_naming_it(tmp_path):
    write_input(tmp_path / "in", [10])
    operator = RayBatchInferenceOperator(
        task_id="short_lease",
        predictor="tests.support.predictors:score",
        input_path=str(tmp_path / "in"),
        output_path=str(tmp_path / "out"),
        lease_timeout=2,
    )
    context = {
        "ti": type(
            "TI", (), {"dag_id": "d", "run_id": "r", "task_id": "short_lease", "map_index": -1, "try_number": 1}
        )()
    }
    with pytest.raises(AirflowFailException, match="lease_timeout must be a number of seconds >= 30, got 2"):
        operator.execute(context)
    assert not (tmp_path / "out").exists()


def test_resources_rendered_as_text_are_read_as_numbers_and_bad_text_fails_the_task_at_once_naming_it(tmp_path):
    """Without render_template_as_native_obj, "{{ params.batch_size }}" renders as text."""
    write_input(tmp_path / "in", [10])
    operator = RayBatchInferenceOperator(
        task_id="text",
        predictor="tests.support.predictors:score",
        input_path=str(tmp_path / "in"),
        output_path=str(tmp_path / "out"),
        batch_size="256",
        concurrency="[1, 2]",
        num_cpus="0.5",
        num_gpus="0",
    )
    resources = operator.replica_resources()
    assert (resources.batch_size, resources.concurrency, resources.num_cpus, resources.num_gpus) == (
        256,
        [1, 2],
        0.5,
        0,
    )
    context = {
        "ti": type("TI", (), {"dag_id": "d", "run_id": "r", "task_id": "text", "map_index": -1, "try_number": 1})()
    }
    operator.batch_size = "many"
    with pytest.raises(AirflowFailException, match="batch_size must be an integer >= 1 or None, got 'many'"):
        operator.execute(context)
    operator.batch_size, operator.concurrency = "256", "lots"
    with pytest.raises(AirflowFailException, match="concurrency must be"):
        operator.execute(context)
    assert not (tmp_path / "out").exists()
    # A Param that is None renders "None": the default, replicas decided by the CPUs.
    operator.concurrency = "None"
    assert operator.replica_resources().concurrency is None


def test_the_operator_s_replicas_default_to_what_the_cpus_hold():
    operator = RayBatchInferenceOperator(
        task_id="defaults", predictor="tests.support.predictors:score", input_path="/in", output_path="/out"
    )
    assert operator.replica_resources().concurrency is None and operator.replica_resources().num_cpus == 1
