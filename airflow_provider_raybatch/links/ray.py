"""Operator extra link to a task's Ray job in the Ray dashboard."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: XCom key under which the operator stores its job's dashboard URL.
RAY_JOB_URL_KEY = "ray_job_url"


class RayJobLink(BaseOperatorLink):
    """ "Ray job": the job's page in the Ray dashboard (empty for the embedded local Ray)."""

    name = "Ray job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        return XCom.get_value(ti_key=ti_key, key=RAY_JOB_URL_KEY) or ""
