"""VLMCaptionOperator in a real Airflow (`dag.test()`) on a real local Ray: the example DAG with
the transformers engine, and an OpenAI-compatible endpoint on loopback with a secret key."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
from datetime import UTC, datetime

import pyarrow.parquet as pq
import pytest
from airflow.sdk import DAG

from airflow_provider_raybatch.examples import llm_data
from airflow_provider_raybatch.operators.vlm_caption import DEFAULT_PROMPT, DEFAULT_SYSTEM_PROMPT, VLMCaptionOperator
from tests.conftest import REPO, run_dag
from tests.support.llm_images import CORRUPT, write_images
from tests.support.openai_server import OpenAIServer, completion

pytestmark = pytest.mark.usefixtures("ray_local", "airflow_db")
LOGICAL_DATE = datetime(2026, 11, 21, tzinfo=UTC)
SECRET = "sk-test-4f1c9a0e7b2d"


def test_the_example_dag_captions_the_demo_images_with_transformers(tmp_path, tiny_models):
    rows = llm_data.write_images(tmp_path / "images" / "2026-11-21")
    spec = importlib.util.spec_from_file_location("vlm_caption_dag", REPO / "dags" / "vlm_caption.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    conf = {"data_root": str(tmp_path), "model": str(tiny_models["llava"]), "batch_size": 8}
    run = run_dag(module.dag, LOGICAL_DATE, conf=conf)
    summary = run.get_task_instance("caption").xcom_pull(task_ids="caption")
    assert summary["rows_out"] == rows - 2 and summary["rows_rejected"] == 2
    captions = pq.read_table(tmp_path / "captions" / "2026-11-21")
    assert captions.column_names == ["id", "label", "generated_caption"]
    assert captions["generated_caption"].null_count == 0
    rejects = pq.read_table(tmp_path / "captions" / "2026-11-21" / "_rejects")
    assert sorted(rejects["id"].to_pylist()) == [rows - 2, rows - 1]


def test_openai_engine_sends_images_as_data_urls_and_keeps_the_key_secret(tmp_path, monkeypatch, caplog, capfd):
    def respond(body):
        system, user = body["messages"]
        assert system == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
        image, text = user["content"]
        assert text == {"type": "text", "text": DEFAULT_PROMPT}
        url = image["image_url"]["url"]
        assert url.startswith("data:image/png;base64,")
        from PIL import Image

        width, height = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).size
        return 200, completion(f"a {width}x{height} picture")

    valid = write_images(tmp_path / "in", 30)
    with OpenAIServer(respond) as server:
        conn = {"conn_type": "http", "host": server.base_url, "password": SECRET}
        monkeypatch.setenv("AIRFLOW_CONN_OPENAI_TEST", json.dumps(conn))
        with DAG("vlm_openai", schedule=None, start_date=LOGICAL_DATE) as dag:
            VLMCaptionOperator(
                task_id="caption",
                input_path=str(tmp_path / "in"),
                output_path=str(tmp_path / "out"),
                engine="openai",
                model="gpt-test-vision",
                openai_conn_id="openai_test",
                image_column="jpg",
                image_size=(24, 16),
                batch_size=8,
                id_column="id",
                rows_per_range=10,
            )
        caplog.set_level("DEBUG")
        run = run_dag(dag, LOGICAL_DATE)
    summary = run.get_task_instance("caption").xcom_pull(task_ids="caption")
    captions = pq.read_table(tmp_path / "out")
    assert sorted(captions["id"].to_pylist()) == valid
    assert set(captions["generated_caption"].to_pylist()) == {"a 24x16 picture"}
    assert sorted(pq.read_table(tmp_path / "out" / "_rejects")["id"].to_pylist()) == sorted(CORRUPT)
    # Only valid images were sent, each once, with the key in the Authorization header.
    assert len(server.requests) == len(valid)
    assert {r["headers"]["Authorization"] for r in server.requests} == {f"Bearer {SECRET}"}
    assert {r["body"]["model"] for r in server.requests} == {"gpt-test-vision"}
    # The key is nowhere else: not in XCom, the output's bookkeeping, the logs or the environment.
    assert SECRET not in json.dumps(summary)
    for path in (tmp_path / "out").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    out, err = capfd.readouterr()
    assert SECRET not in caplog.text and SECRET not in out + err
    assert "RAYBATCH_OPENAI_API_KEY" not in os.environ


def test_the_engine_replicas_get_memory_and_ray_resources_and_there_are_no_choices():
    common = {"input_path": "in", "output_path": "out", "model": "m", "engine": "transformers", "image_column": "jpg"}
    operator = VLMCaptionOperator(task_id="caption", memory=2**30, ray_resources={"big_node": 1}, **common)
    images, engine = operator.build_stages({})
    assert (engine.memory, engine.resources) == (2**30, {"big_node": 1})
    assert (images.memory, images.resources) == (None, None)  # the CPU image stage reserves neither
    with pytest.raises(TypeError, match="choices"):
        VLMCaptionOperator(task_id="choose", choices=["cat", "dog"], **common)
