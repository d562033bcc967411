"""The ways of scoring the same Parquet with the same model that the benchmarks compare.

``python -m benchmarks.variants NAME '{"input": ..., "output": ..., ...}'`` runs one of them
in this process and prints ``RESULT {json}``; ``benchmarks.support.runs.run_variant`` does that in a
child process. The clock starts after the imports that every variant shares (pyarrow, torch,
and Airflow for the operator, as a task process already has them) and stops when the output is
complete and Ray is shut down.

- ``plain``: one process, no Ray: pyarrow ``iter_batches``, zero-copy ``torch.from_numpy``,
  ``torch.inference_mode``, Parquet written with row groups of the operator's size.
- ``operator``: ``RayBatchInferenceOperator.execute`` (embedded Ray, checkpointed ranges) with
  the built-in ``TorchPredictor``, i.e. ``run_batch_inference`` as every task runs it.
- ``operator_defaults``: the operator on its defaults (``batch_size`` and ``id_column`` set) with a
  user's predictor class as Ray's guide shows one (:class:`benchmarks.model.GuideClassifier`: the light
  model, ``argmax``, no thread settings).
- ``handwritten``: Ray's batch inference guide as users write it: ``read_parquet`` ->
  ``map_batches(class)`` on numpy batches -> ``write_parquet``.
- ``handwritten_arrow``: the same with pyarrow batches and a zero-copy tensor view, the fastest
  hand-written Ray Data pipeline we know for this model.
- ``daft``: Daft's class UDF on its native (local, multi-threaded) runner: ``daft.read_parquet``
  -> ``select`` of the id and a ``@daft.cls`` batch method's logits -> ``write_parquet``. Daft needs pyarrow < 26,
  the project pins 26: this one runs with ``.venv-daft``'s interpreter (``make daft-env``), so
  it imports daft inside its function and this module imports nothing that venv lacks.
- ``quickstart``: the quick start's task, its replica's start timed (``benchmarks/cold_start.py``).
- ``images_*``: the image workload of ``benchmarks/images.py`` (``benchmarks.image_variants``).
- ``vllm_*``: vLLM on CPUs, ``benchmarks/vllm_cpu.py`` (``benchmarks.vllm_variants``, in ``.venv-vllm``).
- ``embed_*``: text embeddings, ``benchmarks/embedding.py`` (``benchmarks.embedding_variants``).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from benchmarks.model import FEATURES, MODEL_CLASS, OUTPUTS, SHAPES, load_model

OUTPUT_ROW_GROUP_ROWS = 65_536  # as the operator's writer
# Arrow buffers are read-only; the model only reads its input, so a zero-copy view is safe.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def features_view(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A (rows, FEATURES) float32 view of a fixed-size list column, without copying."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return array.flatten().to_numpy(zero_copy_only=True).reshape(-1, FEATURES)


def logits_column(logits: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(logits.reshape(-1)), logits.shape[1])


# --- plain: no Ray ----------------------------------------------------------------------------


def plain(p: dict[str, Any]) -> dict[str, Any]:
    model = load_model(p["weights"], p["threads"], **SHAPES[p.get("model", "heavy")])
    output = Path(p["output"])
    output.mkdir(parents=True)
    rows = 0
    for index, path in enumerate(sorted(Path(p["input"]).glob("*.parquet"))):
        schema = pa.schema([("id", pa.int64()), ("logits", pa.list_(pa.float32(), model.net[-1].out_features))])
        with pq.ParquetWriter(output / f"part-{index:04d}.parquet", schema) as writer:
            pending: list[pa.RecordBatch] = []
            for batch in pq.ParquetFile(path).iter_batches(batch_size=p["batch_size"], columns=["id", "features"]):
                x = torch.from_numpy(features_view(batch.column("features")))
                with torch.inference_mode():
                    logits = model(x).numpy()
                pending.append(pa.record_batch([batch.column("id"), logits_column(logits)], schema=schema))
                rows += batch.num_rows
                if sum(b.num_rows for b in pending) >= OUTPUT_ROW_GROUP_ROWS:
                    writer.write_table(pa.Table.from_batches(pending), row_group_size=OUTPUT_ROW_GROUP_ROWS)
                    pending = []
            if pending:
                writer.write_table(pa.Table.from_batches(pending), row_group_size=OUTPUT_ROW_GROUP_ROWS)
    return {"rows": rows}


# --- the operator -----------------------------------------------------------------------------


def task_context() -> dict[str, Any]:
    """What ``execute()`` reads of an Airflow context, for a benchmark's task outside a DAG run."""
    from types import SimpleNamespace

    return {"ti": SimpleNamespace(dag_id="bench", run_id="bench", task_id="score", map_index=-1, try_number=1)}


