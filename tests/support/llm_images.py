"""Test images as real PNG / JPEG bytes, some corrupt, for the VLM tests."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def image_bytes(i: int, fmt: str = "PNG", size: tuple[int, int] | None = None) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(i)
    size = size or (20 + i % 17, 16 + i % 11)  # sizes differ: the image stage resizes them
    pixels = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


#: id -> a corrupt value and the start of the reason it must be rejected with.
CORRUPT = {
    5: (lambda: image_bytes(5)[:60], "cannot decode image: OSError: image file is truncated"),
    11: (lambda: bytes(np.random.default_rng(11).integers(0, 255, 300, dtype=np.uint8)), "cannot decode image"),
    17: (lambda: None, "missing image (null)"),
    23: (lambda: b"", "missing image (empty bytes)"),
}


def write_images(folder: Path, rows: int, row_group_size: int = 10) -> list[int]:
    """``rows`` images (PNG and JPEG) as Parquet (``id``, ``jpg``), some corrupt; returns the valid ids."""
    values = [CORRUPT[i][0]() if i in CORRUPT else image_bytes(i, "JPEG" if i % 2 else "PNG") for i in range(rows)]
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": pa.array(range(rows), pa.int64()), "jpg": pa.array(values, pa.binary())})
    pq.write_table(table, folder / "images.parquet", row_group_size=row_group_size)
    return [i for i in range(rows) if i not in CORRUPT]
