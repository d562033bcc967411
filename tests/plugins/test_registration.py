"""The plugin as Airflow finds it: listed by ``airflow plugins`` through the provider (its
``get_provider_info()`` ``plugins`` entry) and through the ``airflow.plugins`` entry point, with its
FastAPI app and its external views on the task instance, DAG run and DAG pages; and light where
Airflow serves (no Ray, torch or pyarrow imported to load it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest

from airflow_provider_raybatch.get_provider_info import get_provider_info
from tests.support.pipeline_runs import REPO
from tests.support.ui_outputs import entry_point_installed

PLUGIN_CLASS = "airflow_provider_raybatch.plugins.plugin.RayBatchPlugin"


def airflow_plugins(env: dict[str, str]) -> list[dict]:
    result = subprocess.run(
        [sys.executable, "-m", "airflow", "plugins", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout[result.stdout.index("[") :])


def check_listed(plugins: list[dict]) -> dict:
    [plugin] = [p for p in plugins if p["name"] == "raybatch"]
    destinations = {v["destination"]: v["href"] for v in plugin["external_views"]}
    assert destinations == {
        "task_instance": "/raybatch/ti/{DAG_ID}/{RUN_ID}/{TASK_ID}?map_index={MAP_INDEX}",
        "dag_run": "/raybatch/run/{DAG_ID}/{RUN_ID}",
        "dag": "/raybatch/dag/{DAG_ID}",
    }
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/raybatch"]
    return plugin


def test_the_provider_declares_the_plugin_both_ways():
    assert get_provider_info()["plugins"] == [{"name": "raybatch", "plugin-class": PLUGIN_CLASS}]
    entry_points = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    assert entry_points["airflow.plugins"] == {"raybatch": PLUGIN_CLASS.rsplit(".", 1)[0] + ":RayBatchPlugin"}


def test_airflow_lists_the_plugin_from_the_provider_info():
    """Airflow 3.3 loads providers' ``plugins`` when it discovers providers eagerly."""
    plugins = airflow_plugins({"AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False"})
    check_listed(plugins)


@pytest.mark.skipif(
    not entry_point_installed() and os.environ.get("CI") != "true",
    reason="the installed metadata has no airflow.plugins entry point yet: pip install -e . again",
)
def test_airflow_lists_the_plugin_with_its_default_configuration():
    """The ``airflow.plugins`` entry point: listed without any configuration."""
    check_listed(airflow_plugins({}))


def test_loading_the_plugin_imports_no_ray_torch_or_pyarrow():
    code = (
        "import sys; import airflow_provider_raybatch.plugins.plugin as p; "
        "print([m for m in ('ray', 'torch', 'pyarrow', 'numpy') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
