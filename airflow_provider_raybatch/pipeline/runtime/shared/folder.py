"""The shared Ray's folder: its lock, the head's record, the connected tasks' client locks and shares,
their environments and the warm workers they left."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

RECORD_FORMAT = 1
START_TIMEOUT_S = 150.0  # per attempt: a 2-core machine under a load of 30 took 47 s
START_ATTEMPTS = 3
_LOCK_TIMEOUT_S = START_ATTEMPTS * START_TIMEOUT_S + 60


def private_dir(path: Path) -> None:
    """Create ``path`` (0700) or check an existing one is ours and private (another user's, or a
    link planted in a shared /tmp, would hand our processes and token to them)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or info.st_uid != os.getuid():
        raise RuntimeError(f"{path} is not a folder owned by this user: refusing to use it for the shared Ray")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)


@contextlib.contextmanager
def locked(root: Path, timeout_s: float = _LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the folder's lock: starting, replacing, joining and stopping the head are serialised."""
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
    """The running head's record (``head.json``), or None."""
    try:
        return json.loads((root / "head.json").read_text())
    except (OSError, ValueError):
        return None


def write_record(root: Path, record: Mapping[str, Any]) -> None:
    tmp = root / f"head.json.{os.getpid()}"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, root / "head.json")


def remove_record(root: Path, monitor_pid: int | None = None) -> None:
    """Remove the record (only if it is still the one of ``monitor_pid``, when given)."""
    record = read_record(root)
    if record is not None and (monitor_pid is None or record.get("monitor_pid") == monitor_pid):
        with contextlib.suppress(FileNotFoundError):
            (root / "head.json").unlink()


def record_exit(root: Path, record: Mapping[str, Any], returncode: int) -> None:
    """The monitor's note that the head exited on its own (killed, crashed): ``head.exit.json``, with the head's log
    kept as ``head.exited.log`` (the next head's start would overwrite ``head.log``). For the tasks that were using
    the head (:mod:`.head_watch`): only the monitor, its parent, learns how it exited."""
    kept = root / "head.exited.log"
    with contextlib.suppress(OSError):
        os.replace(root / "head.log", kept)
    note = {"head_pid": record["head_pid"], "head_start": record["head_start"], "returncode": returncode}
    tmp = root / f"head.exit.json.{os.getpid()}"
    tmp.write_text(json.dumps({**note, "log": str(kept), "at": time.time()}))
    os.replace(tmp, root / "head.exit.json")


def read_exit(root: Path, record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The monitor's note of how the head of ``record`` exited (see :func:`record_exit`), or None (not yet, or
    another head's)."""
    try:
        note = json.loads((root / "head.exit.json").read_text())
    except (OSError, ValueError):
        return None
    same = (note.get("head_pid"), note.get("head_start")) == (record.get("head_pid"), record.get("head_start"))
    return note if same else None


def _held(path: Path) -> bool:
    """Whether a client lock is held by a live task."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def live_clients(root: Path) -> int:
    """Client locks held by a live task; a released one (its task ended or was killed) is removed
    with its task's files."""
    count = 0
    for path in (root / "clients").glob("*.lock"):
        if _held(path):
            count += 1
            continue
        for leftover in (path, path.with_suffix(".uses"), path.with_suffix(".share")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    return count


def shares_held(root: Path, exclude: str) -> dict[str, dict[str, float]]:
    """What each connected task other than ``exclude`` took, by client id (``clients/<id>.share``,
    counted while the task's client lock is held)."""
    shares = {}
    for path in (root / "clients").glob("*.share"):
        if path.stem == exclude or not _held(path.with_suffix(".lock")):
            continue
        with contextlib.suppress(OSError, ValueError):
            shares[path.stem] = json.loads(path.read_text())
    return shares


def write_env(root: Path, env: Mapping[str, str]) -> Path:
    """``envs/<hash>.env`` (0600) holding ``env``, named by its content: tasks with one environment
    share one file, and so one ``runtime_env`` and its warm workers. Under the folder's lock."""
    data = json.dumps(dict(env), sort_keys=True)
    folder = root / "envs"
    private_dir(folder)
    path = folder / f"{hashlib.sha256(data.encode()).hexdigest()[:16]}.env"
    if not path.exists():
        tmp = folder / f".{os.getpid()}.tmp"
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(data)
        os.replace(tmp, path)
    return path


def read_warm(root: Path) -> dict[str, dict[str, Any]]:
    """The warm workers left for each runtime_env (``warm/<key>.json``) whose keep-alive still runs."""
    warm = {}
    for path in (root / "warm").glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text())
            if record["workers"] > 0 and record["until"] > time.time():
                warm[path.stem] = record
    return warm


def write_warm(root: Path, key: str, record: Mapping[str, Any]) -> None:
    private_dir(root / "warm")
    tmp = root / "warm" / f".{key}.{os.getpid()}"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, root / "warm" / f"{key}.json")


def drop_unused(root: Path, head_gone: bool = False) -> None:
    """Remove the warm counts that ran out (all of them when the head is gone: its workers went
    with it) and the environment files that no connected task and no warm worker uses. Under the
    folder's lock."""
    warm = {} if head_gone else read_warm(root)
    for path in (root / "warm").glob("*.json"):
        if path.stem not in warm:
            path.unlink(missing_ok=True)
    used = {record["env"] for record in warm.values()}
    for path in (root / "clients").glob("*.uses"):
        if _held(path.with_suffix(".lock")):
            with contextlib.suppress(OSError):
                used.add(path.read_text())
    for path in (root / "envs").glob("*.env"):
        if path.stem not in used:
            path.unlink(missing_ok=True)


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log ('' if there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
