"""The ``vllm`` embedding engine for real: vLLM's CPU build (``make test-vllm``) through
``ray.data.llm``'s embedding task on the local Ray, with a tiny random BERT saved as a
sentence-transformers folder, against the ``transformers`` engine on the same rows. One run, so
one engine start (about 20 s), serves every test."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.llm.config import EmbeddingTask, EngineConfig
from airflow_provider_raybatch.llm.embedding import build_embedding_stage
from airflow_provider_raybatch.llm.engines.transformers_embedding import TransformersEmbedder
from airflow_provider_raybatch.pipeline import BatchInferenceConfig, ReplicaResources
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from tests.support.embedding_models import WORDS, build_tiny_bert

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("ray_local")]

#: The model's sentence-transformers config cuts texts at this many tokens ([CLS] and [SEP] included).
MAX_TOKENS = 16
ROWS = 24
NULL = 5
#: vLLM's CPU attention takes head sizes of 32 and more: hidden 64 over the tiny BERT's 2 heads.
HIDDEN = 64


def texts() -> list[str | None]:
    """Short texts, every 6th longer than MAX_TOKENS, one missing."""
    rows = [
        " ".join(WORDS[(i + j) % len(WORDS)] for j in range(2 + (25 if i % 6 == 0 else i % 7))) for i in range(ROWS)
    ]
    rows[NULL] = None
    return rows


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-embed")
    model = build_tiny_bert(root / "bert", hidden=HIDDEN, max_seq_length=MAX_TOKENS)
    (root / "in").mkdir()
    pq.write_table(pa.table({"id": list(range(ROWS)), "text": texts()}), root / "in" / "docs.parquet")
    task = EmbeddingTask("text", prefix="query: ", normalize=True, token_columns=True)
    engine = EngineConfig("vllm", str(model), engine_kwargs={"enforce_eager": True, "dtype": "float32"})
    stage = build_embedding_stage(task, engine, ReplicaResources(batch_size=8, num_cpus=0.5, num_gpus=0))
    cfg = BatchInferenceConfig(
        str(root / "in"), str(root / "out"), [stage], id_column="id", rows_per_range=12, max_error_fraction=0.1
    )
    summary = run_batch_inference(cfg)
    # The transformers engine's answer for the same rows, in this process.
    reference = TransformersEmbedder(task.to_dict(), EngineConfig("transformers", str(model)).to_dict())
    expected = reference({"text": np.array(texts(), dtype=object)})
    return root / "out", summary, expected


def test_vllm_embeds_every_row_as_the_transformers_engine_does(embedded):
    out, summary, expected = embedded
    table = pq.read_table(str(out)).sort_by("id")
    assert table.column_names == ["id", "text", "embedding", "truncated", "num_input_tokens"]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), HIDDEN)
    kept = [i for i in range(ROWS) if i != NULL]
    assert table["id"].to_pylist() == kept
    vectors = np.stack(table["embedding"].to_numpy(zero_copy_only=False))
    reference = expected["embedding"][kept]
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # normalize=True, as the task says
    cosines = np.sum(vectors * reference, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosines.min() >= 0.999, cosines
    assert summary.rows_out == ROWS - 1


def test_vllm_counts_and_cuts_texts_as_the_transformers_engine_does(embedded):
    out, summary, expected = embedded
    table = pq.read_table(str(out)).sort_by("id")
    kept = [i for i in range(ROWS) if i != NULL]
    tokens = [expected["num_input_tokens"][i] for i in kept]
    assert table["num_input_tokens"].to_pylist() == tokens and max(tokens) == MAX_TOKENS
    truncated = table["truncated"].to_pylist()
    assert truncated == [expected["truncated"][i] for i in kept]
    assert truncated == [i % 6 == 0 for i in kept]  # the long texts: cut and flagged, not refused
    assert summary.tokens_in == sum(tokens)


def test_a_null_text_is_rejected_as_invalid_input_before_vllm(embedded):
    out, summary, _ = embedded
    (reject,) = pq.read_table(str(out / "_rejects")).to_pylist()
    assert (reject["id"], reject["reason"], reject["kind"]) == (NULL, "text is null", "invalid_input")
    assert (summary.rows_rejected, summary.engine_errors) == (1, 0)
