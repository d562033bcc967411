"""Partitions of one output for parallel tasks (Airflow dynamic task mapping).

:func:`plan_partitions` prepares the output once (records the plan, applies
``mode="overwrite"``) and cuts its ranges into contiguous groups. Each group is then run by its
own task with ``BatchInferenceConfig(range_ids=partition_range_ids(group))``: such a run never writes the plan or
resets the output, and resumes, cleans up and commits only its own ranges, so partitions of
one output run side by side safely. Together they write the same files as one run over every
range: same range ids, same rows, each once.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.errors import ConfigError

log = logging.getLogger(__name__)


def plan_partitions(config: BatchInferenceConfig, partitions: int) -> list[dict[str, Any]]:
    """Prepare ``config``'s output and return up to ``partitions`` groups of its ranges.

    Everything is checked as for a run (settings, predictors, input, output) and nothing runs
    on Ray. Groups are contiguous runs of the plan's ranges, as equal in count as possible, and
    depend only on the input and settings: a rerun plans the same groups, so each mapped task
    instance finds its own committed ranges again. Each group is JSON-serialisable, for XCom::

        {"index": 0, "count": 4, "range_ids": ["3f2a...-0-200", ...], "rows": 400}

    :param config: the run's configuration, as each partition's task will use it (without
        ``range_ids``).
    :param partitions: the largest number of groups (fewer when there are fewer ranges).
    """
    from airflow_provider_raybatch.pipeline.runner import run_batch_inference

    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ConfigError(f"partitions must be an integer >= 1, got {partitions!r}")
    if config.range_ids is not None:
        raise ConfigError("plan_partitions plans a whole output: range_ids must be None")
    ranges = run_batch_inference(config, plan_only=True)["ranges"]
    count = min(partitions, len(ranges))
    groups = [ranges[i * len(ranges) // count : (i + 1) * len(ranges) // count] for i in range(count)]
    result = [
        {"index": i, "count": count, "range_ids": [r["id"] for r in group], "rows": sum(r["rows"] for r in group)}
        for i, group in enumerate(groups)
    ]
    log.info(
        "Planned %d range(s) of %s into %d partition(s) of %s rows",
        len(ranges),
        config.output_path,
        count,
        "/".join(str(p["rows"]) for p in result),
    )
    return result


def partition_range_ids(partition: dict[str, Any]) -> list[str]:
    """The range ids of one group returned by :func:`plan_partitions`."""
    range_ids = partition.get("range_ids") if isinstance(partition, dict) else None
    if not isinstance(range_ids, list) or not range_ids or not all(isinstance(r, str) for r in range_ids):
        raise ConfigError(
            f"partition must be one item returned by plan_partitions (a dict with 'range_ids'), got {partition!r}"
        )
    return range_ids
