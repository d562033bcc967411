"""The operators' arguments that are the config's: which, and what the operators add to their description.

Each is described once, on the config's field (:mod:`~airflow_provider_raybatch.pipeline.described`):
:class:`~airflow_provider_raybatch.operators.ray_pipeline.RayPipelineOperator`'s arguments on
:class:`~airflow_provider_raybatch.pipeline.config.BatchInferenceConfig` (:func:`shared_param_docs`),
the replicas' resources of the operators that run replicas on
:class:`~airflow_provider_raybatch.pipeline.resources.ReplicaResources` (:func:`resource_param_docs`).
Their ``:param:`` lines are composed from it, and their signatures take the defaults from there where
they are the same (``tests/operators/test_arguments.py`` checks names, defaults and types).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, TableOutput
from airflow_provider_raybatch.pipeline.described import param_docs
from airflow_provider_raybatch.pipeline.resources import ReplicaResources

#: What the operator adds to the shared arguments' descriptions: how it renders them.
RENDERING = {
    "input_path": "Templated.",
    "output_path": "Templated.",
    "columns": 'Templated: a rendered ``"None"`` or ``""`` is None; a list renders as text unless the DAG sets '
    "``render_template_as_native_obj=True``, and text is refused.",
    "keep_columns": "Templated, as ``columns``.",
    "mode": "Templated.",
    "max_rows": 'Templated: a rendered ``"100"`` is 100, ``"None"`` or ``""`` is None. A smoke run emits no event '
    "on ``asset``.",
    "max_error_fraction": 'Templated: a rendered ``"0.05"`` is 0.05; None, ``"None"`` and ``""`` are refused, as '
    "None would be ambiguous between the default and no limit.",
    "progress_timeout": 'Also a ``timedelta``. Templated: a rendered ``"90"`` is 90, ``"None"`` or ``""`` is '
    "None. ``execution_timeout`` bounds the whole try however much it commits, so it must allow for the "
    "whole run; this catches a stall after the same time whatever the run's size, and says where.",
}
#: The config's fields that are the operator's arguments of the same name.
SHARED_ARGUMENTS = (
    "input_path",
    "output_path",
    "columns",
    "keep_columns",
    "id_column",
    "rows_per_range",
    "mode",
    "max_rows",
    "max_error_fraction",
    "lease_timeout",
    "progress_timeout",
)
#: The table output's fields that are the operator's ``table_<name>`` arguments.
SHARED_TABLE_ARGUMENTS = ("commit_interval", "add_columns")


def shared_param_docs() -> str:
    """The operator's ``:param:`` lines for the arguments it shares with the config."""
    return param_docs(BatchInferenceConfig, SHARED_ARGUMENTS, notes=RENDERING).rstrip() + param_docs(
        TableOutput, SHARED_TABLE_ARGUMENTS, prefix="table_"
    )


#: The replicas' resources as the operators' arguments, by field name: ``resources`` is ``ray_resources``,
#: as Airflow's BaseOperator has a ``resources`` of its own.
RESOURCE_ARGUMENTS = {f.name: f.name for f in fields(ReplicaResources)} | {"resources": "ray_resources"}
#: What every operator adds to a resource argument's description, by field name.
RESOURCE_NOTES = {"resources": "Ray Data's ``resources`` of ``map_batches``, not Airflow's ``resources`` argument."}


def resource_param_docs(operator: type, notes: Mapping[str, str]) -> str:
    """``operator``'s ``:param:`` lines for the replicas' resources it takes (its ``resource_arguments``).

    :param operator: its class; a resource argument among its ``template_fields`` is said to be templated.
    :param notes: what the operator adds to a field's description (whose replicas, its own default), by field name.
    """
    names = operator.resource_arguments
    added = {
        name: " ".join(
            part
            for part in (
                notes.get(name, ""),
                RESOURCE_NOTES.get(name, ""),
                "Templated." if RESOURCE_ARGUMENTS[name] in operator.template_fields else "",
            )
            if part
        )
        for name in names
    }
    return param_docs(ReplicaResources, names, renamed=RESOURCE_ARGUMENTS, notes=added)


def resource_values(operator: Any) -> dict[str, Any]:
    """``operator``'s resource arguments (those its ``resource_arguments`` name), by ReplicaResources' field name."""
    return {name: getattr(operator, RESOURCE_ARGUMENTS[name]) for name in operator.resource_arguments}
