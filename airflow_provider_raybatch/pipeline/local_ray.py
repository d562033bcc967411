"""A warm local Ray shared by the embedded tasks of one host, stopped when idle.

Starting a local Ray costs ~5 s and stopping it ~1.7 s, and two tasks on one host that each
start one both claim every CPU and GPU. In ``shared`` mode (the default) the first embedded task
of a host starts a head that outlives it, and later tasks connect to it as drivers of their own
Ray job in well under a second. Everything lives in one folder per user, Ray version and Python
environment (:func:`head_dir`)::

    lock              flock: deciding to start, replace, join or stop the head is serialised
    head.json         the running head: address, versions, monitor and head pids
    token             the head's auth token (0600; Ray's token auth)
    clients/<id>.lock held with flock by each task while it is connected; <id>.env its environment
    monitor.log, head.log
    r/                Ray's temp dir (session_*)

The head is ``ray start --head --block`` run by a small stdlib-only **monitor** (this file run
as a script, detached from the task). The monitor stops the head once no client lock has been
held for the idle timeout, and clears the record if the head dies. Idleness is read from the
client locks, not from Ray: the kernel releases a SIGKILLed task's lock, the check needs no
dashboard (Ray's state API does) and no private GCS client, and the monitor is no Ray driver
that would keep the head busy itself.

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
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__:
    from airflow_provider_raybatch.pipeline import reaper as _reaper
else:  # run as the monitor script (``python -I -S local_ray.py``): the reaper is beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import reaper as _reaper  # type: ignore[no-redef]

log = logging.getLogger(__name__)

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

#: Set in the head's environment (so in every process of the head): how leftovers are found.
HEAD_MARK_ENV = "RAYBATCH_SHARED_RAY"
#: In a job's runtime_env: the file holding the task's environment, for :func:`apply_job_environment`.
JOB_ENV_FILE_ENV = "RAYBATCH_JOB_ENV"
SETUP_HOOK = "airflow_provider_raybatch.pipeline.local_ray.apply_job_environment"

RECORD_FORMAT = 1
_START_TIMEOUT_S = 150.0  # per attempt: a 2-core machine under a load of 30 took 47 s
_START_ATTEMPTS = 3
_LOCK_TIMEOUT_S = _START_ATTEMPTS * _START_TIMEOUT_S + 60
_STOP_GRACE_S = 15.0
_READY_LINE = "Ray runtime started"

# Variables a worker reads when it starts: set in the job's runtime_env (none is a secret).
_AT_START = re.compile(r"^(PATH|LD_[A-Z_]+|PYTHON[A-Z_]*)$")
# Variables Ray sets per process (device visibility, its own settings), or the shell's.
_RAY_OWNED = re.compile(r"^(RAY_.*|__RAY.*|.*_VISIBLE_DEVICES|.*_VISIBLE_CORES|PWD|OLDPWD|SHLVL|_)$")
# The head's own environment: host-level settings only, not a task's (its secrets, its context).
_HEAD_ENV = re.compile(r"^(PATH|HOME|USER|LOGNAME|SHELL|LANG|LANGUAGE|LC_[A-Z]+|TZ|TMPDIR|RAY_.*|.*_VISIBLE_DEVICES)$")


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


def _ray_version() -> str:
    """Ray's version without importing Ray (the task imports it only to connect)."""
    from importlib.metadata import version

    return version("ray")


def _python_key() -> str:
    # Not resolved: two virtual environments share one interpreter binary but not their packages.
    return f"{sys.executable}|{sys.prefix}"


def head_dir(settings: LocalRaySettings, ray_version: str | None = None) -> Path:
    """The shared Ray's folder: per user, per Ray version and Python environment.

    Short on purpose: Ray's socket paths under it are limited to ~107 characters. Another Ray
    version or environment gets another folder and head; a head nobody uses stops when idle.
    """
    base = settings.base_dir or os.environ.get("RAY_TMPDIR") or "/tmp"
    ray_version = ray_version or _ray_version()
    digest = hashlib.sha256(_python_key().encode()).hexdigest()[:6]
    return Path(base) / f"rbray-{os.getuid()}" / f"{ray_version}-{digest}"


