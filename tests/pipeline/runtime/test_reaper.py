"""No process left behind: a SIGKILLed task's embedded Ray ends with it (real processes, real Ray)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from benchmarks.support.processes import kill_ray_leftovers, ray_processes_of

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper reads /proc"),
]

REPO = Path(__file__).resolve().parents[3]

# An owner with a fake Ray session named after it: a writer (a Ray process writing its log), a
# reader (a log shipper tailing it), and a writer somewhere else (an unrelated process).
OWNER = """
import json, os, subprocess, sys, time
from airflow_provider_raybatch.pipeline.runtime.reaper import start_reaper
root, how = sys.argv[1], sys.argv[2]
reaper = start_reaper()
session = os.path.join(root, f"session_2026-01-01_00-00-00_000000_{os.getpid()}", "logs")
os.makedirs(session)
log = os.path.join(session, "raylet.out")
open(log, "w").close()
def hold(path, mode):
    code = f"f = open({path!r}, {mode!r}); import time; time.sleep(120)"
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True).pid
pids = {"writer": hold(log, "a"), "reader": hold(log, "r"), "elsewhere": hold(os.path.join(root, "other.log"), "a"),
        "reaper": reaper.process.pid}
time.sleep(1)  # the holders have opened their files
if how == "disarm":
    reaper.disarm()
print(json.dumps(pids), flush=True)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def start_owner(tmp_path: Path, how: str) -> tuple[subprocess.Popen, dict[str, int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path), how], env=env, stdout=subprocess.PIPE, text=True
    )
    return owner, json.loads(owner.stdout.readline())


def end_all(owner: subprocess.Popen, pids: dict[str, int]) -> None:
    owner.kill()
    owner.wait()
    for pid in pids.values():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_reaper_kills_the_writers_of_a_killed_owners_session_and_nothing_else(tmp_path):
    owner, pids = start_owner(tmp_path, "arm")
    try:
        assert all(alive(pid) for pid in pids.values())
        owner.kill()  # SIGKILL: no finally, no atexit
        owner.wait()
        assert wait_until(lambda: not alive(pids["writer"]), 10), "the session's writer outlived its owner"
        assert wait_until(lambda: not alive(pids["reaper"]), 10), "the reaper did not exit after reaping"
        assert alive(pids["reader"]) and alive(pids["elsewhere"])
    finally:
        end_all(owner, pids)


def test_disarmed_reaper_exits_and_kills_nothing(tmp_path):
    owner, pids = start_owner(tmp_path, "disarm")
    try:
        assert not alive(pids["reaper"])
        owner.kill()
        owner.wait()
        time.sleep(1.5)
        assert alive(pids["writer"]) and alive(pids["reader"]) and alive(pids["elsewhere"])
    finally:
        end_all(owner, pids)


TASK = """
import logging, sys, time
logging.basicConfig(level=logging.INFO)
import ray
from airflow_provider_raybatch.pipeline.runtime.local_ray import ray_session

@ray.remote
class Busy:
    def work(self):
        time.sleep(300)

with ray_session():
    busy = Busy.remote()
    busy.work.remote()
    ray.get(ray.remote(lambda: 1).remote())
    print("READY", flush=True)
    time.sleep(300)
"""

AGENTS = (b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_sigkilled_task_leaves_no_process_of_its_embedded_ray():
    ray_tmp = tempfile.mkdtemp(prefix="rbr", dir="/tmp")  # short: Ray's socket paths are length-limited
    # The opt-out from the host's shared Ray: a Ray of the task's own, ended by the reaper.
    env = {
        **os.environ,
        "RAY_TMPDIR": ray_tmp,
        "PYTHONPATH": str(REPO),
        "RAYBATCH_LOCAL_RAY": "per-task",
        "RAYBATCH_LOCAL_RAY_DIR": ray_tmp,
    }
    task = subprocess.Popen(
        [sys.executable, "-c", TASK], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output = []
        for line in task.stdout:
            output.append(line)
            if line.startswith("READY"):
                break
        assert task.poll() is None, "".join(output)
        # The agents start after ray.init returns; they are what Ray itself leaves behind.
        agents_up = wait_until(lambda: all(any(a in cmdline(p) for p in ray_processes_of(ray_tmp)) for a in AGENTS), 60)
        assert agents_up, [cmdline(p)[:40] for p in ray_processes_of(ray_tmp)]
        assert len(ray_processes_of(ray_tmp)) >= 8  # GCS, raylet, agents, workers, the reaper...
        task.kill()
        task.wait()
        gone = wait_until(lambda: not ray_processes_of(ray_tmp), 15)
        assert gone, f"left after 15 s: {[cmdline(p)[:40] for p in ray_processes_of(ray_tmp)]}"
        assert "Starting an embedded local Ray for this task" in "".join(output)
        assert not list(Path(ray_tmp).glob("rbray-*")), "a shared Ray was started despite the opt-out"
    finally:
        task.kill()
        task.wait()
        kill_ray_leftovers(ray_tmp)
