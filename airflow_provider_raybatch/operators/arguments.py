"""The operator's arguments that are the config's: which, and what the operator adds to their description.

Each is described once, on the config's field (:mod:`~airflow_provider_raybatch.pipeline.described`);
:class:`~airflow_provider_raybatch.operators.ray_pipeline.RayPipelineOperator`'s ``:param:`` lines
for them are composed from it (:func:`shared_param_docs`), and its signature takes their defaults
from the config (``tests/operators/test_arguments.py`` checks names, defaults and types).
"""

from __future__ import annotations

from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, TableOutput
from airflow_provider_raybatch.pipeline.described import param_docs

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
