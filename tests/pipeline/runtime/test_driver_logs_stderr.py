"""The driver's stderr sorted by level (pipeline/runtime/stderr_levels.py), in real processes that
really end: normally, by an exception, by ``os._exit``, SIGKILL, SIGKILL to their process group,
or abort. Whichever way, every line reaches stdout (Ray's known-harmless one) or stderr (all
others, unchanged and in order), the last one without a newline included."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from airflow_provider_raybatch.pipeline.runtime.stderr_levels import HARMLESS_RAY_LINES
from tests.support.shared_ray import REPO

#: The line Ray 2.55-2.60's core worker writes on the driver's stderr when Ray Data starts a replica.
RAY_LINE = (
    b"[2026-11-28 10:00:00,000 E 4242 4242] core_worker.cc:2194: Actor with class name:"
    b" 'MapWorker(MapBatches(StageWorker))' and ID: '0a1b2c3d4e5f60718293a4b5c6d7e8f902000000' has constructor"
    b" arguments in the object store and max_restarts > 0. If the arguments in the object store go out of scope"
    b" or are lost, the actor restart will fail. See https://github.com/ray-project/ray/issues/53727 for more"
    b" details.\n"
)
#: What else reaches the driver's stderr, which stays there: another of the core worker's errors,
#: the same warning for an actor not Ray Data's, a line the GCS forwards, Python's own writes, and
#: the last words of a process that ends without a newline.
OTHER_LINES = (
    b"[2026-11-28 10:00:01,000 E 4242 4250] core_worker.cc:901: Failed to register actor.\n",
    b"[2026-11-28 10:00:01,000 E 4242 4242] core_worker.cc:2194: Actor with class name: 'Mine' and ID: '0a1b'"
    b" has constructor arguments in the object store and max_restarts > 0.\n",
    b"(pid=gcs_server) [2026-11-28 10:00:02,000 E 77 77] gcs_actor_manager.cc:1: Failed to kill actor\n",
    "Python's own line, unicode: \u2713\n".encode(),
)
LAST_WORDS = b"last words, no newline"
#: How each run's process ends inside the sorted section, and the exit code that shows it did.
ENDINGS = {
    "leaves normally": ("pass", 0),
    "raises": ("raise RuntimeError('crashed in the run')", 1),
    "os._exit": ("os._exit(3)", 3),
    "SIGKILL": ("os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
    "SIGKILL to its group": ("os.killpg(0, signal.SIGKILL)", -signal.SIGKILL),
    "abort": ("os.abort()", -signal.SIGABRT),
}


def run_driver(ending: str) -> subprocess.CompletedProcess:
    """A process that writes :data:`RAY_LINE` and :data:`OTHER_LINES` on its fd 2 while sorted, then ends by ``ending``."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from airflow_provider_raybatch.pipeline.runtime.stderr_levels import ray_stderr_at_level

        with ray_stderr_at_level():
            os.write(2, {RAY_LINE!r})  # as Ray's C++ core worker writes: to the file descriptor
            for line in {OTHER_LINES[:-1]!r}:
                os.write(2, line)
            sys.stderr.write({OTHER_LINES[-1].decode()!r})
            sys.stderr.flush()
            os.write(2, {LAST_WORDS!r})
            {ending}
        os.write(2, b" and after")
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        timeout=60,  # the sorter holds both pipes until it has read the driver's stderr to its end
        start_new_session=True,  # a process group of its own, for the group's SIGKILL
    )


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_line_reaches_the_log_at_its_level_however_the_driver_ends(ending):
    code, returncode = ENDINGS[ending]
    result = run_driver(code)
    assert result.returncode == returncode, result.stderr
    assert result.stdout == RAY_LINE
    assert result.stderr.startswith(b"".join(OTHER_LINES) + LAST_WORDS), result.stderr
    if ending == "leaves normally":
        assert result.stderr == b"".join(OTHER_LINES) + LAST_WORDS + b" and after"  # stderr restored
    if ending == "raises":
        assert result.stderr.endswith(b"RuntimeError: crashed in the run\n")


def test_only_ray_datas_replicas_line_counts_as_harmless():
    assert [any(p.search(line) for p in HARMLESS_RAY_LINES) for line in (RAY_LINE, *OTHER_LINES)] == [
        True,
        *[False] * len(OTHER_LINES),
    ]
