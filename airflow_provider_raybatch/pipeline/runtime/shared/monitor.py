"""The detached monitor: runs ``ray start --head --block`` and stops it once no task has been connected
for the idle timeout. Started by :func:`.head._start_head`; imports only the standard library and
the stdlib-only modules beside it, so it starts in milliseconds and holds no Ray."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_provider_raybatch.pipeline.runtime.shared.folder import (
    RECORD_FORMAT,
    START_ATTEMPTS,
    START_TIMEOUT_S,
    drop_unused,
    live_clients,
    locked,
    record_exit,
    remove_record,
    tail,
    write_record,
)
from airflow_provider_raybatch.pipeline.runtime.shared.head_processes import free_port, kill_head, start_time

_READY_LINE = "Ray runtime started"
#: `ray start` hands its workers and drivers ports from 10002 up, each head counting on its own: the second Ray
#: on a host gave its first worker 10002 too, and that process died binding it (a driver: the Airflow task).
#: 0 lets the kernel pick each one, as `ray.init()` does.
KERNEL_WORKER_PORTS = ("--min-worker-port=0", "--max-worker-port=0")


def _start_ray(root: Path, params: Mapping[str, Any]) -> tuple[subprocess.Popen, int]:
    shutil.rmtree(root / "r", ignore_errors=True)  # sessions of stopped heads
    # Ray may be given a short link to it (see settings.ray_temp_dir): the folder must exist for the link to lead there.
    (root / "r").mkdir(mode=0o700, exist_ok=True)
    port = free_port()
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
        f"--temp-dir={params.get('ray_temp_dir') or root / 'r'}",
        "--disable-usage-stats",
        # Every port with a fixed default gets a free one: two heads (another Ray version, a
        # test cluster) must not collide, as `ray start --block` ends the head if one daemon fails.
        f"--dashboard-port={free_port()}",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        *KERNEL_WORKER_PORTS,
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

    for attempt in range(1, START_ATTEMPTS + 1):
        head, port = _start_ray(root, params)
        say(f"started ray start --head (pid {head.pid}) on port {port}")
        while _READY_LINE not in tail(root / "head.log", 200) and head.poll() is None:
            if time.monotonic() - started > attempt * START_TIMEOUT_S:
                break
            time.sleep(0.05)
        if _READY_LINE in tail(root / "head.log", 200) and head.poll() is None:
            break
        # Seen on an overloaded host: the raylet gives up waiting for its agents' ports.
        say(f"the head did not start (attempt {attempt}): {tail(root / 'head.log', 1)}")
        kill_head(root, {"head_pid": head.pid, "head_start": start_time(head.pid)})
        with contextlib.suppress(OSError):
            os.replace(root / "head.log", root / f"head.{attempt}.log")
    else:
        write_record(root, {"nonce": params["nonce"], "monitor_pid": me, "error": "the head did not start"})
        return 1
    idle_timeout = float(params["idle_timeout_s"])
    record = {
        "format": RECORD_FORMAT,
        "nonce": params["nonce"],
        "ray_version": params["ray_version"],
        "python": params["python"],
        "address": f"127.0.0.1:{port}",
        "monitor_pid": me,
        "monitor_start": start_time(me),
        "head_pid": head.pid,
        "head_start": start_time(head.pid),
        "idle_timeout_s": idle_timeout,
        "started_at": time.time(),
    }
    write_record(root, record)
    say(f"head up in {time.monotonic() - started:.1f} s at {record['address']}")
    busy_at = time.monotonic()
    poll_s = min(1.0, idle_timeout / 4)
    while True:
        time.sleep(poll_s)
        if head.poll() is not None:
            say(f"the head exited ({head.returncode})")
            record_exit(root, record, head.returncode)  # first: tasks using the head wait for it to fail
            with locked(root):
                remove_record(root, me)
                kill_head(root, None)
                drop_unused(root, head_gone=True)
            return 1
        # A killed task's environment file goes within a second, unless its warm workers use it.
        with contextlib.suppress(TimeoutError), locked(root, timeout_s=0):
            drop_unused(root)
        if live_clients(root):
            busy_at = time.monotonic()
            continue
        if time.monotonic() - busy_at < idle_timeout:
            continue
        with locked(root):
            # Tasks register under this lock: once it is held, no task can join in between.
            if live_clients(root):
                busy_at = time.monotonic()
                continue
            say(f"idle for {idle_timeout:g} s: stopping the head")
            remove_record(root, me)
            kill_head(root, record)
            drop_unused(root, head_gone=True)
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


def main(argv: list[str]) -> int:
    """``ROOT PARAMS_JSON``: fork off, start the head, watch it."""
    root = Path(argv[0])
    _daemonize(root)
    return _monitor(root, json.loads(argv[1]))
