"""LLM stage settings, prompts and the image stage, without Ray or a model."""

from __future__ import annotations

import base64
import io
import json
import logging

import pyarrow as pa
import pytest

from airflow_provider_raybatch.llm.build import build_stages
from airflow_provider_raybatch.llm.config import ChatTask, EmbeddingTask, EngineConfig
from airflow_provider_raybatch.llm.engines import EMBEDDING, get_engine
from airflow_provider_raybatch.llm.engines.openai import parse_response, payload
from airflow_provider_raybatch.llm.images import PrepareImages
from airflow_provider_raybatch.llm.processors import (
    ChatAnswer,
    ChatRequest,
    EmbeddingAnswer,
    EmbeddingRequest,
    finish_embeddings,
    finish_row,
)
from airflow_provider_raybatch.llm.prompts import chat_messages
from airflow_provider_raybatch.pipeline import (
    BatchInferenceConfig,
    ConfigError,
    ReplicaResources,
    Stage,
    TransformStage,
)
from tests.support.llm_images import image_bytes


def test_stages_are_json_specs_without_secrets():
    task = ChatTask(prompt="Describe.", image_column="jpg", image_size=(64, 48), sampling_params={"max_tokens": 8})
    engine = EngineConfig("openai", "gpt-4o-mini", base_url="http://127.0.0.1:1/v1")
    stages = build_stages(task, engine, ReplicaResources(batch_size=8, concurrency=[1, 2], num_gpus=None))
    assert [s.display_name for s in stages] == ["prepare_images", "openai"]
    assert stages[0].input_columns == ["jpg"] and isinstance(stages[1], TransformStage)
    spec = json.loads(json.dumps(BatchInferenceConfig("in", "out", stages).to_spec()))
    again = BatchInferenceConfig.from_spec(spec)
    assert again.stages == stages
    assert ChatTask.from_dict(again.stages[1].predictor_kwargs["task"]) == task
    assert EngineConfig(**again.stages[1].predictor_kwargs["engine"]) == engine
    # Resources are the stage's fields, not its kwargs: scaling them keeps a resumable output's settings.
    assert again.stages[1].concurrency == (1, 2) and again.stages[1].num_gpus == 0
    assert (again.stages[0].batch_size, again.stages[0].num_cpus) == (8, 0.5)
    assert again.stages[1].predictor_kwargs["engine"]["api_key_env"] == "RAYBATCH_OPENAI_API_KEY"


@pytest.mark.parametrize(
    ("task", "engine", "resources", "message"),
    [
        ({}, {"engine": "sglang"}, {}, r"engine must be one of \(.*'openai'.*'transformers'.*'vllm'.*\), got 'sglang'"),
        ({"prompt": "Industry of {Company!x"}, {}, {}, "not a valid template"),
        ({"prompt": "Industry of {}"}, {}, {}, "prompt fields must name columns"),
        ({"choices": []}, {}, {}, "choices must be a non-empty list"),
        ({"choices": ["a", "a"]}, {}, {}, "distinct"),
        ({"choices": ["a"], "image_column": "jpg"}, {}, {}, "choices are supported for text prompts only"),
        (
            {"sampling_params": {"max_tokens": 4, "structured_outputs": {}}},
            {},
            {},
            r"sampling_params \['structured_outputs'\] are not supported by engine='transformers'",
        ),
        ({"image_size": (0, 10), "image_column": "jpg"}, {}, {}, "image_size must be"),
        ({}, {"engine": "openai"}, {}, "engine='openai' needs base_url"),
        (
            {},
            {"engine": "vllm", "engine_kwargs": {"tensor_parallel_size": 2}},
            {"num_gpus": 1},
            "tensor_parallel_size x pipeline_parallel_size = 2",
        ),
        (
            {},
            {"engine": "vllm", "engine_kwargs": {"tensor_parallel_size": 2}},
            {"num_gpus": None, "resources": {"big": 1}},
            "engine='vllm' reserves memory and custom resources only for one GPU per replica",
        ),
        (
            {},
            {"engine": "vllm", "engine_kwargs": {"tensor_parallel_size": 2}},
            {"num_gpus": 0},
            r"num_gpus=0 runs vLLM's CPU backend, one engine process per replica: .* got 2",
        ),
        ({}, {"engine": "vllm"}, {"num_gpus": 0, "accelerator_type": "L4"}, "accelerator_type='L4' asks for a GPU"),
        ({}, {"engine": "vllm"}, {"num_gpus": 0, "num_cpus": 0}, "runs on CPUs: num_cpus must be > 0"),
        (
            {},
            {},
            {"max_concurrent_batches": 4},
            "max_concurrent_batches is not taken by engine='transformers': its replicas work on one batch at a time",
        ),
        ({}, {"engine": "vllm"}, {"max_concurrent_batches": 0}, "max_concurrent_batches must be an integer >= 1"),
        ({}, {}, {"batch_size": 0}, "engine 'transformers': batch_size must be an integer >= 1"),
        ({"output_column": "__x"}, {}, {}, "output_column must be a plain column name"),
    ],
)
def test_bad_settings_name_the_setting(task, engine, resources, message):
    with pytest.raises(ConfigError, match=message):
        build_stages(
            ChatTask(**{"prompt": "Industry of {Company}", **task}),
            EngineConfig(**{"engine": "transformers", "model": "m", **engine}),
            ReplicaResources(**{"batch_size": 16, "num_gpus": None, **resources}),
        )


