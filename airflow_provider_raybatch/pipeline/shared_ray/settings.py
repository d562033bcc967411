"""How a task without a cluster gets its local Ray: the mode, its environment variables, the shared Ray's folder."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODE_ENV = "RAYBATCH_LOCAL_RAY"
IDLE_TIMEOUT_ENV = "RAYBATCH_LOCAL_RAY_IDLE_TIMEOUT_S"
DIR_ENV = "RAYBATCH_LOCAL_RAY_DIR"
NUM_CPUS_ENV = "RAYBATCH_LOCAL_RAY_NUM_CPUS"
NUM_GPUS_ENV = "RAYBATCH_LOCAL_RAY_NUM_GPUS"
SHARED, PER_TASK = "shared", "per-task"
#: Ten minutes: longer than Airflow's default retry delay (5 min) and the gaps between the tasks of
#: a DAG run, so retries and the next tasks find it warm; short enough that an idle laptop gets its
#: memory (~0.5 GB for the head's daemons) back soon.
DEFAULT_IDLE_TIMEOUT_S = 600.0
#: Ray keeps a local node on loopback only where its multi-node support is off, as it is by default on macOS and
#: Windows. Elsewhere it turns 127.0.0.1 (given as the node's address, or as an address to connect to) into the
#: host's outward address, and its GCS, raylet, client server and agents listen on every interface. Ray reads this
#: when it is imported; on Linux it changes nothing else (see
#: :mod:`airflow_provider_raybatch.pipeline.ray_runtime`).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@dataclass(frozen=True)
class LocalRaySettings:
    """How a task without a cluster gets its Ray.

    :param mode: ``"shared"``: connect to (or start) the host's warm shared Ray; ``"per-task"``:
        start a Ray in the task and shut it down at its end (with the reaper).
    :param idle_timeout_s: seconds without a connected task after which the shared Ray stops.
    :param base_dir: where the shared Ray's folders live (default ``$RAY_TMPDIR`` or ``/tmp``).
    :param num_cpus: CPUs the shared Ray offers (None: all the host's, as a per-task Ray).
    :param num_gpus: GPUs the shared Ray offers (None: all it detects).
    """

    mode: str = SHARED
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    base_dir: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LocalRaySettings:
        """From ``RAYBATCH_LOCAL_RAY``, ``RAYBATCH_LOCAL_RAY_IDLE_TIMEOUT_S``, ``RAYBATCH_LOCAL_RAY_DIR``,
        ``RAYBATCH_LOCAL_RAY_NUM_CPUS`` and ``RAYBATCH_LOCAL_RAY_NUM_GPUS`` (unset: the defaults)."""
        from airflow_provider_raybatch.pipeline.errors import ConfigError

        env = os.environ if env is None else env
        mode = (env.get(MODE_ENV) or SHARED).strip().lower().replace("_", "-")
        if mode not in (SHARED, PER_TASK):
            raise ConfigError(f"{MODE_ENV} must be {SHARED!r} or {PER_TASK!r}, got {env.get(MODE_ENV)!r}")
        numbers: dict[str, Any] = {}
        for name, key, kind in (
            (IDLE_TIMEOUT_ENV, "idle_timeout_s", float),
            (NUM_CPUS_ENV, "num_cpus", int),
            (NUM_GPUS_ENV, "num_gpus", int),
        ):
            raw = (env.get(name) or "").strip()
            if not raw:
                continue
            try:
                value = kind(raw)
            except ValueError:
                value = -1
            if value < 0 or (key == "idle_timeout_s" and value == 0):
                raise ConfigError(f"{name} must be a number > 0 (a whole one for CPUs and GPUs), got {raw!r}")
            numbers[key] = value
        return cls(mode=mode, base_dir=(env.get(DIR_ENV) or "").strip() or None, **numbers)

    @property
    def shared(self) -> bool:
        return self.mode == SHARED and shared_mode_supported()


def shared_mode_supported() -> bool:
    """Linux only: liveness, start times and leftovers are read from ``/proc``."""
    return sys.platform.startswith("linux") and os.path.isdir("/proc/self/fd") and bool(sys.executable)


def ray_version() -> str:
    """Ray's version without importing Ray (the task imports it only to connect)."""
    from importlib.metadata import version

    return version("ray")


def python_key() -> str:
    """The Python environment a head serves."""
    # Not resolved: two virtual environments share one interpreter binary but not their packages.
    return f"{sys.executable}|{sys.prefix}"


def head_dir(settings: LocalRaySettings, version: str | None = None) -> Path:
    """The shared Ray's folder: per user, per Ray version and Python environment.

    Short on purpose: Ray's socket paths under it are limited to ~107 characters. Another Ray
    version or environment gets another folder and head; a head nobody uses stops when idle.
    """
    base = settings.base_dir or os.environ.get("RAY_TMPDIR") or "/tmp"
    version = version or ray_version()
    digest = hashlib.sha256(python_key().encode()).hexdigest()[:6]
    return Path(base) / f"rbray-{os.getuid()}" / f"{version}-{digest}"
