"""LLMBatchInferenceOperator in a real Airflow (`dag.test()`) on a real local Ray: the example DAG
(choices on a few hundred rows), an OpenAI-compatible endpoint on loopback, and the failures that
must not be retried (vLLM unavailable, too many engine errors)."""

from __future__ import annotations

import json
import zlib

import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.examples import llm_data
from airflow_provider_raybatch.operators.llm_batch_inference import LLMBatchInferenceOperator
from tests.conftest import run_dag
from tests.support.example_dags import load_dag
from tests.support.llm_dags import LOGICAL_DATE, classify_dag
from tests.support.openai_server import OpenAIServer, completion

pytestmark = pytest.mark.usefixtures("ray_local", "airflow_db")


def test_the_example_dag_answers_every_company_with_one_of_the_choices(tmp_path, tiny_models):
    rows = llm_data.write_companies(tmp_path / "companies", 300)
    conf = {"data_root": str(tmp_path), "model": str(tiny_models["qwen2"])}
    run = run_dag(load_dag("llm_classify"), LOGICAL_DATE, conf=conf)
    summary = run.get_task_instance("classify").xcom_pull(task_ids="classify")
    assert summary["rows_out"] == rows and summary["rows_rejected"] == 0
    out = pq.read_table(tmp_path / "industries")
    assert out.column_names == ["id", "Company", "true_industry", "industry"]
    assert sorted(out["id"].to_pylist()) == list(range(rows))
    assert set(out["industry"].to_pylist()) <= set(llm_data.INDUSTRIES) and out["industry"].null_count == 0


def test_openai_engine_with_choices_rejects_errors_and_out_of_choice_answers(tmp_path, monkeypatch, capfd):
    names = llm_data.companies_table(100)["Company"].to_pylist()
    refused_names, outside_names = {names[3], names[40]}, {names[10], names[77]}

    def respond(body):
        company = body["messages"][-1]["content"].rsplit(": ", 1)[1]
        assert body["response_format"]["json_schema"]["schema"]["properties"]["answer"]["enum"] == llm_data.INDUSTRIES
        if company in refused_names:
            return 400, {"error": {"message": f"refused {company}"}}
        usage = (len(company), 3)  # the endpoint's own count of what the row cost
        if company in outside_names:
            return 200, completion(json.dumps({"answer": "Mining"}), usage)  # a server that ignores the schema
        pick = llm_data.INDUSTRIES[zlib.crc32(company.encode()) % len(llm_data.INDUSTRIES)]
        return 200, completion(json.dumps({"answer": pick}), usage)

    llm_data.write_companies(tmp_path / "companies", 100)
    refused = [i for i, n in enumerate(names) if n in refused_names]
    outside = [i for i, n in enumerate(names) if n in outside_names]
    with OpenAIServer(respond) as server:
        conn = {"conn_type": "http", "host": server.base_url.replace("http://", ""), "schema": "http", "password": "k"}
        monkeypatch.setenv("AIRFLOW_CONN_OPENAI_TEST", json.dumps(conn))
        ok = classify_dag(
            tmp_path,
            "openai_ok",
            engine="openai",
            model="m",
            openai_conn_id="openai_test",
            max_error_fraction=0.5,
            token_columns=True,
        )
        run = run_dag(ok, LOGICAL_DATE)
        strict = classify_dag(
            tmp_path, "openai_strict", engine="openai", model="m", openai_conn_id="openai_test", token_columns=True
        )
        failed = run_dag(strict, LOGICAL_DATE)
    summary = run.get_task_instance("classify").xcom_pull(task_ids="classify")
    assert summary["engine_errors"] == len(refused) + len(outside)
    out = pq.read_table(tmp_path / "out")
    assert set(out["industry"].to_pylist()) <= set(llm_data.INDUSTRIES)
    rejects = pq.read_table(tmp_path / "out" / "_rejects").to_pylist()
    by_id = {r["id"]: r for r in rejects}
    assert sorted(by_id) == sorted(refused + outside)
    assert by_id[refused[0]]["reason"] == f"the endpoint returned an error: refused {names[refused[0]]}"
    assert by_id[outside[0]]["reason"] == "the answer 'Mining' is not one of the choices"
    assert sorted(out["id"].to_pylist() + list(by_id)) == list(range(100))
    # Tokens from the endpoint's usage: each answered row's, and the out-of-choice answers' (spent
    # too); the refused requests reported none.
    assert out["num_input_tokens"].to_pylist() == [len(n) for n in out["Company"].to_pylist()]
    counted = [n for i, n in enumerate(names) if i not in refused]
    assert (summary["tokens_in"], summary["tokens_out"]) == (sum(map(len, counted)), 3 * len(counted))
    # The same output with the default 1 %: the committed errors fail the task, without retries.
    ti = failed.get_task_instance("classify")
    assert ti.state == "failed" and ti.try_number == 1
    assert "more than max_error_fraction=0.01" in "".join(capfd.readouterr())


def test_vllm_unavailable_fails_at_once_without_retries(tmp_path, capfd):
    llm_data.write_companies(tmp_path / "companies", 20)
    run = run_dag(
        classify_dag(tmp_path, "vllm_missing", engine="vllm", model="Qwen/Qwen2.5-0.5B-Instruct"), LOGICAL_DATE
    )
    ti = run.get_task_instance("classify")
    assert ti.state == "failed" and ti.try_number == 1
    assert "engine='vllm' needs the vllm package where the job runs" in "".join(capfd.readouterr())
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("part-*"))


def test_memory_and_ray_resources_reach_the_engine_stage_and_the_resource_check(tmp_path, capfd):
    operator = LLMBatchInferenceOperator(
        task_id="resources",
        input_path=str(tmp_path / "companies"),
        output_path=str(tmp_path / "out"),
        prompt="What industry is this company in: {Company}",
        model="m",
        engine="transformers",
        concurrency=[1, 2],  # as a Param renders it
        memory=2**30,
        ray_resources={"big_node": 1},
    )
    (stage,) = operator.build_stages({})
    assert (stage.memory, stage.resources, stage.concurrency) == (2**30, {"big_node": 1}, (1, 2))
    # In a run, the resource check reads them: no node offers big_node, so the task fails at once.
    llm_data.write_companies(tmp_path / "companies", 20)
    dag = classify_dag(tmp_path, "llm_resources", engine="transformers", model="m", ray_resources={"big_node": 1})
    ti = run_dag(dag, LOGICAL_DATE).get_task_instance("classify")
    assert ti.state == "failed" and ti.try_number == 1
    assert "stage 'transformers' asks for resources {'big_node': 1}" in "".join(capfd.readouterr())
