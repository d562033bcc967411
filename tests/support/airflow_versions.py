"""Airflow's own internals the tests use, wherever the Airflow under test keeps them (3.1: older homes).

The provider's own differences are in airflow_provider_raybatch/version_compat.py; these are only
the tests' (loading DAGs into a bag, the Params' validation error)."""

from __future__ import annotations

try:
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.sdk.exceptions import ParamValidationError
except ImportError:  # Airflow 3.1
    from airflow.exceptions import ParamValidationError  # type: ignore[no-redef]
    from airflow.models.dagbag import DagBag, sync_bag_to_db  # type: ignore[no-redef]

__all__ = ["DagBag", "ParamValidationError", "sync_bag_to_db"]
