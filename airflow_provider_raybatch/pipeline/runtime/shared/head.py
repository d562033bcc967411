"""The task's side of the shared head: join it (starting or replacing it under the lock), or stop it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import airflow_provider_raybatch
from airflow_provider_raybatch.pipeline.runtime.shared.client import SharedRayClient
from airflow_provider_raybatch.pipeline.runtime.shared.folder import (
    RECORD_FORMAT,
    START_ATTEMPTS,
    START_TIMEOUT_S,
    drop_unused,
    live_clients,
    locked,
    private_dir,
    read_record,
    remove_record,
    tail,
)
from airflow_provider_raybatch.pipeline.runtime.shared.head_processes import (
    HEAD_MARK_ENV,
    alive,
    answers,
    kill_head,
    start_time,
)
from airflow_provider_raybatch.pipeline.runtime.shared.settings import (
    LOOPBACK_ENV,
    LocalRaySettings,
    dir_setting,
    head_dir,
    python_key,
    ray_temp_dir,
    ray_version,
)

log = logging.getLogger(__name__)

# The head's own environment: host-level settings only, not a task's (its secrets, its context).
_HEAD_ENV = re.compile(r"^(PATH|HOME|USER|LOGNAME|SHELL|LANG|LANGUAGE|LC_[A-Z]+|TZ|TMPDIR|RAY_.*|.*_VISIBLE_DEVICES)$")
# The monitor runs isolated (-I: no PYTHONPATH, no user site) with the provider's own folder first.
_MONITOR_BOOT = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from airflow_provider_raybatch.pipeline.runtime.shared.monitor import main; sys.exit(main(sys.argv[1:]))"
)


def _stale_reason(record: Mapping[str, Any], version: str) -> str | None:
    if record.get("format") != RECORD_FORMAT or record.get("ray_version") != version:
        return f"it runs Ray {record.get('ray_version')}, this task {version}"
    if record.get("python") != python_key():
        return f"it runs Python {record.get('python')!r}"
    if not alive(record.get("monitor_pid"), record.get("monitor_start")):
        return "its monitor is gone"
    if not alive(record.get("head_pid"), record.get("head_start")):
        return "its head process is gone"
    if not answers(record.get("address", "")):
        return f"nothing answers at {record.get('address')}"
    return None


def join_shared_head(settings: LocalRaySettings) -> SharedRayClient:
    """Register with the host's shared head, starting it (or replacing a stale one) first."""
    version = ray_version()
    root = head_dir(settings, version)
    private_dir(root)
    with locked(root):
        record = read_record(root)
        if record is not None:
            reason = _stale_reason(record, version)
            if reason is not None:
                log.warning("Replacing the shared local Ray in %s: %s", root, reason)
                kill_head(root, record)
                with contextlib.suppress(OSError):
                    os.kill(record["monitor_pid"], signal.SIGKILL)
                remove_record(root)
                record = None
        if record is None:
            record = _start_head(root, settings, version)
        return SharedRayClient(root, record)


def _start_head(root: Path, settings: LocalRaySettings, version: str) -> dict[str, Any]:
    """Start the monitor (which starts the head) and wait for the head to be up. Under the lock."""
    log.info("Starting the shared local Ray in %s (stops after %g s idle)", root, settings.idle_timeout_s)
    # Before anything starts: a folder too long for Ray's sockets is a setting to fix, not a start to retry.
    ray_dir = ray_temp_dir(root / "r", dir_setting(settings))
    live_clients(root)  # drops locks left by killed tasks of an earlier head
    drop_unused(root, head_gone=True)  # and what it kept for warm workers
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
            **LOOPBACK_ENV,  # every port of the head on 127.0.0.1, not on every interface
            # `ray` must import in the head even when the task found it through PYTHONPATH.
            "PYTHONPATH": _ray_site(),
        }
    )
    nonce = secrets.token_hex(8)
    params = {
        "nonce": nonce,
        "ray_version": version,
        "python": python_key(),
        "idle_timeout_s": settings.idle_timeout_s,
        "num_cpus": settings.num_cpus,
        "num_gpus": settings.num_gpus,
        "ray_temp_dir": str(ray_dir),
    }
    provider_parent = str(Path(airflow_provider_raybatch.__file__).resolve().parent.parent)
    # The monitor forks itself off and its first process exits at once, printing the monitor's
    # pid: the monitor is nobody's child here (no zombie when it exits while the task runs) and
    # outlives the task.
    starter = subprocess.run(
        [sys.executable, "-I", "-c", _MONITOR_BOOT, provider_parent, str(root), json.dumps(params)],
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
    deadline = time.monotonic() + START_ATTEMPTS * START_TIMEOUT_S + 30
    while time.monotonic() < deadline:
        record = read_record(root)
        if record is not None and record.get("nonce") == nonce:
            if "error" not in record:
                return record
            remove_record(root)
            break
        if start_time(monitor_pid) is None:
            break
        time.sleep(0.05)
    else:
        with contextlib.suppress(OSError):
            os.kill(monitor_pid, signal.SIGKILL)
        kill_head(root, None)
    # The last attempt's log holds the reason: the monitor's line quotes its last line, which is Ray's buffered
    # output printed after the traceback.
    head_log = tail(root / "head.log") or tail(root / f"head.{START_ATTEMPTS}.log")
    logs = "\n".join(part for part in (tail(root / "monitor.log", 6), head_log) if part)
    raise RuntimeError(f"the shared local Ray did not start (logs in {root}):\n{logs}")


def _ray_site() -> str:
    import importlib.util

    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.origin:
        return ""
    return os.path.dirname(os.path.dirname(spec.origin))


def stop_shared_heads(base_dir: str | os.PathLike[str]) -> list[Path]:
    """Stop every shared head under ``base_dir`` now, connected tasks or not (tests, operators
    cleaning a host). Returns the folders whose head was stopped."""
    stopped = []
    for root in sorted(Path(base_dir).glob(f"rbray-{os.getuid()}/*")):
        if not (root / "lock").exists():
            continue
        with locked(root):
            record = read_record(root)
            if record and record.get("monitor_pid"):
                with contextlib.suppress(OSError):
                    if alive(record["monitor_pid"], record.get("monitor_start")):
                        os.kill(record["monitor_pid"], signal.SIGKILL)
            kill_head(root, record)
            remove_record(root)
            drop_unused(root, head_gone=True)
            if record is not None:
                stopped.append(root)
    return stopped
