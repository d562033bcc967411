"""Shards of one output for parallel tasks (Airflow dynamic task mapping).

:func:`plan_shards` prepares the output once (records the plan, applies
``mode="overwrite"``) and cuts its ranges into contiguous groups. Each group is then run by its
own task with ``BatchInferenceConfig(range_ids=shard.range_ids)``: such a run never writes
the plan or resets the output, and resumes, cleans up and commits only its own ranges, so
shards of one output run side by side safely. Together they write the same files as one run
over every range: same range ids, same rows, each once. With a table output, the shards carry
the planning task's writer and the generation it chose (:mod:`.tables.staging`), which they write
together.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.planning.planner import contiguous_groups
from airflow_provider_raybatch.pipeline.prepare import prepare

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shard:
    """One group of an output's ranges; JSON as a dict, for XCom and ``.expand(shard=...)``.

    :param index: its position among the shards.
    :param count: how many shards there are.
    :param range_ids: its ranges, in plan order.
    :param rows: rows in its ranges.
    :param writer: a table output's writer (:attr:`.TableOutput.writer`), the planning task's:
        every shard's task stages its rows in that writer's folder.
    :param generation: a table output's generation that the planning task chose.
    """

    index: int
    count: int
    range_ids: list[str]
    rows: int
    writer: str | None = None
    generation: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Shard:
        """A shard from its dict (a mapped task's ``shard`` argument), checked."""
        range_ids = data.get("range_ids") if isinstance(data, dict) else None
        if not isinstance(range_ids, list) or not range_ids or not all(isinstance(r, str) for r in range_ids):
            raise ConfigError(f"shard must be one item returned by plan_shards (a dict with 'range_ids'), got {data!r}")
        return cls(
            index=int(data.get("index", 0)),
            count=int(data.get("count", 1)),
            range_ids=range_ids,
            rows=int(data.get("rows", 0)),
            writer=data.get("writer"),
            generation=data.get("generation"),
        )


def check_shards(config: BatchInferenceConfig, shards: int) -> None:
    """Raise :class:`ConfigError` unless ``shards`` and ``config`` can be planned (before
    anything is read, or a planning job submitted)."""
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ConfigError(f"shards must be an integer >= 1, got {shards!r}")
    if config.range_ids is not None:
        raise ConfigError("plan_shards plans a whole output: range_ids must be None")


def plan_shards(config: BatchInferenceConfig, shards: int, *, ray_job: str | None = None) -> list[Shard]:
    """Prepare ``config``'s output and return up to ``shards`` groups of its ranges.

    Everything is checked as for a run (settings, predictors, input, output) and no model runs.
    The input's footers are read where this runs: by threads of this process, or, in a Ray
    Job's driver with many input files, by Ray tasks (:func:`.footers.read_footers`). Groups
    are contiguous runs of the plan's ranges, as equal in count as possible, and depend only on
    the input and settings: a rerun plans the same groups, so each mapped task instance finds
    its own committed ranges again.

    :param config: the run's configuration, as each shard's task will use it (without
        ``range_ids``).
    :param shards: the largest number of groups (fewer when there are fewer ranges).
    :param ray_job: the submission id of the Ray Job planning (named in the output's lease).
    """
    check_shards(config, shards)
    run = prepare(config, ray_job=ray_job)
    ranges = run.plan.ranges
    groups = contiguous_groups(ranges, shards)
    count = len(groups)
    try:
        # Status (the command line, the UI) reads each shard's planned ranges from this count.
        run.ledger.write_shards(count)
    finally:
        run.release()  # planning holds the output's lease only while it records the plan or resets
    writer = None if config.table is None else config.table.writer
    generation = None if run.generation is None else run.generation.number
    result = [
        Shard(i, count, [r.id for r in group], sum(r.rows for r in group), writer, generation)
        for i, group in enumerate(groups)
    ]
    log.info(
        "Planned %d range(s) of %s into %d shard(s) of %s rows",
        len(ranges),
        config.output_path,
        count,
        "/".join(str(p.rows) for p in result),
    )
    return result
