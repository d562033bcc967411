"""A smoke test of the benchmark scripts at a tiny size: structure only, never timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.support.benchmark_runs import run_benchmark, run_embedding, run_images

#: The benchmark scripts run the pipeline on a local Ray.
pytestmark = pytest.mark.ray


def test_throughput_script_runs_and_writes_its_results(tmp_path):
    variants = ["plain", "operator", "operator_shared"]
    args = ["--rows", "3000", "--variants", *variants, "--model", "heavy", "--batch-size", "1000"]
    results = run_benchmark("throughput", tmp_path, *args, timeout=300)
    assert results["benchmark"] == "throughput"
    assert {"nproc", "cpu_model", "ram_gib", "date"} <= set(results["machine"])
    assert [(r["variant"], r["rows"]) for r in results["rows"]] == [
        ("plain", 3000),
        ("operator", 3000),
        ("operator_shared", 3000),
    ]
    assert all(r["rows_per_s"] > 0 for r in results["rows"])
    assert all(r["task_s"] for r in results["rows"] if r["variant"].startswith("operator"))
    assert "| plain |" in (tmp_path / "results" / "throughput.md").read_text()


def test_commit_cost_script_runs(tmp_path):
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.commit_cost", "--ranges", "3", "--repeats", "1"]
        + ["--rows-per-range", "1000", "--out", str(out), "--work-dir", str(tmp_path / "data")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((out / "commit_cost.json").read_text())["rows"]
    assert [r["setting"] for r in rows] == ["durable and fenced", "fenced, no fsync", "neither"]


def test_tables_script_measures_commits_of_two_writers(tmp_path):
    pytest.importorskip("deltalake")
    pytest.importorskip("pyiceberg")
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.tables", "--parts", "commits", "--seconds", "1"]
        + ["--out", str(out), "--work-dir", str(tmp_path / "data")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((out / "tables.json").read_text())["rows"]
    commits = [r for r in rows if r["part"] == "commits"]
    assert [(r["output"], r["writer"]) for r in commits] == [
        ("delta", "2026-11-23"),
        ("delta", "2026-11-24"),
        ("iceberg", "2026-11-23"),
        ("iceberg", "2026-11-24"),
    ]
    # What the commits left in each table: as many as the writers counted, and its size.
    metadata = {r["output"]: r for r in rows if r["part"] == "metadata"}
    for fmt in ("delta", "iceberg"):
        made = sum(r["commits"] for r in commits if r["output"] == fmt)
        assert made >= 1 and metadata[fmt]["table_commits"] == made and metadata[fmt]["metadata_kib"] > 0


def test_ledger_cost_script_runs(tmp_path):
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.ledger_cost", "--ranges", "50", "--record-each", "5"]
        + ["--out", str(out), "--work-dir", str(tmp_path / "data")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((out / "ledger_cost.json").read_text())["rows"]
    assert [(r["layout"], r["objects_read"]) for r in rows] == [
        ("layout 1", 50),
        ("layout 2, folded", 1),
        ("layout 2, killed", 2),  # 50 records, 30 a segment
    ]


def test_throughput_without_daft_env_says_how_to_create_it(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.throughput", "--rows", "3000", "--variants", "daft"]
        + ["--out", str(tmp_path / "results"), "--work-dir", str(tmp_path / "data")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAYBATCH_DAFT_PYTHON": str(tmp_path / "no-venv" / "bin" / "python")},
    )
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    assert "make daft-env" in run.stderr
    assert not (tmp_path / "data").exists()  # said before generating anything


def test_the_gpu_check_refuses_clearly_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: `make gpu-check` runs the check itself")
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--rows", "1000"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "sees no CUDA GPU; run it on a machine with an NVIDIA GPU" in result.stderr


def test_the_gpu_check_says_why_its_vllm_workload_cannot_run_without_vllms_gpu_build():
    from airflow_provider_raybatch.llm.engines.vllm import installed_vllm
    from benchmarks.gpu_check import vllm_missing

    if installed_vllm() == "gpu":
        pytest.skip("vLLM's GPU build is installed here: the check runs its vllm workload")
    why = vllm_missing()
    assert why.startswith("vllm workload not run: it needs vLLM's CUDA build")
    assert "vLLM's CUDA wheel (336 MB) cannot be installed there" in why


def test_status_script_times_the_status_of_a_running_and_a_finished_output(tmp_path):
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.status", "--ranges", "40", "--repeats", "1", "--records-per-segment", "7"]
        + ["--out", str(out), "--work-dir", str(tmp_path / "data")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((out / "status.json").read_text())["rows"]
    assert [(r["store"], r["reader"], r["state"], r["ranges_committed"]) for r in rows] == [
        (store, reader, state, committed)
        for store in ("local", "moto S3")
        for state, committed in (("running", 24), ("done", 40))
        for reader in ("read_status", "UI endpoint")
    ]
    assert all(r["median_s"] > 0 for r in rows)
    assert all(r["response_kb"] > 0 for r in rows if r["reader"] == "UI endpoint")


def test_images_script_classifies_every_image_and_splits_the_time(tmp_path):
    results, outputs = run_images(tmp_path, "plain", "operator", "handwritten")
    assert results["benchmark"] == "images"
    assert [(r["variant"], r["images"]) for r in results["rows"]] == [
        ("plain", 20),
        ("operator", 20),
        ("handwritten", 20),
    ]
    for row in results["rows"]:
        # Every variant's decode and model calls timed themselves, in Ray's workers too.
        assert row["decode_s"] > 0 and row["model_s"] > 0 and row["images_per_s"] > 0
        assert {"to_model_s", "model_gaps_s", "after_model_s"} <= set(row)
    assert results["rows"][0]["read_s"] > 0 and results["rows"][0]["write_s"] > 0
    assert [t["measure"] for t in results["targets"]] == [
        "20 images: operator/plain images/s",
        "20 images: operator/handwritten images/s",
    ]
    # The same preprocessing and model everywhere: the same label for each image.
    assert outputs["plain"]["id"] == list(range(20))
    assert outputs["operator"] == outputs["handwritten"] == outputs["plain"]


def test_cold_start_script_times_a_first_task_step_by_step(tmp_path):
    out = tmp_path / "results"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.cold_start",
            "--repeats",
            "1",
            "--out",
            str(out),
            "--work-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (row,) = json.loads((out / "cold_start.json").read_text())["rows"]
    assert row["rows"] == 597 and row["head_up_s"] > 0
    # Every step was seen, in the order one waits for the other (the replica's process from the head).
    order = [
        "head start asked",
        "connected",
        "replica process started",
        "worker start to its imports done",
        "import torch done",
        "model load done",
        "first batch done",
        "first_commit_s",
    ]
    assert [row[step] for step in order] == sorted(row[step] for step in order), row


def test_embedding_script_embeds_every_text_as_the_plain_loop_does(tmp_path):
    results, vectors = run_embedding(tmp_path, "plain", "operator")
    assert [(r["variant"], r["texts"]) for r in results["rows"]] == [("plain", 64), ("operator", 64)]
    plain, operator = results["rows"]
    assert plain["model_s"] > 0 and plain["write_s"] > 0 and operator["first_commit_s"] != ""
    # The operator counted the texts' tokens: the same texts for every variant, so its tokens/s is everyone's.
    assert all(r["tokens_per_s"] > 0 for r in results["rows"])
    assert [t["measure"] for t in results["targets"]] == ["64 texts: operator/plain vectors/s"]
    assert vectors["plain"]["id"] == vectors["operator"]["id"] == list(range(64))
    cosine = (vectors["plain"]["embedding"] * vectors["operator"]["embedding"]).sum(axis=1)  # both unit vectors
    assert cosine.min() >= 0.999, cosine.min()
