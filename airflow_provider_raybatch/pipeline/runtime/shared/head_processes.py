"""The head's processes: telling them from the tasks connected to it, checking they live, stopping them."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_provider_raybatch.pipeline.runtime.reaper import processes_writing

#: Set in the head's environment (so in every process of the head): how leftovers are found.
HEAD_MARK_ENV = "RAYBATCH_SHARED_RAY"
_STOP_GRACE_S = 15.0


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), to tell it from a later one with its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def alive(pid: int | None, started: str | None) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` (see :func:`start_time`)."""
    return bool(pid) and start_time(pid) is not None and start_time(pid) == started


def answers(address: str, timeout_s: float = 2.0) -> bool:
    """Whether something accepts a TCP connection at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def head_processes(root: Path) -> list[int]:
    """The processes of the head in ``root``, not the tasks connected to it.

    Marked by :data:`HEAD_MARK_ENV` in their environment (every process the head starts inherits
    it), or, where Ray's renaming of a worker overwrote that, by a log they write under ``r/``.
    A task writes a driver log there too: it is left alone, connected (it holds its client lock)
    or not (Ray keeps the log open after the task disconnects, and the process may live on:
    ``airflow dags test`` going on to its next task, a notebook).
    """
    mark = f"{HEAD_MARK_ENV}={root}\0".encode()
    found = set(processes_writing(re.compile("^" + re.escape(f"{root}/r/"))))
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if mark in Path(f"/proc/{entry.name}/environ").read_bytes():
                    found.add(int(entry.name))
    return sorted(pid for pid in found if not _is_task(pid, root))


def _is_task(pid: int, root: Path) -> bool:
    """Whether ``pid`` holds a client lock of the head in ``root`` or writes a Ray driver's log."""
    clients = f"{root}/clients/"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            path = os.readlink(f"/proc/{pid}/fd/{fd}")
            if path.startswith(clients) or "/logs/python-core-driver-" in path:
                return True
    return False


def kill_head(root: Path, record: Mapping[str, Any] | None) -> None:
    """Stop the head: SIGTERM to ``ray start --block`` (it stops its daemons), then SIGKILL to
    its process group and to every process of the head still there."""
    head_pid = record.get("head_pid") if record else None
    if head_pid and alive(head_pid, record.get("head_start")):
        with contextlib.suppress(OSError):
            os.kill(head_pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        while alive(head_pid, record.get("head_start")) and time.monotonic() < deadline:
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