def operator(p: dict[str, Any]) -> dict[str, Any]:
    from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

    task = RayBatchInferenceOperator(
        task_id="score",
        input_path=p["input"],
        output_path=p["output"],
        predictor="airflow_provider_raybatch.predictors.torch:TorchPredictor",
        predictor_kwargs={
            "model_class": MODEL_CLASS,
            "model_kwargs": SHAPES[p.get("model", "heavy")],
            "weights_path": p["weights"],
            "input_column": "features",
            "output_column": "logits",
            "num_threads": p["threads"],
        },
        batch_size=p["batch_size"],
        concurrency=p.get("concurrency", 1),
        num_cpus=p.get("num_cpus", 1),
        columns=["id", "features"],
        keep_columns=["id"],
        id_column="id",
        rows_per_range=p["rows_per_range"],
        mode="resume",
        ray_conn_id=None,  # embedded local Ray, as with no `ray` connection configured
        asset=None,  # no DAG run here to emit an asset event in
        # A table output (benchmarks/tables.py); Iceberg's catalog: the embedded SQLite one.
        output_format=p.get("output_format", "parquet"),
        table=p.get("table"),
        table_partition={"ds": p.get("ds", "2026-11-24")},  # rendered: execute() is called without templating
        iceberg_conn_id=None,
        table_commit_interval=p.get("table_commit_interval", 60.0),
    )
    context = task_context()
    driver_bytes = _count_driver_bytes() if p.get("count_driver_bytes") else None
    if p.get("ray_address"):
        # An existing cluster: what execute() does once the hook resolved a connection's address.
        import ray

        from airflow_provider_raybatch.pipeline.runner import run_batch_inference
        from airflow_provider_raybatch.pipeline.runtime.local_ray import python_path_runtime_env

        # The job's workers import the provider this process imports (another commit's, with
        # package_root), not the one on the cluster nodes' own PYTHONPATH.
        ray.init(address=p["ray_address"], runtime_env=python_path_runtime_env())
        summary = run_batch_inference(task.build_config(context), ray_address=p["ray_address"]).to_dict()
    else:
        summary = task.execute(context)
    result = {"rows": summary["rows_processed"], "summary": summary}
    if driver_bytes is not None:
        result["driver_bytes"] = driver_bytes[0]
        result["driver_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return result


def operator_defaults(p: dict[str, Any]) -> dict[str, Any]:
    """The operator as a new user runs it: their own predictor class (:class:`benchmarks.model.GuideClassifier`,
    which sets no threads), every argument on its default but ``batch_size`` and ``id_column``."""
    from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

    task = RayBatchInferenceOperator(
        task_id="score",
        input_path=p["input"],
        output_path=p["output"],
        predictor="benchmarks.model:GuideClassifier",
        predictor_kwargs={"weights_path": p["weights"], "model": p.get("model", "light")},
        batch_size=p["batch_size"],
        id_column="id",
        ray_conn_id=None,  # no `ray` connection: the local Ray (shared by default)
        asset=None,  # no DAG run here to emit an asset event in
    )
    context = task_context()
    summary = task.execute(context)
    return {"rows": summary["rows_processed"], "summary": summary}


#: Lines of a task's log that mark the steps of its start (``benchmarks/cold_start.py``).
START_MARKS = {
    "ranges to process": "planned",
    "Starting the shared local Ray": "head start asked",
    "Connected to the shared local Ray": "connected",
}


def quickstart(p: dict[str, Any]) -> dict[str, Any]:
    """The quick start's task (``dags/daily_batch_inference.py``'s arguments on its defaults) with
    :class:`benchmarks.timed_predictor.TimedTorchPredictor`; ``marks``: when its log said each of
    :data:`START_MARKS` (wall-clock)."""
    import logging

    from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

    marks: dict[str, float] = {}

    class Marks(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            for text, mark in START_MARKS.items():
                if text in message:
                    marks.setdefault(mark, record.created)

    logger = logging.getLogger("airflow_provider_raybatch")
    logger.setLevel(logging.INFO)
    logger.addHandler(Marks())
    task = RayBatchInferenceOperator(
        task_id="predict_digits",
        input_path=p["input"],
        output_path=p["output"],
        predictor="benchmarks.timed_predictor:TimedTorchPredictor",
        predictor_kwargs={
            "model_class": "airflow_provider_raybatch.examples.digits:DigitsMLP",
            "weights_path": p["weights"],
            "input_column": "features",
            "output_column": "predicted_label",
            "argmax": True,
        },
        batch_size=256,
        concurrency=1,
        keep_columns=["id", "label"],
        id_column="id",
        rows_per_range=200,
        ray_conn_id=None,  # no `ray` connection: the local Ray (shared by default)
        asset=None,  # no DAG run here to emit an asset event in
    )
    summary = task.execute(task_context())
    return {"rows": summary["rows_processed"], "summary": summary, "marks": marks}


def _count_driver_bytes() -> list[int]:
    """Count the bytes of every batch this process takes from a Ray dataset (one counter, in a list)."""
    import ray.data

    counted = [0]
    iter_batches = ray.data.Dataset.iter_batches

    def counting(self, *args, **kwargs):
        for batch in iter_batches(self, *args, **kwargs):
            counted[0] += batch.nbytes
            yield batch

    ray.data.Dataset.iter_batches = counting
    return counted


# --- hand-written Ray Data pipelines ----------------------------------------------------------


class GuidePredictor:
    """As in Ray's batch inference guide: the model built once per actor, numpy batches."""

    def __init__(self, weights_path: str, threads: int, shape: dict[str, int]):
        self.model = load_model(weights_path, threads, **shape)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # A fixed-size list column arrives as an object array of rows: stack it into a matrix.
        x = torch.as_tensor(np.stack(batch["features"]))
        with torch.inference_mode():
            logits = self.model(x).numpy()
        return {"id": batch["id"], "logits": logits}


class ArrowPredictor:
    """The same model on pyarrow batches, through a zero-copy view of the feature column."""

    def __init__(self, weights_path: str, threads: int, shape: dict[str, int]):
        self.model = load_model(weights_path, threads, **shape)

    def __call__(self, batch: pa.Table) -> pa.Table:
        x = torch.from_numpy(features_view(batch.column("features")))
        with torch.inference_mode():
            logits = self.model(x).numpy()
        return pa.table({"id": batch.column("id"), "logits": logits_column(logits)})


def handwritten(p: dict[str, Any], arrow: bool = False) -> dict[str, Any]:
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    # Started as the operator starts its embedded Ray, so that start-up costs the same.
    ray.init(include_dashboard=False, configure_logging=False)
    try:
        DataContext.get_current().enable_progress_bars = False
        ds = ray.data.read_parquet(p["input"], columns=["id", "features"])
        ds = ds.map_batches(
            ArrowPredictor if arrow else GuidePredictor,
            fn_constructor_kwargs={
                "weights_path": p["weights"],
                "threads": p["threads"],
                "shape": SHAPES[p.get("model", "heavy")],
            },
            batch_size=p["batch_size"],
            batch_format="pyarrow" if arrow else "numpy",
            zero_copy_batch=arrow,
            compute=ActorPoolStrategy(size=1),
            num_cpus=1,
        )
        ds.write_parquet(p["output"])
    finally:
        ray.shutdown()
    rows = sum(pq.read_metadata(f).num_rows for f in Path(p["output"]).glob("*.parquet"))
    return {"rows": rows}


# --- Daft ------------------------------------------------------------------------------------


def daft_udf(p: dict[str, Any]) -> dict[str, Any]:
    """Daft's documented pattern for a model: a class UDF whose instance holds the model, batch calls.

    Daft's import is inside the clock, as Ray's is for the operator: both are the engine a task
    would start. One instance of the class (``max_concurrency=1``), the same batch size and torch
    threads as every variant; Daft picks the rest (in-process or not, its own I/O threads).
    """
    import daft

    shape = SHAPES[p.get("model", "heavy")]
    outputs = shape.get("outputs", OUTPUTS)
    weights_path, threads = p["weights"], p["threads"]

    @daft.cls(max_concurrency=1)
    class Scorer:
        def __init__(self) -> None:
            self.model = load_model(weights_path, threads, **shape)

        @daft.method.batch(
            return_dtype=daft.DataType.fixed_size_list(daft.DataType.float32(), outputs), batch_size=p["batch_size"]
        )
        def __call__(self, features: daft.Series) -> pa.Array:
            x = torch.from_numpy(features_view(features.to_arrow()))
            with torch.inference_mode():
                logits = self.model(x).numpy()
            return logits_column(logits)

    df = daft.read_parquet(str(Path(p["input"]) / "*.parquet"))
    df = df.select("id", Scorer()(df["features"]).alias("logits"))
    df.write_parquet(p["output"])
    rows = sum(pq.read_metadata(f).num_rows for f in Path(p["output"]).glob("*.parquet"))
    return {"rows": rows, "daft_version": daft.__version__}


def operator_series(p: dict[str, Any]) -> dict[str, Any]:
    """Several operator runs (``p["runs"]``: overrides of ``p``) in one embedded Ray, in order.

    Sharing one Ray start removes its 5-9 s of noise from comparisons of pipeline settings.
    """
    from airflow_provider_raybatch.pipeline.runtime.local_ray import ray_session

    runs = []
    with ray_session():
        for overrides in p["runs"]:
            run = {**p, **overrides}
            shutil.rmtree(run["output"], ignore_errors=True)
            started_at, started = time.time(), time.perf_counter()
            summary = operator(run)["summary"]
            runs.append(
                {
                    **overrides,
                    "wall_s": round(time.perf_counter() - started, 3),
                    "started_at": started_at,
                    "summary": summary,
                    "load_avg": os.getloadavg()[0],
                }
            )
    return {"rows": sum(r["summary"]["rows_processed"] for r in runs), "runs": runs}


def ray_start(p: dict[str, Any]) -> dict[str, Any]:
    """Import Ray, start it embedded as the operator does, stop it: the fixed cost's parts."""
    started = time.perf_counter()
    import ray

    imported = time.perf_counter()
    from airflow_provider_raybatch.pipeline.runtime.local_ray import ray_session

    with ray_session():
        initialised = time.perf_counter()
    stopped = time.perf_counter()
    return {
        "rows": 0,
        "import_s": round(imported - started, 3),
        "init_s": round(initialised - imported, 3),
        "shutdown_s": round(stopped - initialised, 3),
        "ray_version": ray.__version__,
    }


def _image_variant(name: str):
    """A variant of ``benchmarks.image_variants`` (images.py), imported when it runs."""

    def run(p: dict[str, Any]) -> dict[str, Any]:
        from benchmarks.image_variants import VARIANTS as IMAGE_VARIANTS

        return IMAGE_VARIANTS[name](p)

    return run


def _embedding_variant(name: str):
    """A variant of ``benchmarks.embedding_variants`` (embedding.py), imported when it runs."""

    def run(p: dict[str, Any]) -> dict[str, Any]:
        from benchmarks.embedding_variants import VARIANTS as EMBEDDING_VARIANTS

        return EMBEDDING_VARIANTS[name](p)

    return run


def _vllm_variant(name: str):
    """A variant of ``benchmarks.vllm_variants`` (vllm_cpu.py, in .venv-vllm), imported when it runs."""

    def run(p: dict[str, Any]) -> dict[str, Any]:
        from benchmarks.vllm_variants import VARIANTS as LLM_VARIANTS

        return LLM_VARIANTS[name](p)

    return run


IMAGE_VARIANTS = ("images_plain", "images_operator", "images_handwritten", "images_daft")
VLLM_VARIANTS = ("vllm_loop", "vllm_handwritten", "vllm_operator")
EMBEDDING_VARIANTS = ("embed_plain", "embed_operator", "embed_daft")
#: The variants that run Daft (in .venv-daft).
DAFT_VARIANTS = ("daft", "images_daft", "embed_daft")

VARIANTS = {
    **{name: _image_variant(name) for name in IMAGE_VARIANTS},
    **{name: _vllm_variant(name) for name in VLLM_VARIANTS},
    **{name: _embedding_variant(name) for name in EMBEDDING_VARIANTS},
    "operator_series": operator_series,
    "ray_start": ray_start,
    "plain": plain,
    "operator": operator,
    "operator_defaults": operator_defaults,
    "quickstart": quickstart,
    "handwritten": handwritten,
    "handwritten_arrow": lambda p: handwritten(p, arrow=True),
    "daft": daft_udf,
}


def main(argv: list[str]) -> None:
    name, params = argv[0], json.loads(argv[1])
    if params.get("package_root"):  # another checkout's provider (benchmarks/driver_path.py's "before")
        sys.path.insert(0, params["package_root"])
    if params.get("fresh_output", True) and "output" in params:
        shutil.rmtree(params["output"], ignore_errors=True)
    if name in ("operator", "images_operator", "operator_defaults", "quickstart", "vllm_operator", "embed_operator"):
        import airflow_provider_raybatch.operators.batch_inference  # noqa: F401 - a task process has it loaded
    started_at = time.time()
    print(f"STARTED {started_at}", flush=True)  # for a parent that kills this run before its result
    started = time.perf_counter()
    result = VARIANTS[name](params)
    wall = time.perf_counter() - started
    result.update(variant=name, wall_s=round(wall, 3), started_at=started_at, pid=os.getpid())
    result["rows_per_s"] = round(result["rows"] / wall, 1) if wall > 0 else 0.0
    print("RESULT " + json.dumps(result), flush=True)
    if name in DAFT_VARIANTS:
        # Daft's native threads may call into Python while the interpreter finalizes and abort it
        # (SIGABRT, "PyGILState_Release: thread state ... must be current"; seen once in CI, after
        # the result). The run and its output are complete here: end without finalizing.
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
