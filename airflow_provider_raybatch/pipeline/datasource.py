"""A Ray Data datasource that reads one planned range per read task.

One task per range keeps ranges apart in the stream: the driver sees each range's rows arrive
and can commit it as soon as the last one does.
"""

from __future__ import annotations

from functools import partial

from fsspec import AbstractFileSystem
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from airflow_provider_raybatch.pipeline.planner import Plan
from airflow_provider_raybatch.pipeline.stages import read_range


class RangeDatasource(Datasource):
    def __init__(self, fs: AbstractFileSystem, plan: Plan, pending: list[int], keep: list[str], derive_row_id: bool):
        self.fs, self.plan, self.pending = fs, plan, pending
        self.keep, self.derive_row_id = keep, derive_row_id

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context=None
    ) -> list[ReadTask]:
        tasks = []
        for index in self.pending:
            row_range = self.plan.ranges[index]
            file = self.plan.files[row_range.file_index]
            read = partial(
                read_range, self.fs, file, row_range, index, self.plan.schema.names, self.keep, self.derive_row_id
            )
            tasks.append(ReadTask(read, BlockMetadata(row_range.rows, None, None, input_files=(file.path,))))
        return tasks
