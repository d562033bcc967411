"""The built-in TorchPredictor: real weights in, real outputs out; without the `torch` extra, an
error that says what to install."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from airflow_provider_raybatch.predictors.torch import TorchPredictor
from tests.conftest import REPO

INSTALL_HINT = "pip install 'airflow-provider-raybatch[torch]'"


def test_loads_safetensors_weights_and_predicts(tmp_path):
    import torch
    from safetensors.torch import save_file

    weight = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, -1.0]])
    bias = torch.tensor([0.5, 0.0])
    save_file({"weight": weight, "bias": bias}, str(tmp_path / "linear.safetensors"))
    batch = {"x": np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=np.int64)}
    common = {
        "model_class": "torch.nn:Linear",
        "weights_path": str(tmp_path / "linear.safetensors"),
        "model_kwargs": {"in_features": 3, "out_features": 2},
        "input_column": "x",
        "output_column": "y",
        "device": "cpu",
    }
    outputs = TorchPredictor(**common)(batch)["y"]
    np.testing.assert_allclose(outputs, [[1.5, 0.0], [0.5, 2.0], [0.5, -1.0]])
    assert TorchPredictor(**common, argmax=True)(batch)["y"].tolist() == [0, 1, 0]


# Makes the named top-level packages look uninstalled, as on a worker without the extra.
WITHOUT = """
import sys

class Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in sys.argv[1:]:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Uninstalled())
from airflow_provider_raybatch.predictors.torch import TorchPredictor  # importing it needs neither

try:
    TorchPredictor("torch.nn:Linear", "/nowhere/model.safetensors")
except ImportError as error:
    print(f"{type(error).__name__} name={error.name}: {error}")
"""


@pytest.mark.parametrize("missing", ["torch", "safetensors"])
def test_without_the_torch_extra_the_error_names_it(missing):
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT, missing], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"ImportError name={missing}"), line
    assert INSTALL_HINT in line and f"No module named '{missing}" in line
