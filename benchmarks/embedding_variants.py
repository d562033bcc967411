"""The ways of embedding the same Parquet of texts that ``benchmarks/embedding.py`` compares.

Run as the other variants are (``python -m benchmarks.variants embed_<name> PARAMS``, in a child
process), each with the same model folder (all-MiniLM-L6-v2), batch size and torch threads, writing
each row's id and unit vector as Parquet:

- ``embed_plain``: one process, no Ray: ``iter_batches`` and sentence-transformers' ``encode``
  (normalised), a ``ParquetWriter``; read, model and write timed.
- ``embed_operator``: ``EmbeddingOperator.execute`` (the ``transformers`` engine, one replica,
  ``normalize=True``) on its embedded local Ray, as a task runs it.
- ``embed_daft``: Daft's ``embed_text`` (its ``transformers`` provider, which runs
  sentence-transformers) on Daft's native runner, with ``.venv-daft``'s interpreter.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.support.timings import record


def _count_rows(output: str) -> int:
    return sum(pq.read_metadata(f).num_rows for f in Path(output).rglob("*.parquet"))


def plain(p: dict[str, Any]) -> dict[str, Any]:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(p["threads"])
    model = SentenceTransformer(p["model_path"], device="cpu")
    output = Path(p["output"])
    output.mkdir(parents=True)
    rows = 0
    for index, path in enumerate(sorted(Path(p["input"]).glob("*.parquet"))):
        writer = None
        for batch in pq.ParquetFile(path).iter_batches(batch_size=p["batch_size"], columns=["id", "text"]):
            started = time.time()
            vectors = model.encode(
                batch.column("text").to_pylist(), batch_size=p["batch_size"], normalize_embeddings=True
            )
            record("model", started, batch.num_rows)
            started = time.time()
            flat = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])
            table = pa.table({"id": batch.column("id"), "embedding": flat})
            writer = writer or pq.ParquetWriter(output / f"part-{index:04d}.parquet", table.schema)
            writer.write_table(table)
            record("write", started, batch.num_rows)
            rows += batch.num_rows
        if writer is not None:
            writer.close()
    return {"rows": rows}


def operator(p: dict[str, Any]) -> dict[str, Any]:
    from types import SimpleNamespace

    from airflow_provider_raybatch.operators.embedding import EmbeddingOperator

    task = EmbeddingOperator(
        task_id="embed",
        input_path=p["input"],
        output_path=p["output"],
        text_column="text",
        model=p["model_path"],
        normalize=True,
        truncated_column=None,
        engine_kwargs={"num_threads": p["threads"]},
        batch_size=p["batch_size"],
        num_cpus=1,
        keep_columns=["id"],
        id_column="id",
        rows_per_range=p["rows_per_range"],
        mode="resume",
        ray_conn_id=None,  # embedded local Ray, as with no `ray` connection configured
        asset=None,
    )
    context: Any = {"ti": SimpleNamespace(dag_id="bench", run_id="bench", task_id="embed", map_index=-1, try_number=1)}
    summary = task.execute(context)
    return {"rows": summary["rows_processed"], "summary": summary}


def daft_embed(p: dict[str, Any]) -> dict[str, Any]:
    """Daft's ``embed_text``; Daft's import is inside the clock, as Ray's is for the operator."""
    import daft
    import torch
    from daft import col
    from daft.functions import embed_text

    torch.set_num_threads(p["threads"])
    df = daft.read_parquet(str(Path(p["input"]) / "*.parquet"))
    vectors = embed_text(col("text"), provider="transformers", model=p["model_path"], batch_size=p["batch_size"])
    df = df.select("id", vectors.alias("embedding"))
    df.write_parquet(p["output"])
    return {"rows": _count_rows(p["output"]), "daft_version": daft.__version__}


VARIANTS = {"embed_plain": plain, "embed_operator": operator, "embed_daft": daft_embed}
