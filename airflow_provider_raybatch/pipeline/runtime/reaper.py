"""A watchdog that ends an embedded Ray's processes when the process that started it dies.

``ray.init()`` with no address starts the GCS, the raylet, the log monitor, the autoscaler
monitor and the dashboard head as children of the calling process, each with
``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so they die with it. The raylet's own children (the
dashboard agent, the runtime-env agent, the workers, and whatever a predictor starts) do not:
when the calling process is SIGKILLed (Airflow's kill escalation, a zombie task, the OOM
killer) no ``finally`` runs, and the two agents stay behind, orphaned, for a minute or for
good, sometimes busy on a core. Workers notice the raylet's death and exit; their own children
may not.

:func:`start_reaper` starts a small stdlib-only process that waits on a pipe from the calling
process. The calling process holds the only write end; if it ends without
:meth:`Reaper.disarm`, the kernel closes the pipe, the reaper reads end-of-file and SIGKILLs
every process that holds a file open for writing in a Ray session directory named after the
calling process (``session_<date>_<pid>``, Ray's naming for the sessions a process starts),
then exits. Every process of that Ray writes its logs there, and children inherit those
descriptors; a log shipper that only reads them is left alone, and so is a Ray cluster this
process merely connected to (its sessions are named after the process that started them).

Linux only (it reads ``/proc``); elsewhere :func:`start_reaper` returns ``None`` and nothing
changes. This file is also the reaper's script, run by path with ``python -I -S`` so that it
imports nothing beyond the standard library and starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

log = logging.getLogger(__name__)

# Descriptors a child forked (not exec'd) from the task must not keep: a reaper's write end
# (kept, it would keep the reaper waiting after the task dies), a shared Ray client's lock.
_closed_at_fork: set[int] = set()


def close_in_forked_children(fd: int) -> None:
    """Close ``fd`` in every child this process forks from now on."""
    _closed_at_fork.add(fd)


def forget(fd: int) -> None:
    """Stop closing ``fd`` in forked children (before closing it here)."""
    _closed_at_fork.discard(fd)


def _close_in_child() -> None:
    for fd in _closed_at_fork:
        with contextlib.suppress(OSError):
            os.close(fd)
    _closed_at_fork.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)

# After end-of-file: scan and kill until this many scans in a row find nothing (the raylet may
# be spawning a worker at the moment it dies), or until the deadline.
_QUIET_SCANS = 3
_SCAN_INTERVAL_S = 0.1
_REAP_DEADLINE_S = 10.0


class Reaper:
    """The calling process's handle on a running reaper process."""

    def __init__(self, process: subprocess.Popen, write_end: int) -> None:
        self.process = process
        self._write_end: int | None = write_end

    def disarm(self) -> None:
        """The session ended normally: the reaper exits without killing anything."""
        self._close(b"x")
        try:
            # Exits as soon as it reads the byte; waiting leaves no zombie behind.
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            log.debug("Ray reaper %s still running after disarm", self.process.pid)

    def fire(self) -> None:
        """Reap now, as if this process had died (after a failed start of Ray)."""
        self._close(b"")

    def _close(self, message: bytes) -> None:
        fd, self._write_end = self._write_end, None
        if fd is None:
            return
        forget(fd)
        try:
            if message:
                os.write(fd, message)
        finally:
            os.close(fd)


def start_reaper() -> Reaper | None:
    """Start a reaper for the Ray sessions this process starts; ``None`` where unavailable.

    Unavailable: not Linux (no ``/proc``), no known Python executable, or the process could not
    be started (logged; Ray still runs, without the guarantee).
    """
    if not sys.platform.startswith("linux") or not os.path.isdir("/proc/self/fd") or not sys.executable:
        return None
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: a signal to the task's process group (Ctrl-C, a group kill)
            # does not take it down before it has done its job.
            start_new_session=True,
            cwd="/",
        )
    except OSError as e:
        os.close(write_end)
        log.warning("Could not start the Ray reaper (%s): a killed task may leave Ray processes behind", e)
        return None
    finally:
        os.close(read_end)
    close_in_forked_children(write_end)
    return Reaper(process, write_end)


def session_processes(owner_pid: int) -> list[int]:
    """Processes writing into a Ray session directory started by process ``owner_pid``."""
    return processes_writing(re.compile(rf"/session_[^/]*_{owner_pid}/"), skip={owner_pid})


def processes_writing(marker: re.Pattern[str], skip: Iterable[int] = ()) -> list[int]:
    """Processes (other than this one and ``skip``) holding a file open for writing whose path matches ``marker``."""
    skip = {os.getpid(), *skip}
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) not in skip and _writes_under(entry.name, marker):
            found.append(int(entry.name))
    return found


def _writes_under(pid: str, marker: re.Pattern[str]) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, a zombie, or not ours to read
        return False
    for fd in fds:
        try:
            if not marker.search(os.readlink(f"/proc/{pid}/fd/{fd}")):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                flags = next(int(line.split()[1], 8) for line in info if line.startswith("flags:"))
        except (OSError, StopIteration, ValueError):
            continue
        if (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR):
            return True
    return False


def reap(owner_pid: int) -> list[int]:
    """SIGKILL the processes of the Ray sessions ``owner_pid`` started; return their pids."""
    killed: set[int] = set()
    deadline = time.monotonic() + _REAP_DEADLINE_S
    quiet = 0
    while quiet < _QUIET_SCANS and time.monotonic() < deadline:
        pids = session_processes(owner_pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        quiet = 0 if pids else quiet + 1
        time.sleep(_SCAN_INTERVAL_S)
    return sorted(killed)


def main(argv: list[str]) -> int:
    owner_pid = int(argv[1])
    if os.read(0, 1):  # a byte: the session ended normally
        os._exit(0)  # nothing to flush; the owner waits for this exit
    reap(owner_pid)  # end of file: the owner died, or asks for it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
