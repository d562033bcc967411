"""Fixtures of the local Ray's tests."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from airflow_provider_raybatch.pipeline.runtime.shared.head import stop_shared_heads
from airflow_provider_raybatch.pipeline.runtime.shared.head_processes import head_processes
from airflow_provider_raybatch.pipeline.runtime.shared.settings import LocalRaySettings, head_dir
from tests.support.shared_ray import REPO


@pytest.fixture
def shared():
    """A private place for this test's shared heads (short: Ray's socket paths are length-limited);
    whatever head is still up at the end is stopped."""
    base = tempfile.mkdtemp(prefix="rbl", dir="/tmp")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAYBATCH_LOCAL_RAY": "shared",
        "RAYBATCH_LOCAL_RAY_DIR": base,
        "RAYBATCH_LOCAL_RAY_IDLE_TIMEOUT_S": "5",
    }
    root = head_dir(LocalRaySettings(base_dir=base))
    yield env, root
    stop_shared_heads(base)
    assert head_processes(root) == []
    shutil.rmtree(base, ignore_errors=True)
