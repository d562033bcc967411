"""A real Ray cluster on loopback for the tests: `ray start --head` (with the dashboard and token
auth) and, on demand, a second `ray start --address` node. Stopped by the pids of its processes.

The cluster runs the Ray of this venv, or of the venv whose `bin` folder is
:data:`CLUSTER_BIN_ENV` (a cluster image with another Ray release, and the provider installed
beside it: the mixed-version tests, `make test-compat`)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_raybatch.pipeline.runtime.shared.monitor import KERNEL_WORKER_PORTS
from tests.conftest import REPO, free_port

#: Environment variable: the `bin` folder of the venv the cluster runs (default: this one's).
CLUSTER_BIN_ENV = "RAYBATCH_TEST_CLUSTER_BIN"
CLUSTER_BIN = Path(os.environ.get(CLUSTER_BIN_ENV) or Path(sys.executable).parent)
RAY = str(CLUSTER_BIN / "ray")


def cluster_ray_version() -> str:
    """The Ray release the cluster runs (not necessarily the one imported here)."""
    out = subprocess.run([str(CLUSTER_BIN / "python"), "-c", "import ray; print(ray.__version__)"], capture_output=True)
    return out.stdout.decode().strip()


@dataclass
class LocalRayCluster:
    temp_dir: str
    token: str
    gcs_port: int
    dashboard_port: int
    nodes: list[str] = field(default_factory=list)

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=self.token,
            # Job entrypoints run `python`: the cluster venv's, as a cluster image would provide.
            PATH=f"{CLUSTER_BIN}{os.pathsep}{env.get('PATH', '')}",
            RAY_USAGE_STATS_ENABLED="0",
        )
        env.pop("RAY_ADDRESS", None)
        return env

    def start_node(self, *, head: bool, num_cpus: int, resources: dict[str, float] | None = None) -> int:
        """Start a node; returns its raylet's port (``--node_manager_port`` on the raylet's command line)."""
        ports = [free_port() for _ in range(6)]
        command = [
            RAY,
            "start",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}",
            f"--node-manager-port={ports[0]}",
            f"--object-manager-port={ports[1]}",
            f"--dashboard-agent-listen-port={ports[2]}",
            f"--dashboard-agent-grpc-port={ports[3]}",
            f"--metrics-export-port={ports[4]}",
            f"--runtime-env-agent-port={ports[5]}",
            *KERNEL_WORKER_PORTS,  # every node and local Ray on the host would hand out the same first ports
            "--disable-usage-stats",
        ]
        if resources:
            command.append(f"--resources={json.dumps(resources)}")
        if head:
            command += [
                "--head",
                f"--port={self.gcs_port}",
                f"--temp-dir={self.temp_dir}",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
                f"--ray-client-server-port={free_port()}",
            ]
        else:
            command.append(f"--address=127.0.0.1:{self.gcs_port}")
        run = subprocess.run(command, env=self.env(), capture_output=True, text=True, timeout=180)
        if run.returncode != 0:
            raise ClusterStartError(f"`ray start` exited {run.returncode}: {(run.stdout + run.stderr)[-3000:]}")
        self.nodes.append("head" if head else "worker")
        return ports[0]

    def raylet_pid(self, node_manager_port: int) -> int:
        """The pid of the raylet of the node started with ``node_manager_port``."""
        out = subprocess.run(
            ["pgrep", "-f", f"raylet.*--node_manager_port={node_manager_port}( |$)"], capture_output=True, text=True
        )
        (pid,) = [int(p) for p in out.stdout.split()]
        return pid

    def pids(self) -> list[int]:
        """Every process of this cluster: each inherits its token from `ray start`'s environment.

        Not by command line: the dashboard's and the runtime env's agents retitle theirs (``ray::DashboardAgent``),
        and outlived every stop that looked for the temp dir there.
        """
        mark = f"RAY_AUTH_TOKEN={self.token}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                with contextlib.suppress(OSError), open(f"/proc/{entry}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        found.append(int(entry))
        return found

    def stop(self) -> None:
        # The GCS, the raylet and the monitor outlive SIGTERM by over 12 s (they wait on one another): a test's
        # throwaway cluster gets 2 s, then SIGKILL.
        for sig, grace in ((signal.SIGTERM, 2), (signal.SIGKILL, 10)):
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)


class ClusterStartError(RuntimeError):
    """`ray start` failed; the message ends with its output."""


def start_cluster(num_cpus: int = 2, attempts: int = 3) -> LocalRayCluster:
    """Start a head; a failed start is tried again on other ports (up to ``attempts`` in all).

    Its ports are picked free, then released for Ray to bind: under load another process may take one meanwhile.
    The session's cluster is shared by every cluster test of a worker, so one failed start errored them all (44 in
    a CI run here); the last failure's error holds Ray's output.
    """
    for attempt in range(1, attempts + 1):
        # Short: Ray's socket paths under the temp dir must stay below the OS limit.
        cluster = LocalRayCluster(
            temp_dir=tempfile.mkdtemp(prefix="rbc-", dir="/tmp"),
            token=secrets.token_hex(16),
            gcs_port=free_port(),
            dashboard_port=free_port(),
        )
        try:
            cluster.start_node(head=True, num_cpus=num_cpus)
        except BaseException as e:
            cluster.stop()
            if not isinstance(e, ClusterStartError) or attempt == attempts:
                raise
        else:
            return cluster
    raise ValueError(f"attempts must be at least 1, not {attempts}")


def connection(cluster: LocalRayCluster, **extra) -> str:
    """An AIRFLOW_CONN_* value for the cluster: jobs import this checkout (runtime_env PYTHONPATH)."""
    return json.dumps(
        {
            "conn_type": "ray",
            "host": cluster.dashboard,
            "password": cluster.token,
            "extra": {"runtime_env": {"env_vars": {"PYTHONPATH": str(REPO)}}, **extra},
        }
    )