def test_each_engine_decides_its_gpus_and_its_stage():
    task = ChatTask(prompt="Industry of {Company}")
    tp2 = EngineConfig("vllm", "m", engine_kwargs={"tensor_parallel_size": 2})
    (vllm,) = build_stages(task, tp2, ReplicaResources(concurrency=2, num_gpus=None, memory=None))
    assert isinstance(vllm, TransformStage) and vllm.num_gpus == 2 and vllm.input_columns == ["Company"]
    assert vllm.predictor == "airflow_provider_raybatch.llm.processors:build_vllm_transform"
    (hf,) = build_stages(task, EngineConfig("transformers", "m"), ReplicaResources(num_gpus=None, memory=2**30))
    assert type(hf).__name__ == "Stage" and (hf.num_gpus, hf.memory, hf.batch_size) == (0, 2**30, 256)
    assert hf.predictor == "airflow_provider_raybatch.llm.engines.transformers:TransformersChat"
    (default,) = build_stages(task, EngineConfig("transformers", "m"))  # no resources: 16 rows, 1 CPU, engine's GPUs
    assert (default.batch_size, default.num_cpus, default.num_gpus, default.concurrency) == (16, 1, 0, 1)
    assert get_engine("openai").needs_endpoint and not get_engine("vllm").needs_endpoint


def test_messages_are_openai_style_with_the_image_as_a_data_url():
    task = ChatTask(prompt="What industry is this company in: {Company}", system_prompt="Be brief about {Company}.")
    assert chat_messages(task, {"Company": "Acme"}) == [
        {"role": "system", "content": "Be brief about Acme."},
        {"role": "user", "content": "What industry is this company in: Acme"},
    ]
    png = image_bytes(1)
    (user,) = chat_messages(ChatTask(prompt="Describe."), {}, image=png)
    assert user["content"][0]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(png).decode()
    assert user["content"][1] == {"type": "text", "text": "Describe."}


def test_requests_answers_and_rejected_rows_through_the_processor_hooks():
    task = ChatTask(prompt="Industry of {Company}", choices=["Tech", "Retail"], sampling_params={"temperature": 0})
    vllm_engine, openai_engine = get_engine("vllm"), get_engine("openai")
    vllm = ChatRequest(task, EngineConfig("vllm", "m"), vllm_engine)({"Company": "Acme", "__raybatch_range": 3})
    assert vllm["sampling_params"] == {"temperature": 0, "structured_outputs": {"choice": ["Tech", "Retail"]}}
    assert vllm["messages"] == [{"role": "user", "content": "Industry of Acme"}]
    # A row rejected earlier skips every ray.data.llm stage.
    assert ChatRequest(task, EngineConfig("vllm", "m"), vllm_engine)({"__raybatch_reject": "bad image"}) == {
        "__inference_error__": "rejected by an earlier stage"
    }
    body = payload(task, "m", vllm["messages"])
    assert body["response_format"]["json_schema"]["schema"]["properties"]["answer"]["enum"] == ["Tech", "Retail"]
    request = ChatRequest(task, EngineConfig("openai", "served-model"), openai_engine)({"Company": "Acme"})
    assert request == {"payload": {**body, "model": "served-model", "temperature": 0}, "__inference_error__": ""}
    # "" (no error), not absent: in a block that also holds a rejected row, an absent value is a null,
    # which every ray.data.llm stage takes for an error: the row would skip the engine, unanswered.
    assert vllm["__inference_error__"] == ""
    answer = ChatAnswer(task, EngineConfig("openai", "served-model"), openai_engine)
    ok = {"choices": [{"message": {"content": '{"answer": "Retail"}'}}]}
    row = {"__raybatch_range": 3, "__raybatch_keep:id": 7, "Company": "Acme", "http_response": ok}
    assert answer(row) == {
        "__raybatch_range": 3,
        "__raybatch_keep:id": 7,
        "generated_text": "Retail",
        "__raybatch_reject": None,
        "__raybatch_reject_kind": None,
    }
    # An endpoint's usage is the row's token count, added to what an earlier stage counted.
    usage = {**ok, "usage": {"prompt_tokens": 21, "completion_tokens": 5, "total_tokens": 26}}
    counted = answer({**row, "http_response": usage, "__raybatch_tokens_in": 4})
    assert (counted["__raybatch_tokens_in"], counted["__raybatch_tokens_out"]) == (25, 5)
    outside = {"choices": [{"message": {"content": '{"answer": "Mining"}'}}]}
    assert (
        answer({**row, "http_response": outside})["__raybatch_reject"]
        == "the answer 'Mining' is not one of the choices"
    )
    assert parse_response({"error": {"message": "context too long"}}, task) == (
        None,
        "the endpoint returned an error: context too long",
    )
    # After the processor: an engine failure (bypassing postprocess) becomes an engine_error reject.
    failed = {"__raybatch_range": 3, "__raybatch_keep:id": 8, "messages": [], "__inference_error__": "OOM"}
    assert finish_row(failed, "generated_text") == {
        "__raybatch_range": 3,
        "__raybatch_keep:id": 8,
        "__raybatch_reject": "OOM",
        "__raybatch_reject_kind": "engine_error",
        "__raybatch_tokens_in": None,
        "__raybatch_tokens_out": None,
        "generated_text": None,
    }
    # token_columns: the row's counts as output columns too.
    done = finish_row({**counted, "__inference_error__": ""}, "generated_text", token_columns=True)
    assert (done["num_input_tokens"], done["num_generated_tokens"], done["generated_text"]) == (25, 5, "Retail")


