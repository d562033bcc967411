"""Dynamic task mapping over partitions of one output.

A planning task (the operator with ``plan_partitions=N``) prepares the output and returns up
to N partitions; ``.partial(...).expand(partition=plan.output)`` runs one task instance per
partition, each with its own retries and its own row in the grid. See
:mod:`airflow_provider_raybatch.pipeline.partitions` for why this is safe to run side by side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_raybatch.pipeline.errors import ConfigError, InputError

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_raybatch.operators.ray_pipeline import RayPipelineOperator

#: Summary fields that add up over partitions.
_COUNTS = ("rows_in", "rows_out", "rows_processed", "ranges_total", "ranges_done", "ranges_skipped")


def run_plan_partitions(operator: RayPipelineOperator, context: Context) -> list[dict[str, Any]]:
    """The planning task's work: check everything, prepare the output, return the partitions."""
    from airflow_provider_raybatch.pipeline.partitions import plan_partitions

    try:
        partitions = plan_partitions(operator.build_config(context), operator.plan_partitions)
    except (ConfigError, InputError) as e:
        raise AirflowFailException(str(e)) from e
    operator.log.info("Partitions: %s", [(p["index"], len(p["range_ids"]), p["rows"]) for p in partitions])
    return partitions


def combine_summaries(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary for a mapped run from its partitions' summaries (e.g. for an asset event)."""
    summaries = list(summaries)
    combined: dict[str, Any] = {key: sum(s.get(key, 0) for s in summaries) for key in _COUNTS}
    combined["partitions"] = len(summaries)
    combined["output_path"] = summaries[0]["output_path"] if summaries else None
    # Partitions run side by side: the slowest one is the run's duration on the Ray side.
    combined["seconds"] = max((s.get("seconds", 0.0) for s in summaries), default=0.0)
    return combined
