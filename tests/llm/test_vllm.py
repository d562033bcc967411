"""The ``vllm`` engine for real: vLLM's CPU build (``make test-vllm``) through ``ray.data.llm`` on
the local Ray, with the tiny Qwen2 loaded by vLLM's own loader. Each module-scoped run starts one
engine (about 20 s) and serves several tests."""

from __future__ import annotations

import signal

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
from airflow_provider_raybatch.pipeline.status import read_status
from tests.support.pipeline_runs import RECORD_EACH_RANGE, commit_count, run_spec_in_subprocess

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("ray_local")]

#: What a run on 2 CPUs needs: a small KV cache, the model as saved (float32), no compilation.
ENGINE_KWARGS = {"max_model_len": 256, "enforce_eager": True, "dtype": "float32"}
#: Rows whose prompt alone is longer than max_model_len: vLLM refuses them.
TOO_LONG = (7, 41)
ROWS = 60
#: The free-text row whose prompt fits max_model_len, but not with max_tokens after it.
MID = 5


def companies(folder, rows: int = ROWS) -> None:
    write_companies(folder, rows)
    path = folder / "companies.parquet"
    table = pq.read_table(path)
    names = table["Company"].to_pylist()
    for i in TOO_LONG:
        names[i] = "Very " * 200 + "Long Holdings"
    pq.write_table(table.set_column(1, "Company", pa.array(names)), path)


def vllm_config(root, model, task: ChatTask, engine_kwargs=None, **resources) -> BatchInferenceConfig:
    engine = EngineConfig("vllm", str(model), engine_kwargs={**ENGINE_KWARGS, **(engine_kwargs or {})})
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
    task = ChatTask(
        prompt="What industry is this company in: {Company}",
        choices=INDUSTRIES,
        output_column="industry",
        token_columns=True,
    )
    cfg = vllm_config(root, tiny_models["qwen2"], task)
    crashed = run_spec_in_subprocess(cfg, {"RAYBATCH_TEST_CRASH": "committed:1", **RECORD_EACH_RANGE}, timeout=400)
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
    assert answers.column_names == ["id", "Company", "industry", "num_input_tokens", "num_generated_tokens"]
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


def test_vllm_counts_the_tokens_the_output_holds_once_across_the_kill(classified, tiny_models):
    from transformers import AutoTokenizer

    out, _, _, summary = classified
    answers = pq.read_table(str(out)).sort_by("id")
    # vLLM's own count of each prompt: the chat template's tokens, as the model's tokenizer makes them.
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_models["qwen2"]))
    messages = [
        [{"role": "user", "content": f"What industry is this company in: {c}"}] for c in answers["Company"].to_pylist()
    ]
    prompts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    assert answers["num_input_tokens"].to_pylist() == [
        len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts
    ]
    assert min(answers["num_generated_tokens"].to_pylist()) >= 1
    # Totals of what the output holds (the rows vLLM refused cost none), not of the tries: the
    # killed try's committed range counts once, its range in flight not at all.
    totals = (sum(answers["num_input_tokens"].to_pylist()), sum(answers["num_generated_tokens"].to_pylist()))
    assert (summary.tokens_in, summary.tokens_out) == totals
    status = read_status(str(out))
    assert (status.tokens_in, status.tokens_out) == totals
    resumed = pq.read_table(str(out), filters=[("id", ">=", 20)])  # the ranges this run committed
    assert summary.tokens_out_processed == sum(resumed["num_generated_tokens"].to_pylist())


@pytest.fixture(scope="module")
def free_text(tmp_path_factory, tiny_models):
    """Free text with the throughput knobs set (batch_size, max_concurrent_batches, max_num_seqs): one engine start."""
    root = tmp_path_factory.mktemp("vllm-text")
    write_companies(root / "in", 24)
    path = root / "in" / "companies.parquet"
    table = pq.read_table(path)
    names = table["Company"].to_pylist()
    names[MID] = "Very " * 45 + "Mid Holdings"  # 221 prompt tokens: with max_tokens=40, over max_model_len
    pq.write_table(table.set_column(1, "Company", pa.array(names)), path)
    task = ChatTask(
        prompt="Describe {Company}",
        system_prompt="You are terse.",
        sampling_params={"max_tokens": 40, "temperature": 0},
        output_column="text",
        token_columns=True,
    )
    cfg = vllm_config(
        root, tiny_models["qwen2"], task, engine_kwargs={"max_num_seqs": 4}, batch_size=4, max_concurrent_batches=2
    )
    cfg.max_error_fraction = 0.1
    return root / "out", run_batch_inference(cfg)


def test_free_text_on_vllm_answers_every_row_within_max_tokens(free_text):
    out, summary = free_text
    table = pq.read_table(str(out))
    assert summary.rows_out == 23 and summary.engine_errors == 1
    assert sorted(table["id"].to_pylist()) == [i for i in range(24) if i != MID]
    assert all(isinstance(t, str) and t for t in table["text"].to_pylist())
    generated = table["num_generated_tokens"].to_pylist()
    assert min(generated) >= 1 and max(generated) <= 40  # max_tokens reached the engine
    # A rejected row's tokens were spent too: the one cut short generated up to max_model_len.
    assert summary.tokens_out == sum(generated) + (256 - 221)


def test_an_answer_that_max_model_len_would_cut_short_is_a_reject_with_the_reason(free_text):
    out, _ = free_text
    (reject,) = pq.read_table(str(out / "_rejects")).to_pylist()
    assert reject["id"] == MID and reject["kind"] == "engine_error"
    assert reject["reason"] == (
        "the prompt is 221 tokens; with max_tokens=40 it exceeds max_model_len=256 (vLLM would cut the answer short)"
    )


def test_the_cpu_build_is_refused_for_replicas_with_gpus_and_named():
    with pytest.raises(ConfigError, match=r"is vLLM's CPU build: set num_gpus=0"):
        get_engine("vllm").preflight(EngineConfig("vllm", "m"), ReplicaResources(num_gpus=1))
