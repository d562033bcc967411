"""An output's status and rejects, read from its bookkeeping: what the command line prints and a UI
would draw, from one typed model (:mod:`.output_status`, :mod:`.writers`, :mod:`.timeline`,
:mod:`.rejects`), and the verifier's faults; :mod:`.reading` reads any output an
:class:`~airflow_provider_raybatch.pipeline.output_ref.OutputRef` names. Imports neither Ray nor Airflow."""

from airflow_provider_raybatch.pipeline.errors import OutputNotFoundError
from airflow_provider_raybatch.pipeline.status.output_status import (
    FileProgress,
    OutputStatus,
    read_status,
    read_table_status,
)
from airflow_provider_raybatch.pipeline.status.reading import read_output, read_output_rejects, verify
from airflow_provider_raybatch.pipeline.status.rejects import RejectsSample, read_rejects, sample_rejects
from airflow_provider_raybatch.pipeline.status.timeline import TimelinePoint
from airflow_provider_raybatch.pipeline.status.writers import LeaseStatus, ShardStatus

__all__ = [
    "FileProgress",
    "LeaseStatus",
    "OutputNotFoundError",
    "OutputStatus",
    "ShardStatus",
    "RejectsSample",
    "TimelinePoint",
    "read_output",
    "read_output_rejects",
    "read_rejects",
    "read_status",
    "read_table_status",
    "sample_rejects",
    "verify",
]
