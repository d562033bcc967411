"""Small statistics: a rounded ratio, a median, and a timed call."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def median(values: Iterable[float]) -> float:
    return float(np.median(list(values)))


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started
