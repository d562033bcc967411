"""How the pipeline connects to Ray (``pipeline/runtime/local_ray.py``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.shared_ray import REPO

#: In a fresh interpreter: which of the modules Ray's log thread imports were imported when ray.init was called.
SPY = """
import json, sys
import ray

def init(*args, **kwargs):
    print("SEEN " + json.dumps("ray.autoscaler.v2.utils" in sys.modules), flush=True)
    raise KeyboardInterrupt  # no Ray started: the order is what is checked

ray.init = init
from airflow_provider_raybatch.pipeline.runtime.local_ray import ray_session
try:
    with ray_session(address=sys.argv[1] or None):
        pass
except KeyboardInterrupt:
    pass
"""


@pytest.mark.parametrize("address", ["", "127.0.0.1:1"], ids=["embedded", "cluster"])
def test_what_rays_log_thread_imports_is_imported_before_ray_init_starts_it(address):
    """Ray's log thread imports ``ray.autoscaler.v2.utils`` at its first autoscaler event, while the driver's
    first DataContext imports the same cycle of modules: two threads at once failed the import (Ray 2.55.1)."""
    env = {"PYTHONPATH": str(REPO), "RAYBATCH_LOCAL_RAY": "per-task", "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-c", SPY, address], env=env, capture_output=True, text=True, timeout=120)
    assert "SEEN true" in run.stdout, run.stdout + run.stderr
