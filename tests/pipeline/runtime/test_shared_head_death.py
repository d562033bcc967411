"""A shared head killed under a running task: the task fails within seconds, retryably, saying how; its retry resumes.

Each test kills processes of its own head only (the ``shared`` fixture's private folder): the suite's shared Ray, which
this process may be connected to, is not touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from airflow_provider_raybatch.pipeline.runtime.shared.folder import read_record
from airflow_provider_raybatch.pipeline.runtime.shared.head_processes import head_processes
from tests.support.data import assert_output_sound, write_input
from tests.support.pipeline_runs import RUN_SCRIPT, commit_count
from tests.support.shared_ray import Task, wait_until

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shared Ray reads /proc"),
]

ROWS = 2000
#: Ray alone ends a driver whose GCS is gone after 60 s of retries, saying nothing of the head: a run that takes this
#: long to fail was not told.
FAILS_WITHIN_S = 45


def assert_names_the_head(output: str, record: dict, root: Path) -> None:
    assert "LocalRayDiedError: the shared local Ray this task ran on" in output, output[-5000:]
    assert f"({record['address']}, in {root}) has died" in output
    assert f"Its log: {root / 'head.exited.log'}" in output and (root / "head.exited.log").exists()
    assert "Failed to connect to GCS" not in output


def test_a_run_whose_shared_head_is_killed_fails_at_once_saying_how_and_its_retry_resumes(shared, tmp_path):
    env, root = shared
    write_input(tmp_path / "in", [ROWS])
    out, slow = tmp_path / "out", tmp_path / "slow"
    slow.touch()

    def run() -> subprocess.Popen:
        kwargs = json.dumps({"marker": str(slow)})
        args = [str(tmp_path / "in"), str(out), "tests.support.predictors:SlowWhileMarked", kwargs]
        return subprocess.Popen(
            [sys.executable, "-c", RUN_SCRIPT, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    first = run()  # a range a second per replica: ~10 s of work left when the head dies
    try:
        assert wait_until(lambda: commit_count(out) >= 1 or first.poll() is not None, 180)
        record = read_record(root)
        assert first.poll() is None and record is not None
        os.kill(record["head_pid"], signal.SIGKILL)  # `ray start`: its monitor ends the daemons
        output, _ = first.communicate(timeout=FAILS_WITHIN_S)
    finally:
        first.kill()
    # The driver waits inside Ray Data, which waits for the dead GCS: the process is ended.
    assert first.returncode == 75, output[-5000:]
    assert_names_the_head(output, record, root)
    assert (
        f"its head process (ray start, pid {record['head_pid']}) was killed by signal 9 "
        "(SIGKILL: e.g. the kernel's out-of-memory killer)"
    ) in output
    committed = commit_count(out)
    assert 1 <= committed < ROWS // 100

    # The retry starts a new head and resumes after the committed ranges.
    slow.unlink()
    second = run()
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 0, output[-5000:]
    assert "Starting the shared local Ray" in output
    summary = json.loads(output.split("SUMMARY ", 1)[1].splitlines()[0])
    assert summary["ranges_skipped"] == committed
    assert_output_sound(out, range(ROWS))


def test_a_task_whose_head_loses_its_gcs_raises_the_error_and_disconnects(shared, tmp_path):
    env, root = shared
    task = Task(env, "gcs", release=tmp_path / "never")  # connected, in Python code until told to go
    task.info()
    record = read_record(root)
    gcs = next(pid for pid in head_processes(root) if "gcs_server" in Path(f"/proc/{pid}/cmdline").read_text())
    os.kill(gcs, signal.SIGKILL)  # the OOM killer's pick: `ray start` ends the other daemons and exits
    try:
        output, _ = task.process.communicate(timeout=FAILS_WITHIN_S)
    finally:
        task.process.kill()
    assert task.process.returncode == 1, output[-5000:]  # the error, raised out of the task's `with ray_session()`
    assert "airflow_provider_raybatch.pipeline.errors.LocalRayDiedError: the shared local Ray" in output
    assert_names_the_head(output, record, root)
    assert "its head process (ray start, pid" in output and "exited with code 1" in output
    # Which daemon died is read from `ray start`'s log: Ray 2.55 exits without flushing it.
    if Version(record["ray_version"]) >= Version("2.60"):
        assert (
            "exited with code 1; its gcs_server was killed by signal 9 (SIGKILL: e.g. the kernel's out-of-memory killer)"
        ) in output
