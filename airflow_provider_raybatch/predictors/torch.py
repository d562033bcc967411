"""A predictor that loads safetensors weights into a torch model class.

torch and safetensors are the provider's ``torch`` extra, needed only where the pipeline runs
(the Ray workers), so they are imported when a predictor is built.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from airflow_provider_raybatch.pipeline.execution.predictors import import_object
from airflow_provider_raybatch.pipeline.store.files import resolve


class TorchPredictor:
    """Run a ``torch.nn.Module`` over one tensor column.

    :param model_class: import path of the module class, e.g. ``"my_pkg.models:Net"``.
    :param weights_path: a ``.safetensors`` file (local or any fsspec URL) holding its state dict.
    :param model_kwargs: constructor kwargs of the model class.
    :param input_column: the column fed to the model (a fixed-size list / tensor column).
    :param output_column: the column the outputs are written to.
    :param argmax: write the index of the largest output (a class label) instead of the outputs.
    :param device: ``"cpu"``, ``"cuda"``...; default: CUDA when available.
    :param dtype: numpy dtype the input is converted to.
    :param num_threads: torch intra-op threads on CPU (default: torch's choice).
    :param storage_options: fsspec options to read ``weights_path``.
    """

    #: Imported ahead by the shared local Ray's warm workers (see ``pipeline.runtime.shared.client``).
    warm_imports = ("torch", "safetensors.torch")

    def __init__(
        self,
        model_class: str,
        weights_path: str,
        *,
        model_kwargs: dict[str, Any] | None = None,
        input_column: str = "features",
        output_column: str = "output",
        argmax: bool = False,
        device: str | None = None,
        dtype: str = "float32",
        num_threads: int | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        try:
            import torch
            from safetensors.torch import load
        except ImportError as e:
            raise ImportError(
                f"TorchPredictor needs torch and safetensors ({e}): "
                "pip install 'airflow-provider-raybatch[torch]' where the pipeline runs",
                name=e.name,
            ) from e

        if num_threads:
            torch.set_num_threads(num_threads)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        fs, path = resolve(weights_path, storage_options)
        with fs.open(path, "rb") as f:
            state = load(f.read())
        self.model = import_object(model_class)(**(model_kwargs or {}))
        self.model.load_state_dict(state)
        self.model.to(self.device).eval()
        self.input_column, self.output_column = input_column, output_column
        self.argmax, self.dtype = argmax, np.dtype(dtype)
        # Arrow buffers are read-only; the model only reads its input, so a view is safe.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        x = torch.from_numpy(np.asarray(batch[self.input_column], dtype=self.dtype)).to(self.device)
        with torch.inference_mode():
            y = self.model(x)
            if self.argmax:
                y = y.argmax(dim=-1)
        return {self.output_column: y.cpu().numpy()}
