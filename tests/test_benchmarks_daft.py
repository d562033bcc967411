"""The benchmarks' Daft variants, at a tiny size: they run with .venv-daft's interpreter (`make daft-env`).

A file of their own, so that it is handed out among the suite's last files (tests/support/slow_first.py): CI
builds .venv-daft beside the suite's first minutes (.ci/run) instead of before them. Without the venv they skip,
but in CI (CI=true), where they fail.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.support.benchmark_runs import DAFT_PYTHON, run_benchmark, run_embedding, run_images

#: The benchmark scripts run the pipeline on a local Ray.
pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(
        not DAFT_PYTHON.exists() and os.environ.get("CI") != "true",
        reason="Daft's environment .venv-daft is missing: create it with `make daft-env` (CI's .ci/run does)",
    ),
]


def test_throughput_daft_variant_scores_like_the_plain_loop(tmp_path):
    # Daft runs with .venv-daft's interpreter (pyarrow 25): the same logits as the plain loop's.
    args = ["--rows", "3000", "--model", "light", "--variants", "plain", "daft", "--batch-size", "1000"]
    results = run_benchmark("throughput", tmp_path, *args, timeout=300)
    work = tmp_path / "data"
    assert [(r["variant"], r["model"], r["rows"]) for r in results["rows"]] == [
        ("plain", "light", 3000),
        ("daft", "light", 3000),
    ]
    assert all(r["process_s"] >= r["wall_s"] > 0 for r in results["rows"])
    plain, daft = (pq.read_table(work / f"out-throughput-{v}").sort_by("id").to_pydict() for v in ("plain", "daft"))
    assert daft["id"] == plain["id"] == list(range(3000))
    assert np.allclose(np.array(daft["logits"]), np.array(plain["logits"]), atol=1e-5)


def test_images_daft_variant_classifies_every_image(tmp_path):
    results, outputs = run_images(tmp_path, "plain", "daft")
    assert [(r["variant"], r["images"]) for r in results["rows"]] == [("plain", 20), ("daft", 20)]
    assert results["rows"][1]["model_s"] > 0
    # Daft decodes and resizes with its own code: the same images, labels from the same classes.
    assert outputs["daft"]["id"] == outputs["plain"]["id"] == list(range(20))
    assert set(outputs["daft"]["label"]) <= set(range(10))


def test_embedding_daft_variant_embeds_as_the_plain_loop_does(tmp_path):
    # Daft's embed_text runs sentence-transformers on the same model folder: the same vectors.
    results, vectors = run_embedding(tmp_path, "plain", "daft")
    assert [(r["variant"], r["texts"]) for r in results["rows"]] == [("plain", 64), ("daft", 64)]
    assert vectors["daft"]["id"] == vectors["plain"]["id"] == list(range(64))
    cosine = (vectors["plain"]["embedding"] * vectors["daft"]["embedding"]).sum(axis=1)
    assert cosine.min() >= 0.999, cosine.min()
