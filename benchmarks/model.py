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
    """32 -> hidden (x layers) -> outputs. The default, 32-256-256-10, is big enough that inference,
    not I/O, is most of a plain loop's time; :data:`SHAPES` names lighter ones."""

    def __init__(self, hidden: int = 256, layers: int = 2, outputs: int = OUTPUTS):
        super().__init__()
        sizes = [FEATURES] + [hidden] * layers + [outputs]
        modules: list[nn.Module] = []
        for n_in, n_out in zip(sizes, sizes[1:], strict=False):
            modules += [nn.Linear(n_in, n_out), nn.ReLU()]
        self.net = nn.Sequential(*modules[:-1])  # no ReLU after the last layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


#: Model shapes by name (MLP keyword arguments): the data path shows under a light model.
SHAPES: dict[str, dict[str, int]] = {
    "heavy": {},  # 32-256-256-10
    "light": {"hidden": 64, "layers": 1},  # 32-64-10
    "wide": {"hidden": 64, "layers": 1, "outputs": 256},  # 32-64-256: 256 float32 out per row
}


def save_weights(path: Path, seed: int = 0, **shape: int) -> Path:
    """Random weights (seeded), saved as safetensors like a trained model would be."""
    from safetensors.torch import save_file

    if not path.exists():
        torch.manual_seed(seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(MLP(**shape).state_dict(), str(path))
    return path


def load_model(weights_path: str, threads: int, **shape: int) -> MLP:
    from safetensors.torch import load_file

    torch.set_num_threads(threads)
    model = MLP(**shape)
    model.load_state_dict(load_file(weights_path))
    return model.eval()


class GuideClassifier:
    """A user's predictor as Ray's batch inference guide shows one: the model built in
    ``__init__``, ``argmax`` in ``__call__`` on numpy batches, no thread or engine settings.

    The light MLP (32-64-10) with the benchmark's weights, so its labels are the argmax of the
    other variants' logits; with ``model="wide"`` (32-64-256) it returns the 256 outputs of each
    row instead (an embedding).
    """

    def __init__(self, weights_path: str, model: str = "light"):
        from safetensors.torch import load_file

        self.embeds = model == "wide"
        self.model = MLP(**SHAPES[model])
        self.model.load_state_dict(load_file(weights_path))
        self.model.eval()

    def __call__(self, batch: dict) -> dict:
        with torch.inference_mode():
            outputs = self.model(torch.as_tensor(batch["features"]))
        if self.embeds:
            return {"embedding": outputs.numpy()}
        return {"label": outputs.argmax(dim=1).numpy()}
