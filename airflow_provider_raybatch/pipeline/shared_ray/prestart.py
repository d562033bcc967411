"""The job's workers, started while the task plans its dataset.

On a warm shared head a task connects in a fraction of a second, but its job has no worker yet:
workers are bound to a job and to its runtime_env, and Ray starts them on demand, when the first
read tasks are scheduled, each a fresh Python that then imports pyarrow and Ray Data. A Ray
started for the task does this while ``ray.init`` waits (its raylet prestarts one worker per CPU
for the first driver). Ray 2.60 has no public call to prestart a job's workers, so the task
submits one small task per CPU right after connecting, without waiting for them: each starts a
worker with the job's runtime_env and imports what the pipeline's read and write tasks import,
and Ray then reuses those idle workers for the job's tasks and actors.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def _warm_worker() -> None:
    # Modules every read and write task imports: imported once here, while the driver plans.
    import pyarrow.parquet  # noqa: F401
    import ray.data  # noqa: F401


def prestart_job_workers(max_workers: int | None = None) -> list[Any]:
    """Submit one warm-up task per CPU of the cluster (at most ``max_workers``) and return their refs
    (unwaited: the caller keeps them so they are not collected before they run)."""
    import ray

    cpus = int(ray.cluster_resources().get("CPU", 1))
    count = max(1, cpus if max_workers is None else min(cpus, max_workers))
    warm = ray.remote(num_cpus=1, max_retries=0)(_warm_worker)
    log.info("Prestarting %d worker(s) for this task's job", count)
    return [warm.remote() for _ in range(count)]
