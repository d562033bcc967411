"""Entry point of a Ray Job: ``python -m airflow_provider_raybatch.pipeline.job '<spec JSON>'``.

The spec is :meth:`BatchInferenceConfig.to_spec` plus the submission id and namespace, and, for
the planning task of a mapped run, ``plan_shards``; it holds no credentials: storage access
comes from the cluster's environment or the job's runtime_env. The job's result (a run's
summary, or the planned shards) is written to ``<output>/_raybatch/jobs/<submission id>.json``
for the task to read. Exit status :data:`NOT_RETRYABLE_EXIT` means a :class:`NotRetryableError`
(bad settings or input, or too many engine errors): retrying cannot help.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.errors import ERROR_PREFIX, NOT_RETRYABLE_EXIT, NotRetryableError
from airflow_provider_raybatch.pipeline.store.files import read_json, write_json

if TYPE_CHECKING:
    from airflow_provider_raybatch.pipeline.shards import Shard
    from airflow_provider_raybatch.pipeline.summary import RunSummary


def entrypoint(
    config_spec: dict[str, Any], submission_id: str, namespace: str | None, *, plan_shards: int | None = None
) -> str:
    """The job's command line, for :meth:`BatchInferenceConfig.to_spec` output.

    :param plan_shards: plan the output into at most this many shards (the planning task
        of a mapped run) instead of running it.
    """
    spec: dict[str, Any] = {"submission_id": submission_id, "namespace": namespace, "config": config_spec}
    if plan_shards is not None:
        # The key the driver reads keeps its old name: a driver of another version on the cluster
        # that missed it would run the whole output instead of planning it.
        spec["plan_partitions"] = plan_shards
    return f"python -m airflow_provider_raybatch.pipeline.job {shlex.quote(json.dumps(spec, sort_keys=True))}"


def write_job_result(config: BatchInferenceConfig, submission_id: str, result: dict[str, Any]) -> None:
    """Leave a Ray Job's result in its output, where the task that submitted it reads it."""
    ledger = OutputLedger.open(config.output_path, config.storage_options)
    write_json(ledger.fs, ledger.job_summary_path(submission_id), result)


def read_job_result(output_path: str, storage_options: dict[str, Any], submission_id: str) -> dict[str, Any] | None:
    """The result a Ray Job left in ``output_path`` (None if it left none)."""
    ledger = OutputLedger.open(output_path, storage_options)
    path = ledger.job_summary_path(submission_id)
    ledger.fs.invalidate_cache()
    if not ledger.fs.exists(path):
        return None
    return read_json(ledger.fs, path)


def read_job_summary(output_path: str, storage_options: dict[str, Any], submission_id: str) -> RunSummary | None:
    """The run summary a Ray Job left (None if it left none), with its submission id."""
    from airflow_provider_raybatch.pipeline.summary import RunSummary

    result = read_job_result(output_path, storage_options, submission_id)
    return None if result is None else RunSummary.from_dict({**result, "ray_submission_id": submission_id})


def read_job_shards(output_path: str, storage_options: dict[str, Any], submission_id: str) -> list[Shard] | None:
    """The shards a planning Ray Job left (None if it left none)."""
    from airflow_provider_raybatch.pipeline.shards import Shard

    result = read_job_result(output_path, storage_options, submission_id)
    if result is None or not isinstance(result.get("partitions"), list):
        return None
    return [Shard.from_dict(p) for p in result["partitions"]]


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    spec: dict[str, Any] = json.loads(argv[0])
    from airflow_provider_raybatch.pipeline.runner import run_batch_inference
    from airflow_provider_raybatch.pipeline.runtime.local_ray import ray_session
    from airflow_provider_raybatch.pipeline.shards import plan_shards

    submission_id, namespace, shards = spec["submission_id"], spec.get("namespace"), spec.get("plan_partitions")
    try:
        # Validated by the task before it submitted the job, and again by the run's own checks (prepare).
        config = BatchInferenceConfig.from_spec(spec["config"])
        # This driver runs on the cluster: joining its Ray costs little, and lets the plan (of a
        # run, or of the shards) read many input footers with Ray tasks across the cluster.
        with ray_session("auto", namespace):
            if shards is not None:
                planned = plan_shards(config, shards, ray_job=submission_id)
                # The result file's key keeps its old name: a task of another version reads it.
                result = {"partitions": [p.to_dict() for p in planned]}
            else:
                summary = run_batch_inference(config, ray_address="auto", namespace=namespace, ray_job=submission_id)
                result = summary.to_dict()
    except NotRetryableError as e:
        print(f"{ERROR_PREFIX}{e}", file=sys.stderr, flush=True)
        return NOT_RETRYABLE_EXIT
    write_job_result(config, submission_id, result)
    if shards is not None:
        logging.getLogger(__name__).info("Shards: %s", [(p.index, len(p.range_ids), p.rows) for p in planned])
    else:
        logging.getLogger(__name__).info("Batch inference summary: %s", result)
    return 0


if __name__ == "__main__":
    from airflow_provider_raybatch.pipeline.runtime.exit import exit_now

    exit_now(main(sys.argv[1:]))
