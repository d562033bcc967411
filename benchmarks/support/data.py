"""The work every benchmark does: generated Parquet input, the model's weights, the input's
constants (file and row group sizes, batch size, torch threads), and a moto S3 server."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS_PER_FILE = 500_000
ROW_GROUP_ROWS = 100_000
BATCH_SIZE = 4096
THREADS = os.cpu_count() or 1


def make_input(
    work_dir: Path, rows: int, rows_per_file: int = ROWS_PER_FILE, seed: int = 0, row_group_rows: int = ROW_GROUP_ROWS
) -> Path:
    """Parquet files of ``id`` (int64) and ``features`` (32 float32), reused when already there."""
    from benchmarks.model import FEATURES

    folder = work_dir / f"input-{rows}-{rows_per_file}"
    if row_group_rows != ROW_GROUP_ROWS:
        folder = folder.with_name(f"{folder.name}-{row_group_rows}")

    def columns(rng: np.random.Generator, n: int) -> dict[str, pa.Array]:
        x = rng.standard_normal((n, FEATURES), dtype=np.float32)
        return {"features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), FEATURES)}

    return _write_parts(folder, rows, rows_per_file, row_group_rows, seed, columns)


def _write_parts(
    folder: Path,
    rows: int,
    per_file: int,
    row_group_rows: int,
    seed: int,
    columns: Callable[[np.random.Generator, int], dict[str, pa.Array]],
) -> Path:
    """``folder`` of Parquet files of ``id`` (int64, from 0) and the ``columns`` of each file's rows,
    written once: a ``_COMPLETE`` marker (the planner skips a leading underscore) says it is whole."""
    marker = folder / "_COMPLETE"
    if marker.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    start, index = 0, 0
    while start < rows or index == 0:
        n = min(per_file, rows - start)
        table = pa.table({"id": pa.array(np.arange(start, start + n, dtype=np.int64)), **columns(rng, n)})
        pq.write_table(table, folder / f"part-{index:04d}.parquet", row_group_size=row_group_rows)
        start, index = start + n, index + 1
    marker.touch()
    return folder


def weights(work_dir: Path, model: str = "heavy") -> Path:
    from benchmarks.model import SHAPES, save_weights

    name = "mlp.safetensors" if model == "heavy" else f"mlp-{model}.safetensors"
    return save_weights(work_dir / name, **SHAPES[model])


def moto_s3(bucket: str) -> tuple[dict[str, Any], Any]:
    """A moto S3 server on loopback holding an empty ``bucket``: (fsspec storage options, server to stop)."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{server._server.server_port}", "region_name": "us-east-1"},
    }
    boto3.client(
        "s3", aws_access_key_id="testing", aws_secret_access_key="testing", **options["client_kwargs"]
    ).create_bucket(Bucket=bucket)
    return options, server


IMAGES_PER_FILE = 500
IMAGE_ROW_GROUP = 100


def make_image_input(work_dir: Path, images: int, per_file: int = IMAGES_PER_FILE, seed: int = 0) -> Path:
    """Parquet files of ``id`` (int64) and ``image`` (JPEG bytes), reused when already there.

    Generated photos-alike: a colour gradient, noise and a few filled shapes, 224 to 320 pixels a
    side (resized to 224x224 by the preprocessing), JPEG quality 90 (~15-25 kB each).
    """
    import io

    from PIL import Image, ImageDraw

    def columns(rng: np.random.Generator, n: int) -> dict[str, pa.Array]:
        encoded = []
        for _ in range(n):
            width, height = (int(v) for v in rng.integers(224, 321, size=2))
            ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
            a, b = rng.uniform(0, 255, size=(2, 3)).astype(np.float32)
            pixels = a + (b - a) * ((xs / width + ys / height) / 2)[..., None]
            pixels += rng.normal(0, 12, size=pixels.shape).astype(np.float32)
            image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
            draw = ImageDraw.Draw(image)
            for _ in range(int(rng.integers(2, 6))):
                x0, y0 = int(rng.integers(0, width - 40)), int(rng.integers(0, height - 40))
                box = (x0, y0, x0 + int(rng.integers(20, 120)), y0 + int(rng.integers(20, 120)))
                fill = tuple(int(c) for c in rng.integers(0, 256, size=3))
                (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=90)
            encoded.append(buffer.getvalue())
        return {"image": pa.array(encoded, pa.binary())}

    folder = work_dir / f"images-{images}-{per_file}"
    return _write_parts(folder, images, per_file, IMAGE_ROW_GROUP, seed, columns)


def cnn_weights(work_dir: Path) -> Path:
    from benchmarks.cnn import save_cnn_weights

    return save_cnn_weights(work_dir / "cnn.safetensors")
