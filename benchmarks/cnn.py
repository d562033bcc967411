"""The image benchmark's work (``benchmarks/images.py``): JPEG decode and resize, a small CNN.

Ray Data's batch inference guide for images, without torchvision (CPU torch cannot import it
here): Pillow decodes and resizes, numpy scales and normalises, and :class:`CNN`, four strided
3x3 convolutions and a linear layer, classifies 224x224 RGB images. Ray's workers import this
module by path (``benchmarks.cnn:preprocess``, ``benchmarks.cnn:CNN``), as they would a user's.

Every variant calls :func:`preprocess` (Daft: its own decode and resize, then :func:`normalize`)
and :class:`CNN`, which time themselves into ``$RAYBATCH_BENCH_TIMINGS`` when it is set (one
JSON line per batch: stage, process, start, end, images), so that each variant's time can be
split into decode, model and the rest (hand-off between stages, writing, waiting).
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from benchmarks.support.timings import record

IMAGE_SIZE = 224
CLASSES = 10
CHANNELS = (32, 64, 128, 256)
MODEL_CLASS = "benchmarks.cnn:CNN"
#: ImageNet's mean and standard deviation per channel, as the guide's ``Normalize``.
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class CNN(nn.Module):
    """3x224x224 -> four stride-2 3x3 convolutions (32-64-128-256 channels) -> average -> classes.

    About 0.4 GFLOP per image (~11 ms on 2 cores, twice the decode and normalisation): the model
    is most of a plain loop's time, as in the guide's ResNet example.
    """

    def __init__(self, channels: tuple[int, ...] = CHANNELS, classes: int = CLASSES):
        super().__init__()
        layers: list[nn.Module] = []
        for n_in, n_out in zip((3, *channels), channels, strict=False):
            layers += [nn.Conv2d(n_in, n_out, kernel_size=3, stride=2, padding=1), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        started = time.time()
        logits = self.head(self.features(x).mean(dim=(2, 3)))
        record("model", started, x.shape[0])
        return logits


def save_cnn_weights(path: Path, seed: int = 0) -> Path:
    """Random weights (seeded), saved as safetensors like a trained model would be."""
    from safetensors.torch import save_file

    if not path.exists():
        torch.manual_seed(seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(CNN().state_dict(), str(path))
    return path


def load_cnn(weights_path: str, threads: int) -> CNN:
    from safetensors.torch import load_file

    torch.set_num_threads(threads)
    model = CNN()
    model.load_state_dict(load_file(weights_path))
    return model.eval()


def decode_resize(data: bytes) -> np.ndarray:
    """JPEG bytes -> (IMAGE_SIZE, IMAGE_SIZE, 3) uint8, resized bilinearly (Pillow)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.draft("RGB", (IMAGE_SIZE, IMAGE_SIZE))  # JPEG: decode at a smaller scale when it can
        return np.asarray(image.convert("RGB").resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR))


def normalize(images: np.ndarray) -> np.ndarray:
    """(N, H, W, 3) uint8 -> (N, 3, H, W) float32 scaled to [0, 1] and normalised, as the guide's
    ``ToTensor()`` + ``Normalize(mean, std)``."""
    x = images.astype(np.float32)
    x *= 1 / (255 * STD)  # in place, channels last: one pass over contiguous memory each
    x -= MEAN / STD
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def preprocess(batch: dict[str, np.ndarray], column: str = "image") -> dict[str, np.ndarray]:
    """The CPU preprocessing stage: decode and resize each JPEG of ``column``, normalise the batch.

    Returns only ``column`` (float32, N x 3 x 224 x 224); the hand-written pipeline adds the id.
    """
    started = time.time()
    images = np.stack([decode_resize(data) for data in batch[column]])
    pixels = normalize(images)
    record("decode", started, len(images))
    return {column: pixels}
