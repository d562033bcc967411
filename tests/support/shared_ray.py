"""Tasks on a shared local Ray, in processes of their own: what the shared-Ray tests start."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A task: connect, run a probe on a worker, optionally start work that never ends (an actor, a
# task, and a process the actor starts), print what it saw, stay connected until told to go
# (or, lingering, disconnect and live on until told to go).
TASK = """
import json, logging, os, subprocess, sys, time
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
import ray
from airflow_provider_raybatch.pipeline.runtime.local_ray import ray_session
mode, release = sys.argv[1], sys.argv[2]
busy, linger = mode == "busy", mode == "linger"

@ray.remote
def probe():
    return {"pid": os.getpid(), "mark": os.environ.get("RAYBATCH_TEST_MARK"), "job_env": os.environ.get("RAYBATCH_JOB_ENV")}

@ray.remote
class Busy:
    def work(self):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        time.sleep(300)

started = time.monotonic()
with ray_session():
    connect_s = time.monotonic() - started
    seen = None if mode == "idle" else ray.get(probe.remote())
    if busy:
        actor = Busy.remote()
        actor.work.remote()
        ray.remote(lambda: time.sleep(300)).remote()
        time.sleep(3)  # the actor, the task and the actor's child start
    info = {"connect_s": connect_s, "node": ray.get_runtime_context().get_node_id(), "worker": seen}
    print("INFO " + json.dumps(info), flush=True)
    while release and not linger and not os.path.exists(release):
        time.sleep(0.1)
    if release and not linger:
        print("AGAIN " + json.dumps(ray.get(probe.remote())), flush=True)
if linger:  # disconnected, and the process goes on (as `airflow dags test` does to its next task)
    print("LEFT", flush=True)
    while not os.path.exists(release):
        time.sleep(0.1)
"""


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


class Task:
    """A task process on the shared Ray."""

    def __init__(
        self, env: dict[str, str], mark: str, busy: bool = False, release: Path | None = None, mode: str = "probe"
    ) -> None:
        self.release = release
        self.process = subprocess.Popen(
            [sys.executable, "-c", TASK, "busy" if busy else mode, str(release or "")],
            env={**env, "RAYBATCH_TEST_MARK": mark},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []

    def info(self, timeout_s: float = 300) -> dict:
        """What the task printed once connected (reads its output up to that line)."""
        deadline = time.monotonic() + timeout_s
        for line in self.process.stdout:
            self.output.append(line)
            if line.startswith("INFO "):
                return json.loads(line[5:])
            assert time.monotonic() < deadline, "".join(self.output)
        raise AssertionError(f"the task ended without connecting:\n{''.join(self.output)}")

    def finish(self, timeout_s: float = 120) -> str:
        if self.release is not None:
            self.release.touch()
        rest, _ = self.process.communicate(timeout=timeout_s)
        self.output.append(rest)
        assert self.process.returncode == 0, "".join(self.output)
        return "".join(self.output)
