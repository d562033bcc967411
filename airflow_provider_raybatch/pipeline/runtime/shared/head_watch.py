"""A task using the shared head learns within seconds that it died, and fails retryably, saying how.

Ray alone notices late: with its GCS gone, every call of the driver to it (Ray Data's scheduling loop, an actor's
lookup, a key-value read) retries for 60 s, logging a failed push for each of the task's tasks, and then Ray ends the
process, saying nothing of the head. So while a task uses the head, a thread of the task looks at the head's process
every half second, by the pid and start time its record gives (:func:`.head_processes.alive`): a read of ``/proc``
that needs nothing of Ray, nor of the monitor, which may have been killed with the head. The head's process is the
one to watch: ``ray start --block`` ends the other daemons and exits when one of them dies, and if it is killed
itself its monitor ends the rest.

Once the head is gone the thread waits briefly for the monitor's note of how it exited (only its parent can learn
that: :func:`.folder.record_exit`), logs the error and raises it in the task's thread. A thread running Python code
leaves the run with it, and Ray disconnects (in ~5 s without a GCS). A thread waiting inside Ray (a stream's
consumer waits on Ray Data's queue, which its stuck scheduling loop never fills, and Ray Data's own clean-up calls
the GCS again) cannot leave before Ray ends the process: after :data:`GRACE_S` the thread ends the process itself,
with :data:`EXIT_CODE`, as Ray would after its timeout. Either way the try fails and the committed ranges stay; the
retry, a new process, starts a new head and resumes after them.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

from airflow_provider_raybatch.pipeline.errors import LocalRayDiedError
from airflow_provider_raybatch.pipeline.runtime.async_raise import raise_in
from airflow_provider_raybatch.pipeline.runtime.shared.client import SharedRayClient
from airflow_provider_raybatch.pipeline.runtime.shared.folder import read_exit

log = logging.getLogger(__name__)

#: Seconds between two looks at the head's process.
POLL_S = 0.5
#: Seconds to wait for the monitor's note once the head is gone: the monitor looks every second.
NOTE_WAIT_S = 3.0
#: Seconds the task's thread gets to leave the run (and Ray's shutdown, ~5 s without a GCS) before the process ends.
GRACE_S = 10.0
#: The exit status of a process ended for a dead head: ``EX_TEMPFAIL``, a failure that a retry may not meet.
EXIT_CODE = 75
# What `ray start --block` logs for each of its daemons that died before it ended the others.
_DAEMON_EXIT = re.compile(r"(\w+) \[exit code=(-?\d+)\]")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


class _HeadDied(BaseException):
    """Raised asynchronously in the task's thread; LocalRayDiedError on the way out of the watch.

    A BaseException, as KeyboardInterrupt is, so that no ``except Exception`` on the way swallows it.
    """


class HeadWatch:
    """``with HeadWatch(client):`` around a task's use of the shared head, Ray's shutdown included: the block fails
    with :class:`.LocalRayDiedError` within seconds of the head's death, or the process ends (see the module).

    :param client: the task's registration with the head.
    :param poll_s: seconds between two looks at the head's process.
    """

    def __init__(self, client: SharedRayClient, poll_s: float = POLL_S) -> None:
        self.client, self.root, self.record, self.poll_s = client, client.root, client.record, poll_s
        self.death: str | None = None  # how the head died, once seen
        self._lock = threading.Lock()
        self._left = threading.Event()  # the task's thread has left the watched block
        self._raised = False
        self._thread: threading.Thread | None = None
        self._task_thread = threading.get_ident()

    def __enter__(self) -> HeadWatch:
        self._task_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="raybatch-head-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            with self._lock:
                self._left.set()
                if self._raised and exc_type is not _HeadDied:
                    raise_in(self._task_thread, None)  # left the block before the raise took effect: withdraw it
        except _HeadDied:  # it took effect just now, on the way out
            exc_type = _HeadDied
        if self._thread is not None:
            self._thread.join()
        if self.death is None and exc_type is not None and not self.client.head_alive():
            self.death = self._describe()  # the run failed on its own as the head died: that is why
        if self.death is None:
            return
        # Also when the block ended without an error: what ran on the dead head cannot be trusted to be complete.
        raise LocalRayDiedError(self.death) from (None if exc_type in (None, _HeadDied) else exc)

    def _watch(self) -> None:
        while not self._left.wait(self.poll_s):
            if self.client.head_alive():
                continue
            death = self._describe()
            with self._lock:
                if self._left.is_set():
                    return
                self.death = death
                log.error("%s: %s", LocalRayDiedError.__name__, death)
                self._raised = True
                raise_in(self._task_thread, _HeadDied)
            if not self._left.wait(GRACE_S):
                _end_process()
            return

    def _describe(self) -> str:
        """What killed the head, from the monitor's note (waited for briefly) and the head's log."""
        deadline = time.monotonic() + NOTE_WAIT_S
        while (note := read_exit(self.root, self.record)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        head = f"the shared local Ray this task ran on ({self.record.get('address')}, in {self.root}) has died"
        if note is None:
            how = (
                f"its head process (ray start, pid {self.record.get('head_pid')}) is gone, and its monitor noted no "
                f"exit (killed too?); logs in {self.root}"
            )
        else:
            how = f"its head process (ray start, pid {note['head_pid']}) {exit_status(note['returncode'])}"
            daemons = [f"its {name} {exit_status(int(code))}" for name, code in _daemon_exits(Path(note["log"]))]
            how = "; ".join([how, *daemons]) + f". Its log: {note['log']}"
        return (
            f"{head}: {how}. Ray's processes of this run went with it; the committed ranges stay, and a retry starts "
            "a new head and resumes after them"
        )


def _end_process() -> None:
    log.error(
        "The run is still inside Ray %g s after the shared local Ray died (Ray would end this process once its GCS "
        "timeout of 60 s has passed): ending it now, exit status %d",
        GRACE_S,
        EXIT_CODE,
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_CODE)


def exit_status(returncode: int) -> str:
    """How a process exited, for a message: ``exited with code 1``, ``was killed by signal 9 (SIGKILL: ...)``."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"was killed by signal {number}"
    if number == signal.SIGKILL:
        name += ": e.g. the kernel's out-of-memory killer"
    return f"was killed by signal {number} ({name})"


def _daemon_exits(head_log: Path) -> list[tuple[str, str]]:
    """The head's daemons that died before ``ray start`` ended the others, with their exit codes, from its log."""
    try:
        text = _COLOUR.sub("", head_log.read_text(errors="replace"))
    except OSError:
        return []
    return list(dict.fromkeys(_DAEMON_EXIT.findall(text)))
