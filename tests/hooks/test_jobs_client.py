"""The Jobs API client on its own: one session per use, per-request timeouts, no import of the hook."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import airflow_provider_raybatch.hooks.jobs_client as jobs_client
import airflow_provider_raybatch.hooks.jobs_types as jobs_types
from airflow_provider_raybatch.hooks.jobs_client import RayJobsClient, run_sync
from airflow_provider_raybatch.hooks.jobs_types import RayJobsError
from airflow_provider_raybatch.hooks.ray_connection import RayClusterSettings


def test_a_server_that_never_answers_times_out():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # accepts connections (backlog) and never answers
        address = f"http://127.0.0.1:{listener.getsockname()[1]}"
        client = RayJobsClient(RayClusterSettings(address, timeout_s=1, outage_timeout_s=0))

        async def version() -> str:
            async with client:
                return await client.version()

        with pytest.raises(RayJobsError, match="no answer from the Ray Jobs API .* within 1s"):
            run_sync(version())


def test_requests_need_the_session_opened_by_async_with():
    with pytest.raises(RuntimeError, match="outside `async with`"):
        run_sync(RayJobsClient(RayClusterSettings("http://127.0.0.1:1")).version())


@pytest.mark.parametrize("module", [jobs_client, jobs_types])
def test_the_client_side_never_imports_the_hook(module):
    """The hook uses the client, never the other way round (no import cycle)."""
    imported = set()
    for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert "airflow_provider_raybatch.hooks.ray" not in imported
    assert not any(name == "airflow" or name.startswith("airflow.") for name in imported)


def test_the_client_imports_alone_and_the_types_load_no_aiohttp():
    code = """
import sys
from pathlib import Path
import airflow_provider_raybatch.hooks.jobs_types
print('aiohttp' in sys.modules)
import airflow_provider_raybatch.hooks.jobs_client
print('aiohttp' in sys.modules, 'airflow_provider_raybatch.hooks.ray' in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["False", "True False"]
