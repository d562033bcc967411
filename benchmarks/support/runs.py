"""Runs in child processes: one variant (``python -m benchmarks.variants``) in a child with a
private Ray temp dir, its result and its process tree's memory peaks; Daft's own interpreter.

No state leaks between runs, a run can be killed for real (:meth:`VariantRun.kill`), and what a
killed run's Ray leaves is ended by its temp dir (``benchmarks.support.processes``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.support.paths import REPO
from benchmarks.support.processes import TreeMemory, kill_ray_leftovers
from benchmarks.support.results import load_average

#: Daft's own environment (``make daft-env``, from benchmarks/daft-requirements.txt): Daft 0.7
#: requires pyarrow < 26 and the project pins 26, so its variant runs with this interpreter
#: (``RAYBATCH_DAFT_PYTHON`` names another).
DAFT_PYTHON = Path(os.environ.get("RAYBATCH_DAFT_PYTHON") or REPO / ".venv-daft" / "bin" / "python")
DAFT_ENV_HINT = "create it with `make daft-env` (a venv from benchmarks/daft-requirements.txt, ~100 MB to download)"


class VariantRun:
    """One variant running in a child process with a private Ray temp dir.

    ``python``: the child's interpreter, this one's by default (another venv's for a variant
    whose dependencies cannot live beside the project's, such as ``daft``).
    """

    def __init__(
        self,
        variant: str,
        params: dict[str, Any],
        env: dict[str, str] | None = None,
        pss: bool = False,
        python: str | Path | None = None,
    ):
        # Short path: Ray's socket paths are length-limited.
        self.ray_tmp = tempfile.mkdtemp(prefix="rbb", dir="/tmp")
        child_env = {
            **os.environ,
            "RAY_TMPDIR": self.ray_tmp,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "AIRFLOW_HOME": os.environ.get("AIRFLOW_HOME", str(Path(self.ray_tmp) / "airflow")),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # Ray runs its workers at niceness 15: on a machine shared with other work, the
            # predictor would get the CPU only when others leave it, and a comparison with the
            # plain loop (niceness 0) would measure the neighbours. Same priority for every variant.
            "RAY_worker_niceness": "0",
            # A Ray of its own, started and stopped in the run (what was measured before the shared
            # local Ray existed); a benchmark measuring the shared Ray says so in ``env``.
            "RAYBATCH_LOCAL_RAY": "per-task",
            **(env or {}),
        }
        self.load_at_start = load_average()
        self.log_path = Path(self.ray_tmp) / "child.log"
        self.log = open(self.log_path, "w+")  # noqa: SIM115 - closed in finish()
        self.spawned = time.perf_counter()
        self.process = subprocess.Popen(
            [str(python or sys.executable), "-m", "benchmarks.variants", variant, json.dumps(params)],
            cwd=REPO,
            env=child_env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.memory = TreeMemory(self.process.pid, pss=pss).__enter__()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)

    def finish(self, timeout_s: float = 1800) -> dict[str, Any]:
        """Wait for the child, clean up what it left, return its result (with memory peaks)."""
        try:
            returncode = self.process.wait(timeout=timeout_s)
            # The child's whole life: interpreter start, every import, the run, its exit.
            process_s = time.perf_counter() - self.spawned
        finally:
            self.memory.__exit__()
            # Safety net: a SIGKILLed driver's reaper ends its Ray; end anything still running
            # from our private temp dir so that one variant cannot slow the next.
            kill_ray_leftovers(self.ray_tmp)
        self.log.seek(0)
        output = self.log.read()
        self.log.close()
        result: dict[str, Any] = {
            "returncode": returncode,
            "load_avg": self.load_at_start,
            "process_s": round(process_s, 3),
        }
        for line in output.splitlines():
            if line.startswith("RESULT "):
                result.update(json.loads(line[len("RESULT ") :]))
        if returncode == 0 and "wall_s" not in result:
            raise RuntimeError(f"child printed no result:\n{output[-4000:]}")
        if returncode not in (0, -signal.SIGKILL):
            raise RuntimeError(f"child failed with code {returncode}:\n{output[-4000:]}")
        result["peak_rss_mb"] = round(self.memory.peak_rss / 2**20, 1)
        if self.memory.pss:
            result["peak_pss_mb"] = round(self.memory.peak_pss / 2**20, 1)
        result["peak_processes"] = self.memory.peak_processes
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
        return result


def run_variant(
    variant: str,
    params: dict[str, Any],
    env: dict[str, str] | None = None,
    pss: bool = False,
    python: str | Path | None = None,
) -> dict[str, Any]:
    """Run one variant to completion in a child process (``python``: its interpreter) and return its result."""
    return VariantRun(variant, params, env, pss, python).finish()
