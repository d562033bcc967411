"""Crash points for tests of the commit protocol; inert unless RAYBATCH_TEST_CRASH is set.

``RAYBATCH_TEST_CRASH="<point>:<n>"`` kills the current process with SIGKILL the n-th time it
reaches ``point`` (``published``: a range's file is in place but not yet committed;
``committed``: right after a commit record is written).

``RAYBATCH_TEST_CRASH_ONCE=<file>`` arms the crash with a file: it fires only while the file
exists and removes it as it fires, so an Airflow retry of the killed task runs through. The
end-to-end test sets both for the scheduler's task processes and creates the file when it wants
the next task to crash.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

CRASH_ENV = "RAYBATCH_TEST_CRASH"
CRASH_ONCE_ENV = "RAYBATCH_TEST_CRASH_ONCE"
_reached: Counter[str] = Counter()


def crash_point(point: str) -> None:
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    name, _, count = spec.partition(":")
    if name != point:
        return
    _reached[point] += 1
    if _reached[point] == int(count or 1):
        once = os.environ.get(CRASH_ONCE_ENV)
        if once:
            try:
                os.remove(once)
            except FileNotFoundError:
                return  # not armed, or already fired
        os.kill(os.getpid(), signal.SIGKILL)
