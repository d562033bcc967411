"""The GPU check, in one command: `make gpu-check` (or `python -m benchmarks.gpu_check`).

On a machine with an NVIDIA GPU, two workloads run through the real runner
(``run_batch_inference``, an embedded per-task Ray), each against a plain loop on the same GPU:

- ``torch``: a stage with ``num_gpus=1`` whose predictor is written as Ray's batch inference guide
  writes one (an MLP 32-4096-4096-10 built on CUDA in ``__init__``, ``argmax`` in ``__call__``),
  over the benchmarks' Parquet (``id`` + 32 float32 ``features``);
- ``transformers``: the LLM operator's ``transformers`` engine on CUDA (``device="cuda"``), with a
  tiny Qwen2 built offline, answering a prompt per row of a companies table;
- ``vllm``: the ``vllm`` engine (``ray.data.llm`` with vLLM's GPU build, one GPU per replica) on
  the same prompts and model, against vLLM's own ``LLM.chat`` loop. It needs vLLM's CUDA build
  installed (``airflow-provider-raybatch[vllm]``); without it the check says so, records why in its
  results, and runs the other workloads. (The GPU machines this project is lent reach no package
  index and carry at most 64 MiB to the machine: vLLM's CUDA wheel, 336 MB, cannot get there.)

Each workload runs three ways: the plain loop, in a new Python process (its start, imports and
CUDA's set-up are timed, as a replica's are); ``runner``, which starts and stops its own Ray
as a task on a machine without a cluster does; ``runner_ray_up``, on a Ray already started in
this process, as a task on a running GPU cluster finds it (the Ray start left out, the workers'
start and imports kept in). While each runs, ``nvidia-smi`` samples the GPU's utilisation.
Rows/s are whole runs (model loading, reading and writing included) on every side. Results:
``benchmarks/results/gpu_check.{json,md}``, written also when a later run fails. Without a CUDA GPU
it says so and exits with status 2 before any work.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

#: Exit status when there is no GPU to check.
NO_GPU_EXIT = 2
HIDDEN = 4096


class GpuMLP:
    """A user's predictor on the GPU: the model built once per replica, a batch scored per call."""

    def __init__(self, hidden: int = HIDDEN, features: int = 32):
        self.clock = ModelClock("torch")
        import torch

        self.clock.mark("torch imported")
        torch.manual_seed(0)
        self.device = torch.device("cuda")
        self.model = (
            torch.nn.Sequential(
                torch.nn.Linear(features, hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(hidden, hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(hidden, 10),
            )
            .to(self.device)
            .eval()
        )
        torch.cuda.synchronize()
        self.clock.mark("model on the GPU")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        with self.clock.batch(len(batch["features"])), torch.inference_mode():
            x = torch.as_tensor(batch["features"], device=self.device)
            return {"predicted": self.model(x).argmax(dim=1).cpu().numpy()}


class ModelClock:
    """Where a replica's seconds go, printed every few seconds (a Ray worker's prints reach the
    driver's output): the process's age when the predictor was built, its set-up steps, the wait
    for the first batch, then the share of the seconds since that the model was busy (the copy
    to the GPU and back included)."""

    def __init__(self, name: str, every_s: float = 3.0):
        import psutil

        self.name, self.every_s = name, every_s
        self.last = self.printed = time.monotonic()
        self.steps = [f"process up {time.time() - psutil.Process().create_time():.2f} s"]
        self.first: float | None = None
        self.busy = 0.0
        self.rows = self.batches = 0

    def mark(self, step: str) -> None:
        now = time.monotonic()
        self.steps.append(f"{step} +{now - self.last:.2f} s")
        self.last = now

    @contextmanager
    def batch(self, rows: int) -> Iterator[None]:
        started = time.monotonic()
        if self.first is None:
            self.first = started
            self.mark("first batch")
            print(f"{self.name} model clock at {time.strftime('%H:%M:%S')}: {', '.join(self.steps)}", flush=True)
        yield
        now = time.monotonic()
        self.busy += now - started
        self.rows += rows
        self.batches += 1
        if now - self.printed >= self.every_s:
            self.printed = now
            print(
                f"{self.name} model clock: {self.batches} batches, {self.rows} rows, "
                f"busy {self.busy:.2f} s of the {now - self.first:.2f} s since the first",
                flush=True,
            )


def in_new_process(run: Callable[[], int]) -> int:
    """``run()`` in a new Python process, timed as a plain script is: its start, imports and
    CUDA's set-up too, as the runner's replicas have theirs."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run).result()


def gpu_or_exit() -> str:
    """The GPU's name; without a CUDA GPU visible to torch: a clear message and exit status 2."""
    try:
        import torch
    except ImportError:
        sys.exit(_no_gpu("torch is not installed (`pip install 'airflow-provider-raybatch[llm]'`)"))
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        sys.exit(_no_gpu(f"torch {torch.__version__} ({build}) sees no CUDA GPU"))
    return torch.cuda.get_device_name(0)


def _no_gpu(why: str) -> int:
    print(f"gpu_check: {why}; run it on a machine with an NVIDIA GPU and its driver.", file=sys.stderr)
    return NO_GPU_EXIT


class Utilisation:
    """``nvidia-smi`` sampled every 200 ms while the block runs: mean and peak GPU utilisation."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Utilisation:
        if shutil.which("nvidia-smi"):
            self._process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            if line.strip().isdigit():
                self.samples.append(int(line.strip()))

    def __exit__(self, *exc_info: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)

    def summary(self) -> dict[str, Any]:
        if not self.samples:
            return {"gpu_util_mean": None, "gpu_util_max": None}
        return {"gpu_util_mean": round(sum(self.samples) / len(self.samples), 1), "gpu_util_max": max(self.samples)}


def plain_torch(input_dir: Path, output: Path, batch_size: int) -> int:
    """The plain loop: pyarrow batches into the same predictor on the same GPU, one Parquet out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    model, ids, predicted = GpuMLP(), [], []
    for path in sorted(input_dir.glob("*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=["id", "features"]):
            features = batch.column("features")
            x = features.flatten().to_numpy().reshape(len(batch), features.type.list_size)
            ids.append(batch.column("id"))
            predicted.append(model({"features": x})["predicted"])
    table = pa.table({"id": pa.concat_arrays(ids), "predicted": np.concatenate(predicted)})
    pq.write_table(table, output)
    return table.num_rows


def runner_torch(input_dir: Path, output: Path, batch_size: int) -> int:
    from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage
    from airflow_provider_raybatch.pipeline.runner import run_batch_inference

    stage = Stage("benchmarks.gpu_check:GpuMLP", num_gpus=1, batch_size=batch_size)
    config = BatchInferenceConfig(str(input_dir), str(output), [stage], id_column="id")
    return run_batch_inference(config).rows_out


def chat_setup(work: Path, rows: int) -> tuple[Path, Any, Any]:
    """The companies table, the tiny Qwen2 (built offline), the task and the engine on CUDA."""
    import pyarrow.parquet as pq

    from airflow_provider_raybatch.examples.llm_data import companies_table
    from airflow_provider_raybatch.examples.tiny_models import build_tiny_qwen2
    from airflow_provider_raybatch.llm.config import ChatTask, EngineConfig

    companies = work / "companies"
    companies.mkdir(parents=True, exist_ok=True)
    pq.write_table(companies_table(rows), companies / "companies.parquet", row_group_size=1000)
    model = build_tiny_qwen2(work / "tiny-qwen2")
    task = ChatTask(
        prompt="What industry is this company in: {Company}",
        output_column="industry",
        sampling_params={"max_tokens": 16, "temperature": 0},
    )
    return companies, task, EngineConfig("transformers", str(model), engine_kwargs={"device": "cuda"})


def plain_chat(companies: Path, task: Any, engine: Any, batch_size: int) -> int:
    """The plain loop: the engine's own actor class called on batches, without Ray."""
    import pyarrow.parquet as pq

    from airflow_provider_raybatch.llm.engines.transformers import TransformersChat

    chat, rows = TransformersChat(task.to_dict(), engine.to_dict()), 0
    for batch in pq.ParquetFile(companies / "companies.parquet").iter_batches(batch_size=batch_size):
        answers = chat({name: batch.column(name).to_numpy(zero_copy_only=False) for name in batch.schema.names})
        rows += len(answers[task.output_column])
    return rows


def runner_chat(companies: Path, output: Path, task: Any, engine: Any, batch_size: int) -> int:
    from airflow_provider_raybatch.llm.build import build_stages
    from airflow_provider_raybatch.pipeline import BatchInferenceConfig, ReplicaResources
    from airflow_provider_raybatch.pipeline.runner import run_batch_inference

    stages = build_stages(task, engine, ReplicaResources(batch_size=batch_size, num_gpus=1))
    config = BatchInferenceConfig(str(companies), str(output), stages, id_column="id", max_error_fraction=1.0)
    return run_batch_inference(config).rows_out


def plain_vllm(companies: Path, task: Any, engine: Any, batch_size: int) -> int:
    """vLLM's own offline loop on the GPU: every row's chat messages in one ``LLM.chat`` call."""
    import pyarrow.parquet as pq
    from vllm import LLM, SamplingParams

    from airflow_provider_raybatch.llm.prompts import chat_messages

    table = pq.read_table(companies / "companies.parquet", columns=["Company"])
    conversations = [chat_messages(task, {"Company": c}) for c in table["Company"].to_pylist()]
    llm = LLM(model=engine.model, **engine.engine_kwargs)
    return len(llm.chat(conversations, SamplingParams(**task.sampling_params), use_tqdm=False))


def runner_vllm(companies: Path, output: Path, task: Any, engine: Any, batch_size: int) -> int:
    from airflow_provider_raybatch.llm.build import build_stages
    from airflow_provider_raybatch.pipeline import BatchInferenceConfig, ReplicaResources
    from airflow_provider_raybatch.pipeline.runner import run_batch_inference

    # num_gpus=None: vLLM's own count (tensor x pipeline parallel size), one GPU here.
    stages = build_stages(task, engine, ReplicaResources(batch_size=batch_size, num_gpus=None))
    config = BatchInferenceConfig(str(companies), str(output), stages, id_column="id", max_error_fraction=1.0)
    return run_batch_inference(config).rows_out


def vllm_missing() -> str | None:
    """Why the ``vllm`` workload cannot run here (None: vLLM's GPU build is installed)."""
    from airflow_provider_raybatch.llm.engines.vllm import installed_vllm

    build = installed_vllm()
    if build == "gpu":
        return None
    found = "vLLM's CPU build" if build == "cpu" else "no vllm"
    return (
        f"vllm workload not run: it needs vLLM's CUDA build (airflow-provider-raybatch[vllm]), and this "
        f"environment has {found}. The GPU machines lent to this project reach no package index and carry at most "
        "64 MiB, so vLLM's CUDA wheel (336 MB) cannot be installed there; vLLM runs on CPUs in `make test-vllm`."
    )


def main() -> None:
    from airflow_provider_raybatch.llm.config import EngineConfig
    from benchmarks.support.data import make_input
    from benchmarks.support.paths import DEFAULT_RESULTS_DIR
    from benchmarks.support.results import Results
    from benchmarks.support.stats import ratio

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16_000_000, help="rows of the torch workload")
    parser.add_argument("--chat-rows", type=int, default=20_000, help="rows of the transformers workload")
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--chat-batch-size", type=int, default=256)
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR)
    workloads = ["torch", "transformers", "vllm"]
    parser.add_argument("--workloads", nargs="+", choices=workloads, default=workloads)
    args = parser.parse_args()
    gpu = gpu_or_exit()
    # The runner's progress lines (ranges committed, rows/s) beside the results.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # The runner's own Ray, started and stopped here: nothing outlives the check.
    os.environ.setdefault("RAYBATCH_LOCAL_RAY", "per-task")
    results = Results("gpu_check", f"GPU check on {gpu}: the runner against a plain loop on the same GPU", args)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    speed: dict[tuple[str, str], float] = {}

    def timed(workload: str, variant: str, run: Callable[[], int]) -> None:
        with Utilisation() as utilisation:
            started = time.monotonic()
            rows = run()
            seconds = time.monotonic() - started
        speed[workload, variant] = rows / seconds
        results.add(
            workload=workload,
            variant=variant,
            rows=rows,
            seconds=round(seconds, 2),
            rows_per_s=round(rows / seconds),
            **utilisation.summary(),
        )

    try:
        # Each workload: (its plain loop, the runner writing to a given output).
        runs: dict[str, tuple[Callable[[], int], Callable[[Path], int]]] = {}
        if "torch" in args.workloads:
            input_dir = make_input(work, args.rows)
            runs["torch"] = (
                partial(plain_torch, input_dir, work / "plain.parquet", args.batch_size),
                partial(runner_torch, input_dir, batch_size=args.batch_size),
            )
        if "transformers" in args.workloads:
            companies, task, engine = chat_setup(work, args.chat_rows)
            runs["transformers"] = (
                partial(plain_chat, companies, task, engine, args.chat_batch_size),
                partial(runner_chat, companies, task=task, engine=engine, batch_size=args.chat_batch_size),
            )
        if "vllm" in args.workloads and (why := vllm_missing()) is not None:
            print(f"gpu_check: {why}", file=sys.stderr, flush=True)
            results.note(why)
        elif "vllm" in args.workloads:
            companies, task, _ = chat_setup(work, args.chat_rows)
            engine = EngineConfig("vllm", str(work / "tiny-qwen2"), engine_kwargs={"max_model_len": 512})
            runs["vllm"] = (
                partial(plain_vllm, companies, task, engine, args.chat_batch_size),
                partial(runner_vllm, companies, task=task, engine=engine, batch_size=args.chat_batch_size),
            )
        for workload, (plain, runner) in runs.items():
            timed(workload, "plain", partial(in_new_process, plain))
            timed(workload, "runner", partial(runner, work / f"out-{workload}"))
        import ray

        from airflow_provider_raybatch.pipeline.runtime.local_ray import python_path_runtime_env

        ray.init(include_dashboard=False, runtime_env=python_path_runtime_env(), configure_logging=False)
        try:
            for workload, (_, runner) in runs.items():
                timed(workload, "runner_ray_up", partial(runner, work / f"out-{workload}-ray-up"))
        finally:
            ray.shutdown()
        for workload in runs:
            for variant in ("runner", "runner_ray_up"):
                value = round(ratio(speed[workload, variant], speed[workload, "plain"]), 2)
                results.check(f"{workload}: {variant} / plain loop, rows/s", value, "(report)", None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        results.write()


if __name__ == "__main__":
    main()
