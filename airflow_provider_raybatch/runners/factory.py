"""Which runner a task gets: the one place that knows the concrete runners."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.runners.embedded import EmbeddedRunner
from airflow_provider_raybatch.runners.ray_job import RayJobRunner, submission_id_prefix
from airflow_provider_raybatch.version_compat import AIRFLOW_VERSION, note_once

if TYPE_CHECKING:
    from airflow_provider_raybatch.hooks.ray import RayHook
    from airflow_provider_raybatch.runners.base import PipelineRunner

#: task_state_store key: the attempt number of the task's current Ray job (kept across tries).
JOB_ATTEMPT_KEY = "ray_job_attempt"


def runner_for(hook: RayHook, ti: Any, store: Any | None) -> PipelineRunner:
    """In the task on an embedded Ray (the connection names no cluster), or as a Ray Job on the cluster.

    :param hook: the task's ``ray`` connection.
    :param ti: the task instance, whose ids name its Ray jobs.
    :param store: the task's state store (Airflow 3.3+), where the job's attempt is kept across
        tries; None before 3.3.
    """
    cluster = hook.cluster
    if cluster is None:
        return EmbeddedRunner()
    if store is None:
        note_once(
            "task_state_store",
            "Airflow %s has no task state store (3.3+): each try finds its Ray job by walking the job's "
            "submission ids from attempt 0",
            AIRFLOW_VERSION,
        )
    return RayJobRunner(
        hook,
        cluster,
        submission_id_prefix(ti.dag_id, ti.run_id, ti.task_id, ti.map_index),
        metadata={
            "airflow_dag_id": ti.dag_id,
            "airflow_run_id": ti.run_id,
            "airflow_task_id": ti.task_id,
            "airflow_map_index": str(ti.map_index),
        },
        # The attempt reached survives retries: the next try walks on from it.
        start_attempt=int((store.get(JOB_ATTEMPT_KEY) if store is not None else None) or 0),
        on_submit=None if store is None else lambda attempt: store.set(JOB_ATTEMPT_KEY, attempt),
    )
