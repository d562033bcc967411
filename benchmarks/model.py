"""The benchmark model: a small MLP over a 32-float feature column.

Ray workers import it by path (``benchmarks.model:MLP``), as they would a user's model class.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

FEATURES = 32
OUTPUTS = 10
MODEL_CLASS = "benchmarks.model:MLP"


class MLP(nn.Module):
    """32 -> 256 -> 256 -> 10: big enough that inference, not I/O, is most of a plain loop's time."""

    def __init__(self, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, OUTPUTS)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def save_weights(path: Path, seed: int = 0) -> Path:
    """Random weights (seeded), saved as safetensors like a trained model would be."""
    from safetensors.torch import save_file

    if not path.exists():
        torch.manual_seed(seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(MLP().state_dict(), str(path))
    return path


def load_model(weights_path: str, threads: int) -> MLP:
    from safetensors.torch import load_file

    torch.set_num_threads(threads)
    model = MLP()
    model.load_state_dict(load_file(weights_path))
    return model.eval()
