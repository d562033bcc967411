"""A Ray Data datasource that reads planned ranges, those of one row group in one read task.

A read task yields each range's rows apart (tagged with the range), so the driver sees each
range's rows arrive and can commit it as soon as the last one does.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from functools import partial
from itertools import accumulate

from fsspec import AbstractFileSystem
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from airflow_provider_raybatch.pipeline.execution.range_reader import read_ranges
from airflow_provider_raybatch.pipeline.planning.planner import Plan


class RangeDatasource(Datasource):
    """The pending ranges of a plan, grouped into read tasks by :func:`group_ranges`.

    :param replicas: the most replicas a stage runs: there are at least that many read tasks
        where there are that many ranges, so that every replica gets work.
    """

    def __init__(
        self,
        fs: AbstractFileSystem,
        plan: Plan,
        pending: list[int],
        keep: list[str],
        derive_row_id: bool,
        replicas: int = 1,
    ):
        self.fs, self.plan = fs, plan
        self.keep, self.derive_row_id = keep, derive_row_id
        self.groups = group_ranges(plan, pending, replicas)

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context=None
    ) -> list[ReadTask]:
        tasks = []
        for group in self.groups:
            file = self.plan.files[self.plan.ranges[group[0]].file_index]
            ranges = [(index, self.plan.ranges[index]) for index in group]
            read = partial(read_ranges, self.fs, file, ranges, self.plan.schema.names, self.keep, self.derive_row_id)
            rows = sum(r.rows for _, r in ranges)
            tasks.append(ReadTask(read, BlockMetadata(rows, None, None, input_files=(file.path,))))
        return tasks


def group_ranges(plan: Plan, pending: list[int], replicas: int) -> list[list[int]]:
    """Pending ranges (indexes into ``plan.ranges``, in plan order) grouped for reading.

    A range joins the previous one's group when both are in one file and it starts in the row
    group where the previous one ends, so that the row group is decoded once: a range reads whole
    row groups and keeps its slice, and 1,000-row ranges in 100,000-row groups had each group
    decoded a hundred times (0.05 s a range). The planner cuts ranges at row group boundaries,
    so a group stays within one row group; it also stops at ``rows / replicas`` rows, so that
    every replica gets work.
    """
    total = sum(plan.ranges[i].rows for i in pending)
    cap = math.ceil(total / replicas)
    groups: list[list[int]] = []
    rows = 0
    previous_end: tuple[int, int] | None = None  # (file, row group) where the previous range ends
    starts: dict[int, list[int]] = {}  # per file: the first row of each row group
    for index in pending:
        r = plan.ranges[index]
        file = plan.files[r.file_index]
        if r.file_index not in starts:
            starts[r.file_index] = list(accumulate(file.row_groups, initial=0))
        first = bisect_right(starts[r.file_index], r.start) - 1
        last = bisect_right(starts[r.file_index], r.end - 1) - 1
        if groups and previous_end == (r.file_index, first) and rows + r.rows <= cap:
            groups[-1].append(index)
            rows += r.rows
        else:
            groups.append([index])
            rows = r.rows
        previous_end = (r.file_index, last)
    return groups