def test_vllm_counts_its_tokens_and_rejects_an_answer_that_max_model_len_would_cut_short():
    vllm = get_engine("vllm")
    task = ChatTask(prompt="Describe {Company}", sampling_params={"max_tokens": 64})
    config = EngineConfig("vllm", "m", engine_kwargs={"max_model_len": 100})
    row = {"generated_text": "A firm.", "num_input_tokens": 30, "num_generated_tokens": 4}
    assert vllm.tokens(row) == (30, 4)
    assert vllm.answer(task, config, row) == ("A firm.", None)
    long_prompt = {**row, "num_input_tokens": 40}
    assert vllm.answer(task, config, long_prompt) == (
        None,
        "the prompt is 40 tokens; with max_tokens=64 it exceeds max_model_len=100 (vLLM would cut the answer short)",
    )
    # Without max_model_len or max_tokens there is nothing to compare: vLLM's own limits apply.
    assert vllm.answer(ChatTask(prompt="Describe {Company}"), config, long_prompt) == ("A firm.", None)
    assert vllm.answer(task, EngineConfig("vllm", "m"), long_prompt) == ("A firm.", None)


def block(rows: list[dict]) -> pa.Table:
    """Rows as Ray Data builds a block of them: every row's columns, missing values null."""
    names = dict.fromkeys(name for row in rows for name in row)
    return pa.table({name: [row.get(name) for row in rows] for name in names})


def test_the_vllm_embedding_processors_rows_become_the_embedding_engines_columns():
    """Around Ray's embedding processor: a null text and an earlier reject skip it, an engine failure
    becomes a reject, and the vectors come out as every embedding engine writes them."""
    import numpy as np

    vllm = get_engine("vllm", EMBEDDING)
    task = EmbeddingTask("text", token_columns=True)
    request = EmbeddingRequest(task, EngineConfig("vllm", "m", engine_kwargs={"max_model_len": 8}), vllm)
    assert request({"text": None}) == {
        "__raybatch_reject": "text is null",
        "__raybatch_reject_kind": "invalid_input",
        "__inference_error__": "text is null",
    }
    assert request({"text": "a", "__raybatch_reject": "bad image"}) == {
        "__inference_error__": "rejected by an earlier stage"
    }
    embedded = {"__raybatch_range": 1, "embeddings": np.array([3.0, 4.0]), "num_input_tokens": 8, "prompt": "x"}
    answer = EmbeddingAnswer(vllm)({**embedded, "raybatch_text_cut": True})
    assert answer == {
        "__raybatch_range": 1,
        "raybatch_vector": np.array([3.0, 4.0], np.float32).tobytes(),
        "raybatch_tokens": 8,
        "raybatch_truncated": True,
    }
    rows = [
        {**answer, "__inference_error__": ""},  # as Ray's postprocess wrapper adds it
        # vLLM failed on the row (it bypassed the postprocess with its whole row).
        {"__raybatch_range": 1, "__inference_error__": "engine died", "prompt": "y", "embeddings": None},
        # The text was null, or an earlier stage rejected the row: their reasons and kinds kept.
        {"__raybatch_range": 1, **request({"text": None})},
        {"__raybatch_range": 1, "__raybatch_reject": "bad", "__raybatch_reject_kind": None, "__inference_error__": "s"},
    ]
    out = finish_embeddings(block(rows), {**task.to_dict(), "normalize": True}, dimension=2)
    assert out.column("embedding").type == pa.list_(pa.float32(), 2)
    assert out.column("embedding")[0].as_py() == pytest.approx([0.6, 0.8])
    assert out.to_pydict() | {"embedding": None} == {
        "__raybatch_range": [1, 1, 1, 1],
        "embedding": None,
        "__raybatch_reject": [None, "engine died", "text is null", "bad"],
        "__raybatch_reject_kind": [None, "engine_error", "invalid_input", None],
        "__raybatch_tokens_in": [8, None, None, None],
        "__raybatch_truncated": [1, None, None, None],  # counted for the summary, with or without the column
        "truncated": [True, None, None, None],
        "num_input_tokens": [8, None, None, None],
    }
    # A batch in which nothing was embedded still has vectors of the model's dimension.
    none = finish_embeddings(block(rows[1:]), task.to_dict(), dimension=3)
    assert none.column("embedding").type == pa.list_(pa.float32(), 3)


