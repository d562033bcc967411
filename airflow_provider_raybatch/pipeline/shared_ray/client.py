"""A task connected to the shared head, and its environment for its workers.

A task's workers get its environment like workers of a per-task Ray do (whose raylet inherits
the task's environment): ``PYTHONPATH`` (the task's ``sys.path``), ``PATH`` and the ``LD_*`` and
``PYTHON*`` variables, read when a process starts, travel in the job's ``runtime_env``; the rest
is written to ``clients/<id>.env`` (0600) and applied by a ``worker_process_setup_hook`` as each
worker starts, so that secrets in the task's environment never reach Ray's job table or the
runtime-env agent's log, which prints every job's ``runtime_env``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_provider_raybatch.pipeline.errors import NoProgressError
from airflow_provider_raybatch.pipeline.reaper import close_in_forked_children, forget
from airflow_provider_raybatch.pipeline.shared_ray.folder import locked, private_dir, shares_held

log = logging.getLogger(__name__)

#: In a job's runtime_env: the file holding the task's environment, for :func:`apply_job_environment`.
JOB_ENV_FILE_ENV = "RAYBATCH_JOB_ENV"
SETUP_HOOK = "airflow_provider_raybatch.pipeline.shared_ray.client.apply_job_environment"

# Variables a worker reads when it starts: set in the job's runtime_env (none is a secret).
_AT_START = re.compile(r"^(PATH|LD_[A-Z_]+|PYTHON[A-Z_]*)$")
# Variables Ray sets per process (device visibility, its own settings), or the shell's.
_RAY_OWNED = re.compile(r"^(RAY_.*|__RAY.*|.*_VISIBLE_DEVICES|.*_VISIBLE_CORES|PWD|OLDPWD|SHLVL|_)$")


class SharedRayClient:
    """A task's registration with the shared head: a held lock, and its environment for its workers."""

    def __init__(self, root: Path, record: dict[str, Any]) -> None:
        self.root, self.record = root, record
        self.id = f"{os.getpid()}-{secrets.token_hex(4)}"
        folder = root / "clients"
        private_dir(folder)
        self.lock_path, self.env_path = folder / f"{self.id}.lock", folder / f"{self.id}.env"
        self.share_path = folder / f"{self.id}.share"
        env = {k: v for k, v in os.environ.items() if not _RAY_OWNED.match(k)}
        fd = os.open(self.env_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(env, f)
        # Locked before it gets its name: the monitor never sees an unlocked client file.
        tmp = folder / f".{self.id}"
        self._fd: int | None = os.open(tmp, os.O_RDONLY | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        os.replace(tmp, self.lock_path)
        close_in_forked_children(self._fd)  # a forked child would hold the lock too

    @property
    def address(self) -> str:
        return self.record["address"]

    @property
    def token_path(self) -> Path:
        return self.root / "token"

    def runtime_env(self, base: dict[str, Any]) -> dict[str, Any]:
        """The job's runtime_env: ``base`` (the task's ``sys.path``), what a worker reads at start,
        and where the rest of the task's environment is."""
        env_vars = {k: v for k, v in os.environ.items() if _AT_START.match(k)}
        env_vars.update(base.get("env_vars", {}))
        env_vars[JOB_ENV_FILE_ENV] = str(self.env_path)
        return {**base, "env_vars": env_vars, "worker_process_setup_hook": SETUP_HOOK}

    def take_share(
        self, need: Mapping[str, float], total: Mapping[str, float], timeout_s: float | None, poll_s: float = 0.5
    ) -> None:
        """Wait until the head can give this task ``need`` beside what the other connected tasks
        took, and take it (``clients/<id>.share``, given back when the task disconnects).

        Without turns, tasks started together on a small head could each get some of what they
        need (a replica each, and no CPU left for their read tasks) and wait for good. A task that
        has its turn has its minimum, so it progresses and ends; it may still wait briefly for
        CPUs that another task's autoscaled replicas hold.

        :param need: the minimum this task's stages need at once, per Ray resource (``CPU``, ``GPU``).
        :param total: what the head offers, per resource.
        :param timeout_s: how long to wait (the run's ``progress_timeout``); None: as long as it takes.
        :raises NoProgressError: after ``timeout_s``, naming the tasks that hold the head.
        """
        started, last_log = time.monotonic(), None
        while True:
            with locked(self.root):
                shares = shares_held(self.root, exclude=self.id)
                held = {k: sum(s.get(k, 0) for s in shares.values()) for k in need}
                short = [k for k, v in need.items() if v and held[k] + v > total.get(k, 0) + 1e-9]
                if not short:
                    self.share_path.write_text(json.dumps(dict(need)))
                    break
            state = (
                f"the shared local Ray's {' and '.join(short)}: this task needs {_amounts(need)} at once, "
                f"other tasks hold {_amounts(held)} of {_amounts({k: total.get(k, 0) for k in need})}"
            )
            waited = time.monotonic() - started
            if timeout_s is not None and waited > timeout_s:
                pids = sorted({int(client.split("-")[0]) for client in shares})
                raise NoProgressError(
                    f"waited {waited:.0f} s (progress_timeout) for {state} (task processes {pids}); "
                    "a task holds its share until it ends"
                )
            if last_log is None or time.monotonic() - last_log >= 30:
                last_log = time.monotonic()
                log.info("Waiting for %s", state)
            time.sleep(poll_s)
        if last_log is not None:
            log.info("Got this task's share of the shared local Ray after %.1f s", time.monotonic() - started)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        for path in (self.share_path, self.env_path, self.lock_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        forget(fd)
        os.close(fd)


def _amounts(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in resources.items() if v) or "nothing"


def apply_job_environment() -> None:
    """The workers' setup hook: the task's environment, as a worker of its own Ray would inherit it.

    Variables Ray sets per worker (``RAY_*``, ``CUDA_VISIBLE_DEVICES``...) keep Ray's values.
    """
    path = os.environ.get(JOB_ENV_FILE_ENV)
    if not path:
        return
    try:
        with open(path) as f:
            env = json.load(f)
    except (OSError, ValueError):
        return  # the task ended: this worker is about to be ended with its job
    for key, value in env.items():
        if not _RAY_OWNED.match(key) and not _AT_START.match(key):
            os.environ[key] = value
