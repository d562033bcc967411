"""Operator extra link to a task's Ray job in the Ray dashboard."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: XCom key under which the operator stores its job's dashboard URL.
RAY_JOB_URL_KEY = "ray_job_url"
#: An operator that does not say whether its try ran a job (not a RayPipelineOperator's).
_UNKNOWN = object()


class RayJobLink(BaseOperatorLink):
    """ "Ray job": the job's page in the Ray dashboard (empty for the embedded local Ray)."""

    name = "Ray job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        """The job's URL that the operator pushed to XCom; empty when the try ran no Ray job.

        :param operator: the task's operator: at the end of a try, the one that ran it.
        :param ti_key: the task instance.
        """
        # The task runner asks at the end of every try, with the operator that ran it. A try
        # without a Ray job (the embedded local Ray, a failure before submitting) pushed no URL,
        # and asking Airflow for a missing XCom logs an error in the task log: not asked then.
        if getattr(operator, "submission_id", _UNKNOWN) is None:
            return ""
        from airflow.sdk.execution_time.xcom import XCom

        return XCom.get_value(ti_key=ti_key, key=RAY_JOB_URL_KEY) or ""
