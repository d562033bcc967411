"""The image stage of a VLM pipeline: decode, check and resize each image, reject the invalid ones.

Runs on CPU before the engine, so that a corrupt image costs a row in the rejects, never a failed
model batch. Each valid image leaves as a PNG (lossless, any engine reads it) of ``image_size``.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa

from airflow_provider_raybatch.llm.config import PREPARED_IMAGE_COLUMN, ChatTask
from airflow_provider_raybatch.pipeline.columns import INVALID_INPUT, REJECT_COLUMN, REJECT_KIND_COLUMN

#: Refuse images whose pixel count would make decoding itself a memory hazard (Pillow's bomb check).
MAX_IMAGE_PIXELS = 64_000_000


def load_image_bytes(value: Any) -> bytes:
    """The encoded bytes of one image cell: bytes, a ``{"bytes", "path"}`` struct, or a path / URL.

    Raises ``ValueError`` with the reason a row is rejected.
    """
    if value is None:
        raise ValueError("missing image (null)")
    if isinstance(value, dict):  # as Hugging Face datasets write an Image feature
        if value.get("bytes") is not None:
            return bytes(value["bytes"])
        if value.get("path"):
            return _read(value["path"])
        raise ValueError("missing image (struct with neither bytes nor path)")
    if isinstance(value, (bytes, bytearray, memoryview)):
        if not len(value):
            raise ValueError("missing image (empty bytes)")
        return bytes(value)
    if isinstance(value, str):
        if not value:
            raise ValueError("missing image (empty path)")
        return _read(value)
    raise ValueError(f"unsupported image value of type {type(value).__name__}")


def _read(path: str) -> bytes:
    import fsspec

    # Local paths, http(s):// and s3:// (credentials from the environment: never from the row).
    try:
        with fsspec.open(path, "rb") as f:
            return f.read()
    except Exception as e:  # noqa: BLE001 - any failure to read is a reason to reject this row
        raise ValueError(f"cannot read image file {path!r}: {type(e).__name__}: {e}") from e


def decode_image(data: bytes) -> Any:
    """The image, decoded fully (a truncated file fails here, not in the model), as an RGB ``PIL.Image``.

    Raises ``ValueError`` with the reason a row is rejected.
    """
    from PIL import Image, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert("RGB")
    except UnidentifiedImageError as e:
        raise ValueError(f"cannot decode image: not a known image format ({len(data)} bytes)") from e
    except Exception as e:  # noqa: BLE001 - Pillow raises many types for bad data
        raise ValueError(f"cannot decode image: {type(e).__name__}: {e}") from e


def prepare_image(data: bytes, size: tuple[int, int] | None) -> bytes:
    """Decode fully, convert to RGB, resize, PNG."""
    from PIL import Image

    rgb = decode_image(data)
    if size is not None and rgb.size != tuple(size):
        rgb = rgb.resize(tuple(size), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    rgb.save(out, format="PNG")
    return out.getvalue()


class PrepareImages:
    """Stage predictor: the prepared image (PNG bytes) and the prompt's columns, or a reject reason.

    :param task: a :class:`~airflow_provider_raybatch.llm.config.ChatTask` as a dict.
    """

    def __init__(self, task: dict[str, Any]):
        self.task = ChatTask.from_dict(task)

    def __call__(self, batch: pa.Table) -> dict[str, Any]:
        images: list[bytes | None] = []
        reasons: list[str | None] = []
        for value in batch.column(self.task.image_column).to_pylist():
            try:
                images.append(prepare_image(load_image_bytes(value), self.task.image_size))
                reasons.append(None)
            except ValueError as e:
                images.append(None)
                reasons.append(str(e))
        out: dict[str, Any] = {name: batch.column(name) for name in self.task.prompt_fields()}
        out[PREPARED_IMAGE_COLUMN] = pa.array(images, pa.binary())
        out[REJECT_COLUMN] = pa.array(reasons, pa.string())
        out[REJECT_KIND_COLUMN] = pa.array([INVALID_INPUT if r else None for r in reasons], pa.string())
        return out
