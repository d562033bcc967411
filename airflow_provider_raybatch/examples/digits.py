"""A small digit classifier for the quick start, trained in seconds on scikit-learn's digits.

``python -m airflow_provider_raybatch.examples.digits prepare --root .demo --date 2026-11-21``
trains the model (saved as safetensors) and writes that date's input; ``report`` prints the
accuracy of the predictions in the date's output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

from airflow_provider_raybatch.examples import demo_args

TRAIN_ROWS = 1200
MODEL_CLASS = "airflow_provider_raybatch.examples.digits:DigitsMLP"


class DigitsMLP(nn.Module):
    """8x8 grey image (64 floats in [0, 1]) -> 10 class logits."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)


def train(weights_path: Path, epochs: int = 300, seed: int = 0) -> float:
    """Train on the first TRAIN_ROWS digits, save the weights, return the training accuracy."""
    torch.manual_seed(seed)
    x, y = _digits()
    x, y = torch.from_numpy(x[:TRAIN_ROWS]), torch.from_numpy(y[:TRAIN_ROWS])
    model = DigitsMLP()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(epochs):
        optimiser.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimiser.step()
    from safetensors.torch import save_file

    weights_path.parent.mkdir(parents=True, exist_ok=True)
    save_file(model.state_dict(), str(weights_path))
    return float((model(x).argmax(1) == y).float().mean())


def write_input(folder: Path, rows: int | None = None) -> int:
    """Write the held-out digits (never trained on) as Parquet: id, features[64], label."""
    x, y = _digits()
    x, y = x[TRAIN_ROWS:], y[TRAIN_ROWS:]
    if rows is not None:
        x, y = x[:rows], y[:rows]
    table = pa.table(
        {
            "id": pa.array(np.arange(len(y), dtype=np.int64)),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 64),
            "label": pa.array(y),
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "digits.parquet", row_group_size=100)
    return len(y)


def accuracy(output_path: str, prediction_column: str = "predicted_label") -> tuple[int, float]:
    table = pq.read_table(output_path, columns=["label", prediction_column])
    correct = np.asarray(table["label"]) == np.asarray(table[prediction_column])
    return table.num_rows, float(correct.mean()) if table.num_rows else 0.0


def prepare(root: Path, date: str) -> tuple[Path, Path]:
    """The demo's model and ``date``'s input under ``root``: their paths.

    What exists is kept: a finished date's input rewritten would be a changed input, which resume
    rightly refuses, so the demo runs again as the no-op it is.
    """
    weights, folder = root / "model" / "digits.safetensors", root / "input" / date
    if weights.exists():
        print(f"model: {weights} (kept)")
    else:
        print(f"model trained (train accuracy {train(weights):.3f}): {weights}")
    if (folder / "digits.parquet").exists():
        print(f"input for {date}: {folder} (kept)")
    else:
        print(f"input for {date}: {write_input(folder)} rows in {folder}")
    return weights, folder


def main(argv: list[str] | None = None) -> None:
    command, root, date = demo_args(__doc__, argv)
    if command == "prepare":
        prepare(root, date)
    else:
        output = root / "output" / date
        rows, acc = accuracy(str(output))
        print(f"output: {output}\nscored {rows} rows, accuracy {acc:.3f} against the true labels")


if __name__ == "__main__":
    main()
