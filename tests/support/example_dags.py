"""The example DAGs of ``dags/``, loaded as a DAG processor loads them."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO


def load_dag(name: str):
    """The DAG defined in dags/<name>.py, freshly imported."""
    from airflow.sdk import DAG

    spec = importlib.util.spec_from_file_location(name, REPO / "dags" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (dag,) = {id(v): v for v in vars(module).values() if isinstance(v, DAG)}.values()
    return dag
