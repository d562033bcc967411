"""How a task without a cluster gets its local Ray: the mode, its environment variables, the shared Ray's folder."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_raybatch.pipeline.runtime.shared.folder import private_dir

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
#: :mod:`airflow_provider_raybatch.pipeline.runtime.local_ray`).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: The longest path of an AF_UNIX socket, in bytes (Linux's 108 with the final NUL). Ray checks its sockets' paths
#: against it as it starts, and fails.
SOCKET_PATH_MAX = 107
#: The most Ray appends to its temp dir for a socket: the session's folder (named after the date and the pid of the
#: process that starts it, up to 7 digits on Linux), ``sockets/`` and the longest socket name, with a margin. Without
#: its dashboard (the provider never starts it) Ray has two sockets there: ``raylet`` and ``plasma_store``.
RAY_SOCKET_SUFFIX_MAX = len("/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store") + 3
#: Where the short links to Ray temp dirs on long paths go (in ``rbray-<uid>/``): short on every Linux host.
LINK_PARENT = Path("/tmp")


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

    Short on purpose: Ray's socket paths under it are limited to 107 bytes (where they would not fit,
    Ray gets a short link to its ``r/``: :func:`ray_temp_dir`). Another Ray version or environment
    gets another folder and head; a head nobody uses stops when idle.
    """
    base = settings.base_dir or os.environ.get("RAY_TMPDIR") or "/tmp"
    version = version or ray_version()
    digest = hashlib.sha256(python_key().encode()).hexdigest()[:6]
    return Path(base) / f"rbray-{os.getuid()}" / f"{version}-{digest}"


def dir_setting(settings: LocalRaySettings) -> str:
    """The environment variable that places the shared Ray's folder, to name when that folder does not suit.

    :param settings: the task's local Ray settings.
    """
    if settings.base_dir or not os.environ.get("RAY_TMPDIR"):
        return DIR_ENV
    return "RAY_TMPDIR"


def per_task_ray_dir() -> tuple[Path, str]:
    """Where a per-task Ray keeps its sessions, as Ray chooses it (``$RAY_TMPDIR``, else ``$TMPDIR``, else ``/tmp``,
    then ``ray``), and the environment variable that sets it."""
    for name in ("RAY_TMPDIR", "TMPDIR"):
        if os.environ.get(name):
            return Path(os.environ[name]) / "ray", name
    return Path("/tmp/ray"), "RAY_TMPDIR"


def ray_temp_dir(folder: Path, setting: str, link_parent: Path = LINK_PARENT) -> Path:
    """The temp dir to give Ray for ``folder``: ``folder`` itself where Ray's socket paths under it fit
    (:data:`SOCKET_PATH_MAX`), otherwise a short link to it, ``<link_parent>/rbray-<uid>/<hash of folder>``.

    Through the link Ray's sockets get short paths, while its sessions, logs and spilled objects stay in ``folder``,
    where the user put them (a larger disk than ``/tmp``, say). Checked before Ray starts: a Ray that cannot bind its
    sockets fails only after seconds, with the reason deep in its logs.

    :param folder: where Ray is to keep its sessions.
    :param setting: the environment variable ``folder`` comes from, named if it is too long.
    :param link_parent: where the link's folder goes.
    :return: the path to give Ray as its temp dir.
    :raises ConfigError: ``folder`` is too long for Ray's sockets and no short link to it could be made.
    """
    folder = Path(os.path.abspath(folder))
    if _longest_socket(folder) <= SOCKET_PATH_MAX:
        return folder
    link = link_parent / f"rbray-{os.getuid()}" / hashlib.sha256(str(folder).encode()).hexdigest()[:8]
    try:
        private_dir(link.parent)  # ours alone: nobody else can swap the link
        folder.mkdir(parents=True, exist_ok=True)  # Ray's makedirs fails on a link that leads nowhere
        _link(link, folder)
    except (OSError, RuntimeError) as e:
        raise _too_long(folder, setting, f"no short link to it could be made in {link.parent} ({e})") from e
    if _longest_socket(link) > SOCKET_PATH_MAX:
        raise _too_long(folder, setting, f"a link to it in {link.parent} would be too long as well")
    return link


def _longest_socket(temp_dir: Path) -> int:
    return len(os.fsencode(temp_dir)) + RAY_SOCKET_SUFFIX_MAX


def _link(link: Path, target: Path) -> None:
    """Point ``link`` at ``target``; replaced atomically, as tasks starting together may make it at once."""
    with contextlib.suppress(OSError):
        if os.readlink(link) == str(target):
            return
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _too_long(folder: Path, setting: str, why: str) -> Exception:
    from airflow_provider_raybatch.pipeline.errors import ConfigError

    longest = _longest_socket(folder)
    return ConfigError(
        f"{setting} is too long for Ray: its socket paths under {folder} would be up to {longest} bytes, over the "
        f"limit of {SOCKET_PATH_MAX} for a Unix socket path, and {why}. Shorten {setting} by at least "
        f"{longest - SOCKET_PATH_MAX} characters."
    )
