"""The ways of classifying the same Parquet of JPEG images that ``benchmarks/images.py`` compares.

Run as the other variants are (``python -m benchmarks.variants images_<name> PARAMS``, in a
child process: ``benchmarks.support.runs.run_variant``), each the image workload of Ray's batch
inference guide: decode and resize on CPUs, classify with a CNN (:mod:`benchmarks.cnn`), write
each image's id and label.

- ``images_plain``: one process, no Ray: ``iter_batches``, :func:`~benchmarks.cnn.preprocess`,
  the model, a ``ParquetWriter``; each phase timed (read, decode, model, write).
- ``images_operator``: ``RayBatchInferenceOperator.execute`` with two stages, as a user writes
  them: ``preprocess`` on a CPU replica, then the built-in ``TorchPredictor`` (``argmax``).
- ``images_handwritten``: the guide's pipeline: ``read_parquet`` -> ``map_batches(preprocess)``
  (tasks) -> ``map_batches(Classifier, compute=ActorPoolStrategy(size=1))`` -> ``write_parquet``.
- ``images_daft``: Daft's image functions (decode, resize) -> a ``@daft.cls`` class UDF that
  normalises and classifies -> ``write_parquet``, on Daft's native runner with ``.venv-daft``'s
  interpreter (no Pillow needed there: Daft decodes itself).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from benchmarks.cnn import IMAGE_SIZE, MODEL_CLASS, load_cnn, normalize, preprocess
from benchmarks.support.timings import record

OUTPUT_SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.int64())])


def _count_rows(output: str) -> int:
    return sum(pq.read_metadata(f).num_rows for f in Path(output).glob("*.parquet"))


# --- plain: one process -----------------------------------------------------------------------


def plain(p: dict[str, Any]) -> dict[str, Any]:
    model = load_cnn(p["weights"], p["threads"])
    output = Path(p["output"])
    output.mkdir(parents=True)
    rows = 0
    for index, path in enumerate(sorted(Path(p["input"]).glob("*.parquet"))):
        with pq.ParquetWriter(output / f"part-{index:04d}.parquet", OUTPUT_SCHEMA) as writer:
            batches = pq.ParquetFile(path).iter_batches(batch_size=p["batch_size"], columns=["id", "image"])
            while True:
                started = time.time()
                batch = next(batches, None)
                if batch is None:
                    break
                images = batch.column("image").to_numpy(zero_copy_only=False)
                record("read", started, batch.num_rows)
                x = torch.from_numpy(preprocess({"image": images})["image"])
                with torch.inference_mode():
                    labels = model(x).argmax(dim=1).numpy()
                started = time.time()
                writer.write_batch(pa.record_batch([batch.column("id"), pa.array(labels)], schema=OUTPUT_SCHEMA))
                record("write", started, batch.num_rows)
                rows += batch.num_rows
            # The writer buffers a row group: most of a small file's write happens at its close.
            started = time.time()
            writer.close()
            record("write", started, 0)
    return {"rows": rows}


# --- the operator: a CPU preprocessing stage and a model stage ---------------------------------


def operator(p: dict[str, Any]) -> dict[str, Any]:
    from types import SimpleNamespace

    from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator
    from airflow_provider_raybatch.pipeline import Stage

    task = RayBatchInferenceOperator(
        task_id="classify",
        input_path=p["input"],
        output_path=p["output"],
        stages=[
            Stage(
                "benchmarks.cnn:preprocess",
                {"column": "image"},
                name="preprocess",
                batch_size=p["batch_size"],
                concurrency=1,
                num_cpus=1,
            ),
            Stage(
                "airflow_provider_raybatch.predictors.torch:TorchPredictor",
                {
                    "model_class": MODEL_CLASS,
                    "weights_path": p["weights"],
                    "input_column": "image",
                    "output_column": "label",
                    "argmax": True,
                    "num_threads": p["threads"],
                },
                name="classify",
                batch_size=p["batch_size"],
                concurrency=p.get("concurrency", 1),
                num_cpus=p.get("num_cpus", 1),
            ),
        ],
        columns=["id", "image"],
        keep_columns=["id"],
        id_column="id",
        rows_per_range=p["rows_per_range"],
        mode="resume",
        ray_conn_id=None,  # embedded local Ray, as with no `ray` connection configured
        asset=None,
    )
    context: Any = {
        "ti": SimpleNamespace(dag_id="bench", run_id="bench", task_id="classify", map_index=-1, try_number=1)
    }
    summary = task.execute(context)
    return {"rows": summary["rows_processed"], "summary": summary}


# --- the guide's hand-written Ray Data pipeline -----------------------------------------------


def guide_preprocess(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The guide's preprocessing function: the same decode, resize and normalisation; keeps the id."""
    return {"id": batch["id"], **preprocess(batch)}


class Classifier:
    """The guide's classifier: the model built once per actor, numpy batches, the predicted label."""

    def __init__(self, weights_path: str, threads: int):
        self.model = load_cnn(weights_path, threads)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            labels = self.model(torch.from_numpy(batch["image"])).argmax(dim=1).numpy()
        return {"id": batch["id"], "label": labels}


def handwritten(p: dict[str, Any]) -> dict[str, Any]:
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    # Started as the operator starts its embedded Ray, so that start-up costs the same.
    ray.init(include_dashboard=False, configure_logging=False)
    try:
        DataContext.get_current().enable_progress_bars = False
        ds = ray.data.read_parquet(p["input"], columns=["id", "image"])
        ds = ds.map_batches(guide_preprocess, batch_size=p["batch_size"])
        ds = ds.map_batches(
            Classifier,
            fn_constructor_kwargs={"weights_path": p["weights"], "threads": p["threads"]},
            batch_size=p["batch_size"],
            compute=ActorPoolStrategy(size=p.get("concurrency", 1)),  # the guide's concurrency=1
            num_cpus=p.get("num_cpus", 1),
        )
        ds.write_parquet(p["output"])
    finally:
        ray.shutdown()
    return {"rows": _count_rows(p["output"])}


# --- Daft ------------------------------------------------------------------------------------


def daft_images(p: dict[str, Any]) -> dict[str, Any]:
    """Daft's image functions decode and resize; a class UDF (one instance) normalises and classifies.

    Daft's import is inside the clock, as Ray's is for the Ray variants.
    """
    import daft
    from daft import col

    weights_path, threads = p["weights"], p["threads"]

    @daft.cls(max_concurrency=1)
    class Classify:
        def __init__(self) -> None:
            self.model = load_cnn(weights_path, threads)

        @daft.method.batch(return_dtype=daft.DataType.int64(), batch_size=p["batch_size"])
        def __call__(self, images: daft.Series) -> np.ndarray:
            started = time.time()
            pixels = normalize(np.stack(images.to_pylist()))
            record("normalize", started, len(pixels))
            with torch.inference_mode():
                return self.model(torch.from_numpy(pixels)).argmax(dim=1).numpy()

    df = daft.read_parquet(str(Path(p["input"]) / "*.parquet"))
    pixels = col("image").decode_image(mode="RGB").resize(IMAGE_SIZE, IMAGE_SIZE)
    df = df.select("id", Classify()(pixels).alias("label"))
    df.write_parquet(p["output"])
    return {"rows": _count_rows(p["output"]), "daft_version": daft.__version__}


VARIANTS = {
    "images_plain": plain,
    "images_operator": operator,
    "images_handwritten": handwritten,
    "images_daft": daft_images,
}
