"""The quick start's predictor, timing its replica's start for ``benchmarks/cold_start.py``.

:class:`TimedTorchPredictor` is the provider's ``TorchPredictor`` unchanged but for the steps it
records (``benchmarks.support.timings``): in a Ray worker, the process's start up to this
module's import (the worker's own start, Ray Data and the stage worker's imports, which the
task's warm imports run first), torch's import (a warm import too), the model's load, and the
first batch. The driver imports this module to resolve the predictor: it records nothing there
and does not import torch.
"""

from __future__ import annotations

import sys
import time

_IMPORTED_AT = time.time()

import psutil  # noqa: E402 - after the clock: the import time is the worker's own

from airflow_provider_raybatch.predictors.torch import TorchPredictor  # noqa: E402
from benchmarks.support.timings import record  # noqa: E402

IN_RAY_WORKER = bool(sys.argv) and sys.argv[0].endswith("default_worker.py")

if IN_RAY_WORKER:
    record("worker start to its imports", psutil.Process().create_time(), ended=_IMPORTED_AT)
    _started = time.time()
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401

    record("import torch", _started)


class TimedTorchPredictor(TorchPredictor):
    def __init__(self, **kwargs):
        started = time.time()
        super().__init__(**kwargs)
        record("model load", started)
        self._first = True

    def __call__(self, batch):
        started = time.time()
        out = super().__call__(batch)
        if self._first:
            record("first batch", started, len(next(iter(batch.values()))))
            self._first = False
        return out
