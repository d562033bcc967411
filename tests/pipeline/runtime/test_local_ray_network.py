"""The local Ray listens on loopback only: a shared worker host must not expose Ray's ports (a code-execution
service, even with token auth) to its network. Real heads and per-task Rays; their sockets read from /proc."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.runtime.shared.folder import read_record
from airflow_provider_raybatch.pipeline.runtime.shared.head_processes import head_processes
from tests.support.shared_ray import REPO, Task

pytestmark = [pytest.mark.ray, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


def _address(hex_address: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``0100007F:8D07`` (/proc/net/tcp: each 32-bit word of the address in host order, x86 and ARM little-endian)."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw), int(port, 16)


def _listening_by_inode() -> dict[str, tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """Every listening TCP socket of this network namespace, by inode."""
    found = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == _LISTEN:
                    found[fields[9]] = _address(fields[1])
    return found


def listening(pids: Iterable[int]) -> dict[int, list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]]:
    """The TCP addresses each of ``pids`` listens on (through the socket descriptors it holds)."""
    by_inode = _listening_by_inode()
    found: dict[int, list] = {}
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # gone meanwhile
            continue
        inodes = {link[len("socket:[") : -1] for link in links if link.startswith("socket:[")}
        found[pid] = sorted({by_inode[i] for i in inodes if i in by_inode}, key=str)
    return found


def process_tree(pid: int) -> set[int]:
    """``pid`` and every process descended from it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    tree, todo = set(), [pid]
    while todo:
        tree.add(todo[-1])
        todo.extend(children.get(todo.pop(), []))
    return tree


def _loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)  # [::ffff:127.0.0.1]: a dual-stack socket bound to 127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:100]
    except OSError:
        return "?"


def assert_loopback_only(pids: Iterable[int]) -> set[int]:
    """Assert no process of ``pids`` listens on a wildcard (0.0.0.0, ::) or outward address; return the ports."""
    sockets = listening(pids)
    exposed = {
        f"{pid} {_name(pid)}": [f"{a}:{p}" for a, p in addresses if not _loopback(a)]
        for pid, addresses in sockets.items()
        if not all(_loopback(a) for a, _ in addresses)
    }
    assert not exposed, "\n".join(f"{process} listens on {addresses}" for process, addresses in exposed.items())
    return {port for addresses in sockets.values() for _, port in addresses}


def test_every_port_of_the_shared_ray_and_of_a_task_on_it_is_on_loopback(shared, tmp_path):
    env, root = shared
    task = Task(env, "net", release=tmp_path / "release")
    try:
        task.info()  # connected, and a worker of its job ran its probe: every daemon is up
        record = read_record(root)
        pids = process_tree(record["head_pid"]) | set(head_processes(root)) | {task.process.pid}
        ports = assert_loopback_only(pids)
        # What was checked: the GCS, and more than it (raylet, agents, client server, workers, the driver).
        assert int(record["address"].rsplit(":", 1)[1]) in ports
        assert len(ports) > 5, ports
    finally:
        task.finish()


PER_TASK = """
import os, sys, time
import ray
from airflow_provider_raybatch.pipeline.runtime.local_ray import ray_session
with ray_session():
    print("WORKER", ray.get(ray.remote(lambda: os.getpid()).remote()), flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.1)
"""


@pytest.fixture
def ray_tmpdir():
    """A private RAY_TMPDIR for a per-task Ray (short: Ray's socket paths are length-limited)."""
    folder = tempfile.mkdtemp(prefix="rbl", dir="/tmp")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_every_port_of_a_per_task_ray_is_on_loopback(ray_tmpdir, tmp_path):
    release = tmp_path / "release"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAYBATCH_LOCAL_RAY": "per-task", "RAY_TMPDIR": ray_tmpdir}
    task = subprocess.Popen(
        [sys.executable, "-c", PER_TASK, str(release)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        for line in task.stdout:
            lines.append(line)
            if line.startswith("WORKER "):
                break
        assert lines and lines[-1].startswith("WORKER "), "".join(lines)
        worker = int(lines[-1].split()[1])
        pids = process_tree(task.pid)
        assert worker in pids
        assert len(assert_loopback_only(pids)) > 5
    finally:
        release.touch()
        rest, _ = task.communicate(timeout=120)
    assert task.returncode == 0, rest
