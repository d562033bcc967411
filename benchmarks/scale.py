"""Scale: rows/s with 1 vs 2 replicas, on embedded Ray and on a 2-node local Ray cluster.

Every replica runs torch with one thread, so two replicas use two cores. The 2-node cluster is
a head and one ``ray start --address`` node on this same machine (private temp dir, ports and
no auth token; stopped by killing exactly the processes started here): it exercises the
multi-node code path (actors and read tasks on another raylet, blocks crossing object
stores), not more hardware. Runs against the cluster connect to it (``ray_address``), so they
pay no Ray start-up; compare their steady rates (between the first and last commit).

    python -m benchmarks.scale                 # 2M rows
    python -m benchmarks.scale --no-cluster    # embedded Ray only
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.support.cli import base_parser, common_params
from benchmarks.support.commits import commit_timeline
from benchmarks.support.data import make_input
from benchmarks.support.paths import REPO
from benchmarks.support.results import Results
from benchmarks.support.runs import run_variant

NODE_CPUS = 2
#: A private cluster: no token to hand around (Ray enables token auth for new clusters).
CLUSTER_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_block(size: int) -> int:
    """The first port of ``size`` consecutive ports that are free now."""
    for _ in range(100):
        base = random.randrange(20_000, 60_000 - size)
        try:
            sockets = []
            for port in range(base, base + size):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no block of free ports found")


class LocalCluster:
    """A Ray head and one worker node started with ``ray start --block`` on this machine."""

    def __init__(self, cpus_per_node: int = NODE_CPUS):
        self.temp_dir = tempfile.mkdtemp(prefix="rbbc", dir="/tmp")  # short: socket path limit
        self.gcs_port = free_port()
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.env = {
            **os.environ,
            **CLUSTER_ENV,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
        self.nodes: list[subprocess.Popen] = []
        ray_cli = str(Path(sys.executable).with_name("ray"))
        head = [ray_cli, "start", "--head", f"--port={self.gcs_port}", "--include-dashboard=false"]
        head += [f"--ray-client-server-port={free_port()}", f"--dashboard-port={free_port()}"]
        worker = [ray_cli, "start", f"--address={self.address}"]
        for command in (head, worker):
            workers = free_port_block(40)
            command += [
                "--block",
                "--node-ip-address=127.0.0.1",
                f"--num-cpus={cpus_per_node}",
                f"--temp-dir={self.temp_dir}",
                f"--node-manager-port={free_port()}",
                f"--object-manager-port={free_port()}",
                f"--min-worker-port={workers}",
                f"--max-worker-port={workers + 39}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--dashboard-agent-grpc-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}",
                f"--metrics-export-port={free_port()}",
                "--disable-usage-stats",
            ]
            log = open(Path(self.temp_dir) / f"node-{len(self.nodes)}.log", "w")  # noqa: SIM115 - lives with the node
            self.nodes.append(
                subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
            self._wait_for_nodes(len(self.nodes))

    def _wait_for_nodes(self, count: int, timeout_s: float = 120) -> None:
        """Wait until the cluster reports ``count`` alive nodes."""
        check = (
            "import ray, sys; ray.init(address=sys.argv[1], configure_logging=False, log_to_driver=False); "
            "print(sum(n['Alive'] for n in ray.nodes()))"
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(node.poll() is not None for node in self.nodes):
                raise RuntimeError(f"a Ray node exited; logs in {self.temp_dir}")
            out = subprocess.run(
                [sys.executable, "-c", check, self.address], env=self.env, capture_output=True, text=True
            )
            if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            time.sleep(1)
        raise RuntimeError(f"the cluster did not reach {count} nodes in {timeout_s} s; logs in {self.temp_dir}")

    def stop(self) -> None:
        """Kill what was started here, and only that: the nodes' process trees, then leftovers."""
        import psutil

        processes = []
        for node in self.nodes:
            with contextlib.suppress(psutil.NoSuchProcess):
                processes += [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
        for node in self.nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGTERM)
        psutil.wait_procs(processes, timeout=10)
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        subprocess.run(["pkill", "-9", "-f", self.temp_dir], check=False)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[2_000_000])
    parser.add_argument("--no-cluster", action="store_true", help="skip the 2-node local cluster")
    args = parser.parse_args(argv)
    results = Results("scale", "Scale: 1 vs 2 replicas, embedded and on a 2-node local cluster", args)

    def run(where: str, rows: int, replicas: int, num_cpus: float, address: str | None = None) -> None:
        input_path = make_input(args.work_dir, rows)
        output = args.work_dir / "out-scale"
        params = {
            **common_params(args, input_path, output),
            "threads": 1,
            "concurrency": replicas,
            "num_cpus": num_cpus,
            "ray_address": address,
        }
        result = run_variant("operator", params, env=CLUSTER_ENV if address else None)
        timeline = commit_timeline(output, result["started_at"])
        results.add(
            ray=where,
            rows=rows,
            replicas=replicas,
            cpus_per_replica=num_cpus,
            wall_s=result["wall_s"],
            rows_per_s=result["rows_per_s"],
            first_commit_s=timeline.get("first_commit_s", ""),
            steady_rows_per_s=timeline.get("steady_rows_per_s", ""),
            load_avg=result["load_avg"],
        )

    for rows in args.rows:
        # Embedded Ray has 2 CPUs: 2 replicas x 0.5 CPU leave 1 CPU for reading (see check_cluster_resources).
        run("embedded (2 CPUs)", rows, 1, 1)
        run("embedded (2 CPUs)", rows, 2, 0.5)
    if not args.no_cluster:
        cluster = LocalCluster()
        try:
            for rows in args.rows:
                where = f"2 nodes ({NODE_CPUS} + {NODE_CPUS} CPUs, one machine)"
                run(where, rows, 1, 1, cluster.address)
                run(where, rows, 2, 1, cluster.address)
        finally:
            cluster.stop()
    results.note(
        "2 replicas on this 2-core machine cannot beat 1 replica by much: the cores are shared with "
        "reading, writing and Ray itself. The 2-node cluster is on the same 2 cores."
    )
    results.write()
    return results


if __name__ == "__main__":
    main()
