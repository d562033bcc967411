"""Engines by name: the built-in ones, an unknown name, and an engine added in one new file
(``tests/support/tgi_engine.py``) that is found, checked, built into its stage and run on Ray."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.examples import llm_data
from airflow_provider_raybatch.llm.build import build_stages
from airflow_provider_raybatch.llm.config import ChatTask, EngineConfig
from airflow_provider_raybatch.llm.engines import (
    OpenAIEngine,
    ProcessorEngine,
    TransformersEngine,
    VLLMEngine,
    get_engine,
    register,
)
from airflow_provider_raybatch.pipeline import BatchInferenceConfig, ConfigError, ReplicaResources, TransformStage
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from tests.support.openai_server import OpenAIServer
from tests.support.tgi_engine import GenerateEngine

TASK = ChatTask(prompt="Summarise {Company}", sampling_params={"max_tokens": 8})


def test_built_in_engines_are_found_by_name_and_an_unknown_one_lists_the_registered_names():
    assert isinstance(get_engine("vllm"), VLLMEngine) and isinstance(get_engine("openai"), OpenAIEngine)
    assert isinstance(get_engine("transformers"), TransformersEngine)
    with pytest.raises(
        ConfigError, match=r"engine must be one of \('openai', 'tgi', 'transformers', 'vllm'\), got 'sgl'"
    ):
        get_engine("sgl")


def test_an_engine_added_in_one_file_is_found_by_name_and_builds_its_stage():
    assert isinstance(get_engine("tgi"), GenerateEngine)
    config = EngineConfig("tgi", "my-model", base_url="http://127.0.0.1:1")
    (stage,) = build_stages(TASK, config, ReplicaResources(batch_size=4, concurrency=(1, 2), num_cpus=0.25))
    assert isinstance(stage, TransformStage) and stage.display_name == "tgi"
    assert stage.predictor == "tests.support.tgi_engine:build_transform"
    assert (stage.batch_size, stage.concurrency, stage.num_cpus, stage.num_gpus) == (4, (1, 2), 0.25, 0)
    assert stage.predictor_kwargs["engine"] == config.to_dict() and stage.input_columns == ["Company"]
    # Its own checks, and those every engine shares, name it.
    with pytest.raises(ConfigError, match="engine='tgi' answers text prompts without choices"):
        build_stages(ChatTask(prompt="{Company}", choices=["a", "b"]), config)
    with pytest.raises(ConfigError, match=r"sampling_params \['top_p'\] are not supported by engine='tgi'"):
        build_stages(ChatTask(prompt="{Company}", sampling_params={"top_p": 0.5}), config)
    with pytest.raises(ConfigError, match="engine='tgi' needs base_url"):
        build_stages(TASK, EngineConfig("tgi", "my-model"))


def test_a_name_is_taken_once():
    class Impostor(ProcessorEngine):
        name = "tgi"

    with pytest.raises(
        ValueError, match="an engine named 'tgi' is already registered: tests.support.tgi_engine:GenerateEngine"
    ):
        register(Impostor)
    assert isinstance(get_engine("tgi"), GenerateEngine)


def test_the_new_engine_runs_in_the_checkpointed_pipeline(tmp_path, ray_local):
    names = llm_data.companies_table(40)["Company"].to_pylist()

    def respond(body):
        assert body["parameters"] == {"max_new_tokens": 8}
        company = body["inputs"].rsplit("Summarise ", 1)[1]
        if company == names[5]:
            return 400, {"error": "input refused"}
        return 200, {"generated_text": company.upper()}

    llm_data.write_companies(tmp_path / "in", 40)
    with OpenAIServer(respond, route="/generate") as server:
        config = EngineConfig("tgi", "my-model", base_url=server.base_url.removesuffix("/v1"))
        stages = build_stages(TASK, config, ReplicaResources(batch_size=8, num_cpus=0.5))
        cfg = BatchInferenceConfig(
            str(tmp_path / "in"),
            str(tmp_path / "out"),
            stages,
            id_column="id",
            keep_columns=[],
            rows_per_range=10,
            max_error_fraction=0.1,
        )
        # As it travels to a Ray Job: the predictor's import path brings the engine's module along.
        run_batch_inference(BatchInferenceConfig.from_spec(json.loads(json.dumps(cfg.to_spec()))))
    out = pq.read_table(tmp_path / "out")
    assert {r["id"]: r["generated_text"] for r in out.to_pylist()} == {
        i: name.upper() for i, name in enumerate(names) if i != 5
    }
    (reject,) = pq.read_table(tmp_path / "out" / "_rejects").to_pylist()
    assert reject == {"id": 5, "reason": "the server said: input refused", "kind": "engine_error"}
    assert len(server.requests) == 40
