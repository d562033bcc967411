"""Processes: the memory of a process tree, the processes of a private Ray (found, and killed,
by its ``RAY_TMPDIR``), and the environment for runs on a shared local Ray of the benchmark's own.

Each measured run happens in its own child process (``benchmarks.support.runs``) with its own
Ray temp dir: a run can be killed for real, and the parent can sample the memory of the child's
whole process tree (the driver, Ray's daemons and its workers).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class TreeMemory:
    """Samples the memory of a process and all its descendants; keeps the peak of the sums.

    RSS counts a shared page (Ray's object store is shared memory) once per process that maps
    it; PSS divides it among them, so the PSS sum is the tree's real footprint. RSS is always
    sampled; PSS only when asked, as reading it is not free.
    """

    def __init__(self, pid: int, interval_s: float = 0.25, pss: bool = False):
        # Reading PSS (smaps_rollup) costs ~4 ms per process: on 2 cores, sampling a 15-process
        # tree 4 times a second would take a quarter of a core from the run being measured.
        self.pid, self.interval_s, self.pss = pid, interval_s if not pss else max(interval_s, 0.5), pss
        self.peak_rss = self.peak_pss = 0
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            rss = pss = count = 0
            try:
                processes = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for process in processes:
                try:
                    info = process.memory_full_info() if self.pss else process.memory_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                rss += info.rss
                pss += getattr(info, "pss", 0)
                count += 1
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self.peak_processes = max(self.peak_processes, count)
            self._stop.wait(self.interval_s)


def ray_processes_of(ray_tmp: str) -> list[int]:
    """The live processes of a Ray started with ``RAY_TMPDIR=ray_tmp``, and only those.

    The raylet and GCS name the directory in their command lines; Ray's agents and workers
    rename themselves (``ray::DashboardAgent``...), so they are found by their environment, read
    as raw bytes (the renaming garbles what psutil parses), or, where the renaming overwrote
    that too, by a file they hold open under the directory (their logs).
    """
    in_environ, in_cmdline = f"RAY_TMPDIR={ray_tmp}\0".encode(), ray_tmp.encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in (os.getpid(), os.getppid()):
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # dead, waiting for its parent to collect it
            if (
                in_environ in (proc / "environ").read_bytes()
                or in_cmdline in (proc / "cmdline").read_bytes()
                or any(_opens_under(fd, ray_tmp) for fd in (proc / "fd").iterdir())
            ):
                found.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def _opens_under(fd: Path, directory: str) -> bool:
    try:
        return os.readlink(fd).startswith(directory + "/")
    except OSError:
        return False


def kill_ray_leftovers(ray_tmp: str) -> list[int]:
    """SIGKILL the processes of a Ray started with ``RAY_TMPDIR=ray_tmp``; return their pids.

    A safety net for tests and benchmarks that kill a driver: ``ray_session``'s reaper already
    ends such a Ray within seconds (see ``airflow_provider_raybatch.pipeline.runtime.reaper``).
    """
    killed = []
    for pid in ray_processes_of(ray_tmp):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            continue
    return killed


@contextmanager
def shared_ray_env() -> Iterator[dict[str, str]]:
    """The environment for runs on a shared local Ray of the benchmark's own: its folder (short:
    Ray's socket paths are length-limited) is removed and its head stopped at the end."""
    from airflow_provider_raybatch.pipeline.runtime.shared.head import stop_shared_heads

    base = tempfile.mkdtemp(prefix="rbw", dir="/tmp")
    try:
        # One Airflow home for the runs, as on one Airflow worker: their tasks' environments are
        # then equal, and each finds the warm workers the one before left (README, warm workers).
        yield {"RAYBATCH_LOCAL_RAY": "shared", "RAYBATCH_LOCAL_RAY_DIR": base, "AIRFLOW_HOME": f"{base}/airflow"}
    finally:
        stop_shared_heads(base)
        shutil.rmtree(base, ignore_errors=True)
