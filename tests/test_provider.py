"""Packaging: provider discovery, and no heavy import on the DAG-parsing path."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

from airflow_provider_raybatch import __version__
from airflow_provider_raybatch.get_provider_info import RAY_CONN_FIELDS, get_provider_info
from airflow_provider_raybatch.version_compat import AIRFLOW_V_3_2_PLUS
from tests.conftest import REPO


def test_entry_point_returns_the_provider_info():
    (entry,) = [
        e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("airflow_provider_raybatch")
    ]
    info = entry.load()()
    assert info == get_provider_info()
    assert info["package-name"] == "airflow-provider-raybatch" and info["versions"] == [__version__]
    assert info["connection-types"][0]["connection-type"] == "ray"
    assert info["connection-types"][0]["hook-class-name"] == "airflow_provider_raybatch.hooks.ray.RayHook"


def test_airflow_lists_the_provider_and_its_hook():
    providers = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "list"], capture_output=True, text=True, check=True
    )
    assert "airflow-provider-raybatch" in providers.stdout
    hooks = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "hooks"], capture_output=True, text=True, check=True
    )
    assert "airflow_provider_raybatch.hooks.ray.RayHook" in hooks.stdout


def test_importing_the_provider_operators_and_dags_imports_no_heavy_library():
    code = f"""
import importlib.util, sys
import airflow_provider_raybatch, airflow_provider_raybatch.hooks.ray, airflow_provider_raybatch.operators.batch_inference
import airflow_provider_raybatch.pipeline, airflow_provider_raybatch.triggers.ray_job, airflow_provider_raybatch.links.ray
import airflow_provider_raybatch.operators.llm_batch_inference, airflow_provider_raybatch.operators.vlm_caption
import airflow_provider_raybatch.operators.embedding
import airflow_provider_raybatch.llm.config, airflow_provider_raybatch.llm.prompts
for path in {sorted(str(p) for p in (REPO / "dags").glob("*.py"))!r}:
    spec = importlib.util.spec_from_file_location("dag_module", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(sorted(m for m in ("ray", "torch", "transformers", "vllm", "PIL", "aiohttp") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_ray_connection_form_declares_its_fields_and_secrets():
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    widgets = manager.connection_form_widgets
    fields = {name.removeprefix("extra__ray__"): w for name, w in widgets.items() if name.startswith("extra__ray__")}
    relabeling = {"host": "Ray dashboard address", "password": "Ray auth token"}
    if not AIRFLOW_V_3_2_PLUS:
        # Airflow 3.1 reads the form from the hook (no conn-fields), where the FAB provider's wtforms
        # is installed: the extras stay one JSON field.
        from airflow_provider_raybatch.hooks.ray import RayHook

        behaviour = RayHook.get_ui_field_behaviour()
        assert fields == {} and "extra" not in behaviour["hidden-fields"] and behaviour["relabeling"] == relabeling
        return
    behaviour = manager.field_behaviours["ray"]
    assert behaviour["relabeling"] == relabeling
    assert set(fields) == set(RAY_CONN_FIELDS)
    assert {name for name, w in fields.items() if w.is_sensitive} == {"headers", "cookies"}
    assert "extra" in behaviour["hidden_fields"]


def test_the_code_that_runs_on_a_ray_cluster_imports_no_airflow():
    """A cluster image needs Ray and the models, not the scheduler."""
    code = """
import importlib, pkgutil, sys
import airflow_provider_raybatch.llm, airflow_provider_raybatch.pipeline, airflow_provider_raybatch.predictors
for package in (airflow_provider_raybatch.llm, airflow_provider_raybatch.pipeline, airflow_provider_raybatch.predictors):
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
print(sorted(m for m in sys.modules if m == "airflow" or m.startswith("airflow.")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip().splitlines()[-1] == "[]"
