"""An output's status and rejects, read from its bookkeeping: what the command line prints and a UI
would draw, from one typed model (:mod:`.output_status`, :mod:`.rejects`). Imports neither Ray nor
Airflow."""

from airflow_provider_raybatch.pipeline.status.output_status import (
    FileProgress,
    LeaseStatus,
    OutputNotFoundError,
    OutputStatus,
    PartitionStatus,
    TimelinePoint,
    read_status,
    read_table_status,
)
from airflow_provider_raybatch.pipeline.status.rejects import RejectsSample, read_rejects, sample_rejects

__all__ = [
    "FileProgress",
    "LeaseStatus",
    "OutputNotFoundError",
    "OutputStatus",
    "PartitionStatus",
    "RejectsSample",
    "TimelinePoint",
    "read_rejects",
    "read_status",
    "read_table_status",
    "sample_rejects",
]