def _private_dir(path: Path) -> None:
    """Create ``path`` (0700) or check an existing one is ours and private (another user's, or a
    link planted in a shared /tmp, would hand our processes and token to them)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or info.st_uid != os.getuid():
        raise RuntimeError(f"{path} is not a folder owned by this user: refusing to use it for the shared Ray")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)


# --- processes -----------------------------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), to tell it from a later one with its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def _alive(pid: int | None, start_time: str | None) -> bool:
    return bool(pid) and _start_time(pid) is not None and _start_time(pid) == start_time


def _answers(address: str, timeout_s: float = 2.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def head_processes(root: Path) -> list[int]:
    """The processes of the head in ``root``, not the tasks connected to it.

    Marked by :data:`HEAD_MARK_ENV` in their environment (every process the head starts inherits
    it), or, where Ray's renaming of a worker overwrote that, by a log they write under ``r/``.
    A connected task writes a driver log there too, but holds its client lock: it is left alone.
    """
    mark = f"{HEAD_MARK_ENV}={root}\0".encode()
    found = set(_reaper.processes_writing(re.compile("^" + re.escape(f"{root}/r/"))))
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if mark in Path(f"/proc/{entry.name}/environ").read_bytes():
                    found.add(int(entry.name))
    return sorted(pid for pid in found if not _holds_client_lock(pid, root))


def _holds_client_lock(pid: int, root: Path) -> bool:
    prefix = f"{root}/clients/"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                return True
    return False


def _kill_head(root: Path, record: Mapping[str, Any] | None) -> None:
    """Stop the head: SIGTERM to ``ray start --block`` (it stops its daemons), then SIGKILL to
    its process group and to every process of the head still there."""
    head_pid = record.get("head_pid") if record else None
    if head_pid and _alive(head_pid, record.get("head_start")):
        with contextlib.suppress(OSError):
            os.kill(head_pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        while _alive(head_pid, record.get("head_start")) and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(OSError):
            os.killpg(head_pid, signal.SIGKILL)
    quiet, deadline = 0, time.monotonic() + _STOP_GRACE_S
    while quiet < 3 and time.monotonic() < deadline:
        pids = head_processes(root)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        quiet = 0 if pids else quiet + 1
        time.sleep(0.2)


# --- the folder: lock, record, clients -----------------------------------------------------------


@contextlib.contextmanager
def _locked(root: Path, timeout_s: float = _LOCK_TIMEOUT_S) -> Iterator[None]:
    # Read-only: a process holding a writable file under the folder would look like the head's.
    fd = os.open(root / "lock", os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"waited {timeout_s:.0f} s for the shared Ray's lock {root / 'lock'}") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def read_record(root: Path) -> dict[str, Any] | None:
    try:
        return json.loads((root / "head.json").read_text())
    except (OSError, ValueError):
        return None


def _write_record(root: Path, record: Mapping[str, Any]) -> None:
    tmp = root / f"head.json.{os.getpid()}"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, root / "head.json")


def _remove_record(root: Path, monitor_pid: int | None = None) -> None:
    """Remove the record (only if it is still the one of ``monitor_pid``, when given)."""
    record = read_record(root)
    if record is not None and (monitor_pid is None or record.get("monitor_pid") == monitor_pid):
        with contextlib.suppress(FileNotFoundError):
            (root / "head.json").unlink()


def live_clients(root: Path) -> int:
    """Client locks held by a live task; a released one (its task ended or was killed) is removed."""
    folder = root / "clients"
    count = 0
    for path in folder.glob("*.lock"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            count += 1
            continue
        finally:
            os.close(fd)
        for leftover in (path, path.with_suffix(".env")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    return count


# Client locks of this process: a child forked (not exec'd) from the task would hold them too.
_client_fds: set[int] = set()


def _close_client_fds_in_child() -> None:
    for fd in _client_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    _client_fds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_client_fds_in_child)


class SharedRayClient:
    """A task's registration with the shared head: a held lock, and its environment for its workers."""

    def __init__(self, root: Path, record: dict[str, Any]) -> None:
        self.root, self.record = root, record
        self.id = f"{os.getpid()}-{secrets.token_hex(4)}"
        folder = root / "clients"
        _private_dir(folder)
        self.lock_path, self.env_path = folder / f"{self.id}.lock", folder / f"{self.id}.env"
        env = {k: v for k, v in os.environ.items() if not _RAY_OWNED.match(k)}
        fd = os.open(self.env_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(env, f)
        # Locked before it gets its name: the monitor never sees an unlocked client file.
        tmp = folder / f".{self.id}"
        self._fd: int | None = os.open(tmp, os.O_RDONLY | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        os.replace(tmp, self.lock_path)
        _client_fds.add(self._fd)

    @property
    def address(self) -> str:
        return self.record["address"]

    def runtime_env(self, python_path: str) -> dict[str, Any]:
        """The job's runtime_env: what a worker reads at start, and where the rest of the task's environment is."""
        env_vars = {k: v for k, v in os.environ.items() if _AT_START.match(k)}
        env_vars.update({"PYTHONPATH": python_path, JOB_ENV_FILE_ENV: str(self.env_path)})
        return {"env_vars": env_vars, "worker_process_setup_hook": SETUP_HOOK}

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        for path in (self.env_path, self.lock_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        _client_fds.discard(fd)
        os.close(fd)


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


# --- the task's side -----------------------------------------------------------------------------


def _stale_reason(record: Mapping[str, Any], ray_version: str) -> str | None:
    if record.get("format") != RECORD_FORMAT or record.get("ray_version") != ray_version:
        return f"it runs Ray {record.get('ray_version')}, this task {ray_version}"
    if record.get("python") != _python_key():
        return f"it runs Python {record.get('python')!r}"
    if not _alive(record.get("monitor_pid"), record.get("monitor_start")):
        return "its monitor is gone"
    if not _alive(record.get("head_pid"), record.get("head_start")):
        return "its head process is gone"
    if not _answers(record.get("address", "")):
        return f"nothing answers at {record.get('address')}"
    return None


def join_shared_head(settings: LocalRaySettings) -> SharedRayClient:
    """Register with the host's shared head, starting it (or replacing a stale one) first."""
    ray_version = _ray_version()
    root = head_dir(settings, ray_version)
    _private_dir(root)
    with _locked(root):
        record = read_record(root)
        if record is not None:
            reason = _stale_reason(record, ray_version)
            if reason is not None:
                log.warning("Replacing the shared local Ray in %s: %s", root, reason)
                _kill_head(root, record)
                with contextlib.suppress(OSError):
                    os.kill(record["monitor_pid"], signal.SIGKILL)
                _remove_record(root)
                record = None
        if record is None:
            record = _start_head(root, settings, ray_version)
        return SharedRayClient(root, record)


def _start_head(root: Path, settings: LocalRaySettings, ray_version: str) -> dict[str, Any]:
    """Start the monitor (which starts the head) and wait for the head to be up. Under the lock."""
    log.info("Starting the shared local Ray in %s (stops after %g s idle)", root, settings.idle_timeout_s)
    live_clients(root)  # drops locks left by killed tasks of an earlier head
    token = root / "token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if _HEAD_ENV.match(k)}
    for task_only in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_TMPDIR"):  # the head gets its own folder and token
        env.pop(task_only, None)
    env.update(
        {
            HEAD_MARK_ENV: str(root),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_USAGE_STATS_ENABLED": "0",
            # `ray` must import in the head even when the task found it through PYTHONPATH.
            "PYTHONPATH": _ray_site(),
        }
    )
    nonce = secrets.token_hex(8)
    params = {
        "nonce": nonce,
        "ray_version": ray_version,
        "python": _python_key(),
        "idle_timeout_s": settings.idle_timeout_s,
        "num_cpus": settings.num_cpus,
        "num_gpus": settings.num_gpus,
    }
    # The script forks the monitor off and exits at once, printing the monitor's pid: the monitor
    # is nobody's child here (no zombie when it exits while the task runs) and outlives the task.
    starter = subprocess.run(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), str(root), json.dumps(params)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        start_new_session=True,  # a signal to the task's process group spares it
        cwd="/",
        timeout=60,
        check=False,
    )
    try:
        monitor_pid = int(starter.stdout.strip())
    except ValueError:
        raise RuntimeError(f"could not start the shared local Ray's monitor: {starter.stderr[-2000:]}") from None
    deadline = time.monotonic() + _START_ATTEMPTS * _START_TIMEOUT_S + 30
    while time.monotonic() < deadline:
        record = read_record(root)
        if record is not None and record.get("nonce") == nonce:
            if "error" not in record:
                return record
            _remove_record(root)
            break
        if _start_time(monitor_pid) is None:
            break
        time.sleep(0.05)
    else:
        with contextlib.suppress(OSError):
            os.kill(monitor_pid, signal.SIGKILL)
        _kill_head(root, None)
    tail = _tail(root / "head.log") or _tail(root / "monitor.log")
    raise RuntimeError(f"the shared local Ray did not start (logs in {root}):\n{tail}")


def _ray_site() -> str:
    import importlib.util

    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.origin:
        return ""
    return os.path.dirname(os.path.dirname(spec.origin))


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def use_head_token(client: SharedRayClient) -> dict[str, str | None]:
    """Make this process present the head's token (Ray reads its auth settings once, at import);
    return the variables it replaced, for :func:`restore_auth`."""
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")}
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(client.root / "token")
    _reload_ray_auth()
    return saved


def restore_auth(saved: Mapping[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _reload_ray_auth()


def _reload_ray_auth() -> None:
    # What ray.init itself does when it turns token auth on for a new local cluster.
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def stop_shared_heads(base_dir: str | os.PathLike[str]) -> list[Path]:
    """Stop every shared head under ``base_dir`` now, connected tasks or not (tests, operators
    cleaning a host). Returns the folders whose head was stopped."""
    stopped = []
    for root in sorted(Path(base_dir).glob(f"rbray-{os.getuid()}/*")):
        if not (root / "lock").exists():
            continue
        with _locked(root):
            record = read_record(root)
            if record and record.get("monitor_pid"):
                with contextlib.suppress(OSError):
                    if _alive(record["monitor_pid"], record.get("monitor_start")):
                        os.kill(record["monitor_pid"], signal.SIGKILL)
            _kill_head(root, record)
            _remove_record(root)
            if record is not None:
                stopped.append(root)
    return stopped


# --- the monitor (this file as a script) ---------------------------------------------------------


def _start_ray(root: Path, params: Mapping[str, Any]) -> tuple[subprocess.Popen, int]:
    shutil.rmtree(root / "r", ignore_errors=True)  # sessions of stopped heads
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--block",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        "--include-dashboard=false",
        f"--temp-dir={root}/r",
        "--disable-usage-stats",
        # Every port with a fixed default gets a free one: two heads (another Ray version, a
        # test cluster) must not collide, as `ray start --block` ends the head if one daemon fails.
        f"--dashboard-port={_free_port()}",
        f"--ray-client-server-port={_free_port()}",
        f"--dashboard-agent-listen-port={_free_port()}",
        f"--dashboard-agent-grpc-port={_free_port()}",
        f"--metrics-export-port={_free_port()}",
        f"--runtime-env-agent-port={_free_port()}",
    ]
    if params.get("num_cpus") is not None:
        command.append(f"--num-cpus={params['num_cpus']}")
    if params.get("num_gpus") is not None:
        command.append(f"--num-gpus={params['num_gpus']}")
    with open(root / "head.log", "w") as head_log:
        head = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=head_log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return head, port


def _monitor(root: Path, params: dict[str, Any]) -> int:
    me = os.getpid()
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [monitor {me}] {message}", flush=True)

    for attempt in range(1, _START_ATTEMPTS + 1):
        head, port = _start_ray(root, params)
        say(f"started ray start --head (pid {head.pid}) on port {port}")
        while _READY_LINE not in _tail(root / "head.log", 200) and head.poll() is None:
            if time.monotonic() - started > attempt * _START_TIMEOUT_S:
                break
            time.sleep(0.05)
        if _READY_LINE in _tail(root / "head.log", 200) and head.poll() is None:
            break
        # Seen on an overloaded host: the raylet gives up waiting for its agents' ports.
        say(f"the head did not start (attempt {attempt}): {_tail(root / 'head.log', 1)}")
        _kill_head(root, {"head_pid": head.pid, "head_start": _start_time(head.pid)})
        with contextlib.suppress(OSError):
            os.replace(root / "head.log", root / f"head.{attempt}.log")
    else:
        _write_record(root, {"nonce": params["nonce"], "monitor_pid": me, "error": "the head did not start"})
        return 1
    idle_timeout = float(params["idle_timeout_s"])
    record = {
        "format": RECORD_FORMAT,
        "nonce": params["nonce"],
        "ray_version": params["ray_version"],
        "python": params["python"],
        "address": f"127.0.0.1:{port}",
        "monitor_pid": me,
        "monitor_start": _start_time(me),
        "head_pid": head.pid,
        "head_start": _start_time(head.pid),
        "idle_timeout_s": idle_timeout,
        "started_at": time.time(),
    }
    _write_record(root, record)
    say(f"head up in {time.monotonic() - started:.1f} s at {record['address']}")
    busy_at = time.monotonic()
    poll_s = min(1.0, idle_timeout / 4)
    while True:
        time.sleep(poll_s)
        if head.poll() is not None:
            say(f"the head exited ({head.returncode})")
            with _locked(root):
                _remove_record(root, me)
                _kill_head(root, None)
            return 1
        if live_clients(root):
            busy_at = time.monotonic()
            continue
        if time.monotonic() - busy_at < idle_timeout:
            continue
        with _locked(root):
            # Tasks register under this lock: once it is held, no task can join in between.
            if live_clients(root):
                busy_at = time.monotonic()
                continue
            say(f"idle for {idle_timeout:g} s: stopping the head")
            _remove_record(root, me)
            _kill_head(root, record)
        say("stopped")
        return 0


def _daemonize(root: Path) -> None:
    """Fork: the parent prints the child's pid and exits; the child logs to ``monitor.log``."""
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        os._exit(0)
    fd = os.open(root / "monitor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)


if __name__ == "__main__":
    _daemonize(Path(sys.argv[1]))
    sys.exit(_monitor(Path(sys.argv[1]), json.loads(sys.argv[2])))
