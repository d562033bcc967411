"""The ``vllm`` engine for real: vLLM's CPU build (``make test-vllm``) through ``ray.data.llm`` on
the local Ray, with the tiny Qwen2 loaded by vLLM's own loader. Each module-scoped run starts one
engine (about 20 s) and serves several tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.examples.llm_data import INDUSTRIES, write_companies
from airflow_provider_raybatch.llm.build import build_stages
from airflow_provider_raybatch.llm.config import ChatTask, EngineConfig
from airflow_provider_raybatch.llm.engines import get_engine
from airflow_provider_raybatch.pipeline import BatchInferenceConfig, ConfigError, ReplicaResources
from airflow_provider_raybatch.pipeline.commit.verify import verify_output
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from tests.conftest import REPO
from tests.support.pipeline_runs import RECORD_EACH_RANGE, commit_count, kill_leftovers

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("ray_local")]

#: What a run on 2 CPUs needs: a small KV cache, the model as saved (float32), no compilation.
ENGINE_KWARGS = {"max_model_len": 256, "enforce_eager": True, "dtype": "float32"}
#: Rows whose prompt alone is longer than max_model_len: vLLM refuses them.
TOO_LONG = (7, 41)
ROWS = 60

SPEC_SCRIPT = """
import json, sys
from airflow_provider_raybatch.pipeline import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
if __name__ == "__main__":  # vLLM spawns its engine processes
    print("SUMMARY " + json.dumps(run_batch_inference(BatchInferenceConfig.from_spec(json.loads(sys.argv[1]))).to_dict()))
"""


def companies(folder, rows: int = ROWS) -> None:
    write_companies(folder, rows)
    path = folder / "companies.parquet"
    table = pq.read_table(path)
    names = table["Company"].to_pylist()
    for i in TOO_LONG:
        names[i] = "Very " * 200 + "Long Holdings"
    pq.write_table(table.set_column(1, "Company", pa.array(names)), path)


def vllm_config(root, model, task: ChatTask, **resources) -> BatchInferenceConfig:
    engine = EngineConfig("vllm", str(model), engine_kwargs=dict(ENGINE_KWARGS))
    replicas = ReplicaResources(**{"batch_size": 8, "num_cpus": 0.5, "num_gpus": 0, **resources})
    return BatchInferenceConfig(
        str(root / "in"),
        str(root / "out"),
        build_stages(task, engine, replicas),
        id_column="id",
        keep_columns=["Company"],
        rows_per_range=20,
        max_error_fraction=0.1,  # the too-long prompts: 2 of 60
    )


@pytest.fixture(scope="module")
def classified(tmp_path_factory, tiny_models):
    """Choices over 60 companies: a first try SIGKILLed right after its first commit, then a resume."""
    root = tmp_path_factory.mktemp("vllm-choices")
    companies(root / "in")
    task = ChatTask(prompt="What industry is this company in: {Company}", choices=INDUSTRIES, output_column="industry")
    cfg = vllm_config(root, tiny_models["qwen2"], task)
    ray_tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # a private Ray for the process that gets killed
    env = {
        **os.environ,
        "RAY_TMPDIR": ray_tmp,
        "RAYBATCH_LOCAL_RAY": "per-task",
        "PYTHONPATH": str(REPO),
        "RAYBATCH_TEST_CRASH": "committed:1",
        **RECORD_EACH_RANGE,
    }
    try:
        crashed = subprocess.run(
            [sys.executable, "-c", SPEC_SCRIPT, json.dumps(cfg.to_spec())],
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
    finally:
        kill_leftovers(ray_tmp)
    committed_before = commit_count(root / "out")
    summary = run_batch_inference(cfg)
    return root / "out", crashed, committed_before, summary


def test_choices_on_vllm_answer_every_row_with_a_choice_after_a_kill_and_resume(classified):
    out, crashed, committed_before, summary = classified
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-2000:] + crashed.stderr[-5000:]
    # The real engine answered: vLLM's engine stage ran in Ray Data's actors of the killed try.
    assert "vLLMEngineStageUDF" in crashed.stderr
    assert committed_before == 1
    assert summary.ranges_skipped == 1 and summary.ranges_done == 2 and summary.rows_processed == 40
    answers, rejects = pq.read_table(str(out)), pq.read_table(str(out / "_rejects"))
    ids = answers["id"].to_pylist() + rejects["id"].to_pylist()
    assert sorted(ids) == list(range(ROWS))  # every row exactly once, across the kill
    assert answers.column_names == ["id", "Company", "industry"]
    assert set(answers["industry"].to_pylist()) <= set(INDUSTRIES) and answers["industry"].null_count == 0
    assert verify_output(str(out)) == []  # the output agrees with its commit records


def test_a_prompt_longer_than_max_model_len_is_a_reject_with_vllms_reason(classified):
    out, _, _, summary = classified
    rejects = pq.read_table(str(out / "_rejects")).to_pylist()
    assert sorted(r["id"] for r in rejects) == list(TOO_LONG)
    for row in rejects:
        assert row["kind"] == "engine_error"
        assert "maximum context length is 256 tokens" in row["reason"], row["reason"]
    # Counted over the whole output: the committed range of the killed try, and the resumed ones.
    assert (summary.rows_out, summary.rows_rejected, summary.engine_errors) == (ROWS - 2, 2, 2)


@pytest.fixture(scope="module")
def free_text(tmp_path_factory, tiny_models):
    """Free text, greedy, with the throughput knobs set: one engine start."""
    root = tmp_path_factory.mktemp("vllm-text")
    write_companies(root / "in", 24)
    path = root / "in" / "companies.parquet"
    table = pq.read_table(path)
    names = table["Company"].to_pylist()
    pq.write_table(table.set_column(1, "Company", pa.array(names[:12] * 2)), path)  # each name twice
    task = ChatTask(
        prompt="Describe {Company}",
        system_prompt="You are terse.",
        sampling_params={"max_tokens": 12, "temperature": 0},
        output_column="text",
    )
    cfg = vllm_config(root, tiny_models["qwen2"], task, batch_size=4)
    cfg.stages[-1].predictor_kwargs["engine"]["engine_kwargs"]["max_num_seqs"] = 4
    return root / "out", run_batch_inference(cfg)


def test_free_text_on_vllm_is_greedy_and_every_row_is_answered(free_text):
    out, summary = free_text
    table = pq.read_table(str(out))
    assert summary.rows_out == 24 and summary.engine_errors == 0
    assert sorted(table["id"].to_pylist()) == list(range(24))
    texts = table["text"].to_pylist()
    assert all(isinstance(t, str) and t for t in texts)
    # Greedy decoding: the same prompt gets the same answer (write_companies repeats some names).
    by_name: dict[str, set[str]] = {}
    for name, text in zip(table["Company"].to_pylist(), texts, strict=True):
        by_name.setdefault(name, set()).add(text)
    assert len(by_name) == 12 and all(len(answers) == 1 for answers in by_name.values())


def test_the_cpu_build_is_refused_for_replicas_with_gpus_and_named():
    with pytest.raises(ConfigError, match=r"is vLLM's CPU build: set num_gpus=0"):
        get_engine("vllm").preflight(EngineConfig("vllm", "m"), ReplicaResources(num_gpus=1))
