"""The driver's stderr, line by line, at the level of what each line says: Ray's known-harmless line as INFO.

An Airflow task's stderr reaches its log as ERROR lines (Airflow's task supervisor reads it so),
its stdout as INFO lines. Ray's C++ core worker in the driver copies its ERROR lines to file
descriptor 2, and on every run one of them warns that a replica's constructor arguments are in the
object store while it may be restarted (ray-project/ray#53727): Ray Data starts every replica of a
stage that way (its data context and the stage's function travel as object references, and
``max_restarts`` is -1, which the replicas' restarts after a node's loss need), and keeps those
objects for as long as the stage runs, so for this pipeline the warning is moot. The provider
could only make it go away by turning those restarts off, and Ray's only switch,
``RAY_BACKEND_LOG_LEVEL``, would silence every error of the core worker with it.

While :func:`ray_stderr_at_level` is entered, file descriptor 2 is a pipe read by a small process
of its own (this file, run as a script): a line in :data:`HARMLESS_RAY_LINES` goes on to stdout,
every other line, byte for byte and in order, to the stderr it replaced. That process is no thread
of the driver's: nothing waits for it at the driver's exit, and when the driver crashes or is
killed, it still reads what was written before (a crash's last words) to the end and passes it on.
It runs in a session of its own and ignores SIGINT and SIGTERM, so that a signal to the driver's
process group does not end it before the driver's last lines are passed on; it ends when the pipe
is closed by every process that held it.

Only standard-library imports here: the sorting process starts with ``python -I -S`` on this file.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress

#: Lines that Ray writes on the driver's stderr although nothing is wrong: what each matches goes to
#: stdout (INFO in an Airflow task's log). Only Ray Data's replicas ("MapWorker(...)") are named:
#: another actor with constructor arguments in the object store may well lose them.
HARMLESS_RAY_LINES = (
    re.compile(
        rb"core_worker\.cc:\d+: Actor (\S+ )?with class name: 'MapWorker\(.*' and ID: '\w+' has constructor"
        rb" arguments in the object store and max_restarts > 0\."
    ),
)
#: How long leaving :func:`ray_stderr_at_level` waits for the sorting process to pass the last
#: lines on: it ends as soon as it has, unless a process started meanwhile still holds the pipe.
SORTER_EXIT_WAIT_S = 5.0


@contextmanager
def ray_stderr_at_level() -> Iterator[None]:
    """While entered, what this process writes on file descriptor 2 is passed on line by line at its level.

    Ray's known-harmless lines (:data:`HARMLESS_RAY_LINES`) go to stdout, all else to the stderr
    that was there before, unchanged and in order. Leaving restores that stderr. Where no process
    can be started for it (no Python executable known, no file descriptor 2), stderr is left as it is.
    """
    sys.stderr.flush()
    try:
        stderr = os.dup(2)
    except OSError:
        yield  # no stderr to sort
        return
    read, write = os.pipe()
    try:
        sorter = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__],
            stdin=read,
            stderr=stderr,
            start_new_session=True,  # not stopped by a signal to the driver's process group
        )
    except OSError:
        for fd in (read, write, stderr):
            os.close(fd)
        yield  # stderr stays as it is
        return
    os.close(read)
    os.dup2(write, 2)
    os.close(write)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(stderr, 2)  # the pipe's last writer here closes: the sorter passes the rest on and ends
        os.close(stderr)
        with suppress(subprocess.TimeoutExpired):
            sorter.wait(timeout=SORTER_EXIT_WAIT_S)


def sort_lines(source: int, stdout: int, stderr: int) -> None:
    """Pass each line read from ``source`` on to ``stdout`` if it is a known-harmless Ray line, else to ``stderr``.

    :param source: the file descriptor read to its end; a last line without a newline is passed on too.
    :param stdout: where :data:`HARMLESS_RAY_LINES` go.
    :param stderr: where every other line goes, unchanged.
    """
    with open(source, "rb", closefd=False) as lines:
        for line in lines:
            target = stdout if any(known.search(line) for known in HARMLESS_RAY_LINES) else stderr
            with suppress(OSError):  # a closed target: the rest is still read, so that no writer blocks
                _write_all(target, line)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main() -> None:
    """The sorting process: stdin is the driver's former file descriptor 2, read until every writer closed it."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe's end ends it: the driver's last lines first
    sort_lines(0, 1, 2)


if __name__ == "__main__":
    main()
