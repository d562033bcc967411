"""Entry point of a Ray Job: ``python -m airflow_provider_raybatch.pipeline.job '<spec JSON>'``.

The spec is :meth:`BatchInferenceConfig.to_spec` plus the submission id and namespace; it holds
no credentials: storage access comes from the cluster's environment or the job's runtime_env.
The summary is written to ``<output>/_raybatch/jobs/<submission id>.json`` for the task to read.
Exit status :data:`NOT_RETRYABLE_EXIT` means a :class:`NotRetryableError` (bad settings or
input, or too many engine errors): retrying cannot help.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.errors import ERROR_PREFIX, NOT_RETRYABLE_EXIT, NotRetryableError
from airflow_provider_raybatch.pipeline.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.storage import read_json, write_json

if TYPE_CHECKING:
    from airflow_provider_raybatch.pipeline.summary import RunSummary


def entrypoint(config_spec: dict[str, Any], submission_id: str, namespace: str | None) -> str:
    """The job's command line, for :meth:`BatchInferenceConfig.to_spec` output."""
    spec = {"submission_id": submission_id, "namespace": namespace, "config": config_spec}
    return f"python -m airflow_provider_raybatch.pipeline.job {shlex.quote(json.dumps(spec, sort_keys=True))}"


def write_job_summary(config: BatchInferenceConfig, submission_id: str, summary: RunSummary) -> None:
    """Leave a Ray Job's summary in its output, where the task that submitted it reads it."""
    ledger = OutputLedger.open(config.output_path, config.storage_options)
    write_json(ledger.fs, ledger.job_summary_path(submission_id), summary.to_dict())


def read_job_summary(config: BatchInferenceConfig, submission_id: str) -> RunSummary | None:
    """The summary a Ray Job left (None if it left none), with its submission id."""
    from airflow_provider_raybatch.pipeline.summary import RunSummary

    ledger = OutputLedger.open(config.output_path, config.storage_options)
    path = ledger.job_summary_path(submission_id)
    ledger.fs.invalidate_cache()
    if not ledger.fs.exists(path):
        return None
    return RunSummary.from_dict({**read_json(ledger.fs, path), "ray_submission_id": submission_id})


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    spec: dict[str, Any] = json.loads(argv[0])
    from airflow_provider_raybatch.pipeline.runner import run_batch_inference

    try:
        config = BatchInferenceConfig.from_spec(spec["config"])
        summary = run_batch_inference(
            config, ray_address="auto", namespace=spec.get("namespace"), ray_job=spec["submission_id"]
        )
    except NotRetryableError as e:
        print(f"{ERROR_PREFIX}{e}", file=sys.stderr, flush=True)
        return NOT_RETRYABLE_EXIT
    write_job_summary(config, spec["submission_id"], summary)
    logging.getLogger(__name__).info("Batch inference summary: %s", summary.to_dict())
    return 0


if __name__ == "__main__":
    from airflow_provider_raybatch.pipeline.process import exit_now

    exit_now(main(sys.argv[1:]))