def test_image_stage_reads_bytes_structs_and_paths_and_rejects_the_rest(tmp_path):
    from PIL import Image

    good = image_bytes(3, "JPEG", size=(40, 30))
    (tmp_path / "ok.png").write_bytes(image_bytes(4))
    values = [
        {"bytes": good, "path": None},
        {"bytes": None, "path": str(tmp_path / "ok.png")},
        str(tmp_path / "ok.png"),
        str(tmp_path / "missing.png"),
        {"bytes": None, "path": None},
        None,
    ]
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for column in (
        pa.array(values[:2] + values[4:5], struct),
        pa.array(values[2:4] + values[5:], pa.string()),
    ):
        out = PrepareImages(ChatTask(prompt="x", image_column="img", image_size=(8, 6)).to_dict())(
            pa.table({"img": column})
        )
        images, reasons = out["raybatch_image_png"].to_pylist(), out["__raybatch_reject"].to_pylist()
        for image, reason in zip(images, reasons, strict=True):
            if reason is None:
                assert Image.open(io.BytesIO(image)).size == (8, 6)
        if column.type == struct:
            assert reasons[:2] == [None, None] and reasons[2].startswith("missing image (struct")
        else:
            assert reasons[0] is None
            assert reasons[1].startswith(f"cannot read image file '{tmp_path / 'missing.png'}'")
            assert reasons[2] == "missing image (null)"
        assert out["__raybatch_reject_kind"].to_pylist() == [None if r is None else "invalid_input" for r in reasons]


def test_a_prompt_field_missing_from_the_input_fails_before_ray(tmp_path):
    from airflow_provider_raybatch.examples.llm_data import write_companies
    from airflow_provider_raybatch.pipeline import InputError
    from airflow_provider_raybatch.pipeline.runner import run_batch_inference

    write_companies(tmp_path / "in", 10)
    stages = build_stages(ChatTask(prompt="Industry of {Compnay}"), EngineConfig("transformers", "no-such-model"))
    with pytest.raises(InputError, match=r"stage 'transformers' reads column\(s\) \['Compnay'\].*'Company'"):
        run_batch_inference(BatchInferenceConfig(str(tmp_path / "in"), str(tmp_path / "out"), stages))


def test_vllm_warns_when_its_batches_in_flight_cannot_fill_max_num_seqs(caplog):
    task = ChatTask(prompt="Industry of {Company}")
    config = EngineConfig("vllm", "m", engine_kwargs={"max_num_seqs": 64})
    with caplog.at_level(logging.WARNING, logger="airflow_provider_raybatch.llm.engines.vllm"):
        build_stages(task, config, ReplicaResources(batch_size=4, num_gpus=None))
        (warning,) = [r.getMessage() for r in caplog.records]
        assert warning.startswith(
            "engine='vllm': batch_size x max_concurrent_batches = 4 x 8 = 32 rows in flight per replica, "
            "fewer than max_num_seqs=64"
        )
        caplog.clear()
        build_stages(task, config, ReplicaResources(batch_size=4, num_gpus=None, max_concurrent_batches=16))
        build_stages(task, EngineConfig("vllm", "m"), ReplicaResources(batch_size=4, num_gpus=None))
        assert not caplog.records  # 4 x 16 fills 64; without max_num_seqs, vLLM's own default is not guessed


def test_a_predictors_stage_refuses_max_concurrent_batches():
    with pytest.raises(ConfigError, match=r"stage 'score': max_concurrent_batches is for engines that overlap"):
        Stage("tests.support.predictors:score", max_concurrent_batches=2).validate()
