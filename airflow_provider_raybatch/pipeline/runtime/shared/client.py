"""A task connected to the shared head, its environment for its workers, and warm workers.

A task's workers get its environment like workers of a per-task Ray do (whose raylet inherits
the task's environment): ``PYTHONPATH`` (the task's ``sys.path``), ``PATH`` and the ``LD_*`` and
``PYTHON*`` variables, read when a process starts, travel in the job's ``runtime_env``; the rest
is written to ``envs/<hash>.env`` (0600, named by its content) and applied by a
``worker_process_setup_hook`` as each worker starts, so that secrets in the task's environment
never reach Ray's job table or the runtime-env agent's log, which prints every job's
``runtime_env``. Airflow's variables of one task try (``AIRFLOW_CTX_*``, ``_AIRFLOW_*``) are left
out: with them no two tasks' environments would be the same.

**Warm workers.** A worker process belongs to one Ray job and ends with it, and starting one
(Python, Ray, Ray Data, torch) takes seconds. So a task that ends leaves, for the next task with
the same ``runtime_env`` (the same ``sys.path``, environment and predictors), as many workers as
it used, started for no job yet: they apply that environment and import that task's modules
(:data:`PRELOAD_ENV`) at once, and Ray hands them to the next such task's replicas. They live as
long as the head stays up idle, at most as many at once as the head has CPUs; ``warm/<key>.json``
counts them (an estimate: Ray's worker pool is the truth, and the count only spares starting
workers twice).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_provider_raybatch.pipeline.errors import NoProgressError
from airflow_provider_raybatch.pipeline.runtime.reaper import close_in_forked_children, forget
from airflow_provider_raybatch.pipeline.runtime.shared.folder import (
    locked,
    private_dir,
    read_warm,
    shares_held,
    write_env,
    write_warm,
)
from airflow_provider_raybatch.pipeline.runtime.shared.head_processes import alive

log = logging.getLogger(__name__)

#: In a job's runtime_env: the file holding the task's environment, for :func:`apply_job_environment`.
JOB_ENV_FILE_ENV = "RAYBATCH_JOB_ENV"
SETUP_HOOK = "airflow_provider_raybatch.pipeline.runtime.shared.client.apply_job_environment"
#: In a job's runtime_env: modules a warm worker imports once it has the task's environment.
PRELOAD_ENV = "RAYBATCH_PRELOAD"

# Variables a worker reads when it starts: set in the job's runtime_env (none is a secret).
_AT_START = re.compile(r"^(PATH|LD_[A-Z_]+|PYTHON[A-Z_]*)$")
# Variables Ray sets per process (device visibility, its own settings), or the shell's.
_RAY_OWNED = re.compile(r"^(RAY_.*|__RAY.*|.*_VISIBLE_DEVICES|.*_VISIBLE_CORES|PWD|OLDPWD|SHLVL|_)$")
# Warm workers are an optimisation: not worth waiting for a head another task is starting.
_WARM_LOCK_S = 5.0
# Airflow's variables of one task try: its context, and its supervisor's channel and start message.
_TASK_TRY = re.compile(r"^(AIRFLOW_CTX_.*|_AIRFLOW_.*|__AIRFLOW_.*)$")


class SharedRayClient:
    """A task's registration with the shared head: a held lock, and its environment for its workers."""

    def __init__(self, root: Path, record: dict[str, Any]) -> None:
        self.root, self.record = root, record
        self.id = f"{os.getpid()}-{secrets.token_hex(4)}"
        folder = root / "clients"
        private_dir(folder)
        self.lock_path = folder / f"{self.id}.lock"
        self.share_path, self.uses_path = folder / f"{self.id}.share", folder / f"{self.id}.uses"
        env = {k: v for k, v in os.environ.items() if not (_RAY_OWNED.match(k) or _TASK_TRY.match(k))}
        self.env_path = write_env(root, env)  # under the folder's lock (join_shared_head): see drop_unused
        self.uses_path.write_text(self.env_path.stem)
        self.pool_key = ""
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

    def runtime_env(self, base: dict[str, Any], preload: Sequence[str] = ()) -> dict[str, Any]:
        """The job's runtime_env: ``base`` (the task's ``sys.path``), what a worker reads at start,
        where the rest of the task's environment is, and what a warm worker imports ahead."""
        env_vars = {k: v for k, v in os.environ.items() if _AT_START.match(k)}
        env_vars.update(base.get("env_vars", {}))
        env_vars[JOB_ENV_FILE_ENV] = str(self.env_path)
        if preload:
            env_vars[PRELOAD_ENV] = ",".join(preload)
        runtime_env = {**base, "env_vars": env_vars, "worker_process_setup_hook": SETUP_HOOK}
        # Ray gives a job's tasks only workers started with an equal runtime_env: so do warm workers.
        self.pool_key = hashlib.sha256(json.dumps(runtime_env, sort_keys=True).encode()).hexdigest()[:16]
        return runtime_env

    def take_warm(self, count: int) -> int:
        """Count up to ``count`` of the warm workers left for this task's runtime_env as taken:
        Ray hands them to this task's replicas. Returns how many."""
        try:
            with locked(self.root, timeout_s=_WARM_LOCK_S):
                warm = read_warm(self.root).get(self.pool_key)
                taken = min(count, warm["workers"]) if warm else 0
                if taken:
                    write_warm(self.root, self.pool_key, {**warm, "workers": warm["workers"] - taken})
        except TimeoutError:  # another task is starting a head (minutes): this one starts its own workers
            return 0
        if taken:
            log.info("Using %d warm worker(s) left by an earlier task with this environment", taken)
        return taken

    def leave_warm(self, count: int, cpus: float, start: Callable[[int, float], bool]) -> int:
        """Leave up to ``count`` warm workers for the next task with this runtime_env, at most
        ``cpus`` for all runtime_envs together; ``start(n, keep_alive_s)`` asks Ray for them.
        Returns how many were started."""
        if not self.head_alive():  # the run is failing for it (see .head_watch): no raylet to ask
            return 0
        keep_alive = float(self.record["idle_timeout_s"])
        try:
            with locked(self.root, timeout_s=_WARM_LOCK_S):
                warm = read_warm(self.root)
                mine = warm[self.pool_key]["workers"] if self.pool_key in warm else 0
                room = int(cpus) - sum(w["workers"] for w in warm.values())
                add = min(count - mine, room)
                if add <= 0 or not start(add, keep_alive):
                    return 0
                record = {"env": self.env_path.stem, "workers": mine + add, "until": time.time() + keep_alive}
                write_warm(self.root, self.pool_key, record)
        except TimeoutError:
            return 0
        return add

    def head_alive(self) -> bool:
        """Whether the head's process is still the one this task joined (by its pid and start time)."""
        return alive(self.record.get("head_pid"), self.record.get("head_start"))

    def held_by_others(self) -> dict[str, float]:
        """What the other connected tasks took of the head's resources, per resource (a snapshot)."""
        with locked(self.root):
            shares = shares_held(self.root, exclude=self.id)
        held: dict[str, float] = {}
        for share in shares.values():
            for name, amount in share.items():
                held[name] = held.get(name, 0) + amount
        return held

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
        for path in (self.share_path, self.uses_path, self.lock_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        forget(fd)
        os.close(fd)  # its environment's file goes with the monitor's next look, unless warm workers use it


def _amounts(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in resources.items() if v) or "nothing"


def apply_job_environment() -> None:
    """The workers' setup hook: the task's environment, as a worker of its own Ray would inherit it;
    then, in a warm worker (started for no job yet), the modules the task's replicas will import.

    Variables Ray sets per worker (``RAY_*``, ``CUDA_VISIBLE_DEVICES``...) keep Ray's values.
    A missing environment file fails the worker's start: no worker runs without its environment.
    """
    path = os.environ.get(JOB_ENV_FILE_ENV)
    if not path:
        return
    with open(path) as f:
        env = json.load(f)
    for key, value in env.items():
        if not _RAY_OWNED.match(key) and not _AT_START.match(key):
            os.environ[key] = value
    from ray import JobID

    if os.environ.get("RAY_JOB_ID") != JobID.nil().hex():
        return  # started for a job, which is waiting for it: its replicas import what they need
    for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - the replica that needs it reports it, with its stage
            log.warning("Could not import %s ahead in a warm worker: %s", name, e)
