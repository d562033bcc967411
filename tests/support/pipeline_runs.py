"""Running the pipeline in tests: a config on a test's folders, a run in a process of its own
(with its own embedded Ray, to kill or race it), its commits counted, Ray Data's plans recorded."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from benchmarks.support.processes import kill_ray_leftovers

REPO = Path(__file__).resolve().parents[2]


def config(tmp_path: Path, predictor="tests.support.predictors:score", **kwargs) -> BatchInferenceConfig:
    stage_kwargs = {
        k: kwargs.pop(k)
        for k in ("predictor_kwargs", "num_cpus", "num_gpus", "concurrency", "batch_size")
        if k in kwargs
    }
    return BatchInferenceConfig(
        input_path=kwargs.pop("input_path", str(tmp_path / "in")),
        output_path=kwargs.pop("output_path", str(tmp_path / "out")),
        stages=kwargs.pop("stages", None) or [Stage(predictor, **stage_kwargs)],
        **{"id_column": "id", "rows_per_range": 100, **kwargs},
    )


def commit_count(output: str | Path) -> int:
    """Ranges committed in ``output``, as its ledger reads them (while a writer may be writing)."""
    return len(OutputLedger.open(str(output)).committed())


#: Records each range as soon as it is published: crash points then fall between two ranges.
RECORD_EACH_RANGE = {"RAYBATCH_RECORD_INTERVAL_S": "0"}


RUN_SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.config import TableOutput
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
if extra.get("table"):
    extra["table"] = TableOutput(**extra["table"])
cfg = BatchInferenceConfig(sys.argv[1], sys.argv[2], [Stage(sys.argv[3], json.loads(sys.argv[4]), batch_size=100)],
                           id_column="id", rows_per_range=100, **extra)
print("SUMMARY " + json.dumps(run_batch_inference(cfg).to_dict()))
"""


def own_ray_env(env: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """A temp dir for a child process's own Ray, and the child's environment that points Ray there."""
    ray_tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # short: Ray's socket paths are length-limited
    # A Ray of its own (per-task, with its reaper): these tests kill, freeze and race such processes.
    return ray_tmp, {
        **os.environ,
        "RAY_TMPDIR": ray_tmp,
        "RAYBATCH_LOCAL_RAY": "per-task",
        "PYTHONPATH": str(REPO),
        **(env or {}),
    }


def run_in_subprocess(tmp_path, predictor, kwargs, env=None, wait=True, **config_kwargs):
    """Run the pipeline in its own process, with its own embedded Ray in its own temp dir."""
    ray_tmp, env = own_ray_env(env)
    args = [
        sys.executable,
        "-c",
        RUN_SCRIPT,
        str(tmp_path / "in"),
        config_kwargs.pop("output_path", str(tmp_path / "out")),
        predictor,
        json.dumps(kwargs),
        json.dumps(config_kwargs),
    ]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if wait:
        proc.output = proc.communicate(timeout=300)[0]
    proc.ray_tmp = ray_tmp
    return proc


SPEC_SCRIPT = """
import json, logging, sys
from airflow_provider_raybatch.pipeline import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
if __name__ == "__main__":  # vLLM spawns its engine processes
    logging.basicConfig(level=logging.INFO)
    print("SUMMARY " + json.dumps(run_batch_inference(BatchInferenceConfig.from_spec(json.loads(sys.argv[1]))).to_dict()))
"""


def run_spec_in_subprocess(cfg: BatchInferenceConfig, env: dict[str, str], timeout: float = 300):
    """Run ``cfg`` (as its JSON spec) in a process of its own, with its own embedded Ray; wait for it."""
    ray_tmp, env = own_ray_env(env)
    try:
        return subprocess.run(
            [sys.executable, "-c", SPEC_SCRIPT, json.dumps(cfg.to_spec())],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        kill_leftovers(ray_tmp)


def ray_processes(ray_tmp: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", ray_tmp], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def kill_leftovers(ray_tmp: str) -> None:
    """A safety net: a SIGKILLed driver's reaper already ends its Ray (asserted below)."""
    kill_ray_leftovers(ray_tmp)


PLAN_LOGGER = "ray.data._internal.execution.streaming_executor"


class PlanRecorder(logging.Handler):
    """Records the execution plans Ray Data logs (its operators, after fusion)."""

    def __init__(self):
        super().__init__()
        self.plans: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if m := re.search(r"Execution plan of Dataset \S+: (.*)", record.getMessage()):
            self.plans.append(m.group(1))

    def __enter__(self) -> PlanRecorder:
        logging.getLogger(PLAN_LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        logging.getLogger(PLAN_LOGGER).removeHandler(self)
