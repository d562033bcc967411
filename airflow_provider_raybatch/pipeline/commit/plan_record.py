"""``_raybatch/plan.json``: what an output was planned on, and the id its commit records name."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from airflow_provider_raybatch.pipeline.commit.commit_log import PLAN_VERSION
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.planning.planner import recorded_ranges

#: What of a planned file identifies a plan (:meth:`PlanRecord.plan_id`).
_PLAN_ID_FILE_KEYS = ("relpath", "size", "rows", "row_groups", "signature")


@dataclass(frozen=True)
class PlanRecord:
    """What an output was planned on, checked by every later run.

    :param input_path: the input as the user gave it.
    :param input: the planned files and ranges (:meth:`Plan.describe`).
    :param job: the job signature (:meth:`BatchInferenceConfig.job_signature`).
    :param run_key: the run that planned it (``mode="overwrite"`` applies once per run key).
    :param version: the layout version of the output.
    """

    input_path: str
    input: dict[str, Any]
    job: dict[str, Any]
    run_key: str | None
    version: int = PLAN_VERSION

    @classmethod
    def from_json(cls, data: dict[str, Any], display_path: str) -> PlanRecord:
        """The plan recorded for the output ``display_path``; one of a newer, incompatible layout is refused."""
        version = data.get("version")
        if not isinstance(version, int) or version > PLAN_VERSION:
            raise ConfigError(
                f"output {display_path!r} was written by a newer version of airflow-provider-raybatch "
                f"(layout version {version!r}; this version reads up to {PLAN_VERSION}): upgrade the provider "
                "where the pipeline runs, or write to another output path"
            )
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def plan_id(self) -> str:
        """What identifies this plan: a digest of the input path, job signature, run key and each
        planned file's name, size, rows, row groups and signature.

        A writer names it in each record it writes (:meth:`.ledger.OutputLedger.publish`), so that
        ranges written under a plan that has since been replaced (an overwrite by another run or
        with other settings, racing a writer that checked the old plan) are told apart from the
        output's own: the verifier reports them, and the next writer redoes them. Fingerprint
        fields that plans of earlier versions lack (modification time, ETag, version) are left
        out, so that such a plan keeps its id.
        """
        files = [{k: f.get(k) for k in _PLAN_ID_FILE_KEYS} for f in self.input.get("files", ())]
        data = {"input_path": self.input_path, "files": files, "job": self.job, "run_key": self.run_key}
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]

    def range_ids(self) -> list[str]:
        """The planned ranges' ids, in plan order (listed by layout 1, cut again from the files by layout 2)."""
        ranges = recorded_ranges(self.input, self.job["rows_per_range"], self.job.get("max_rows"))
        return [r.id for r in ranges]
