"""What every benchmark shares: generated input, runs in child processes, memory of a process
tree, the machine's description, and results written as JSON and Markdown.

Each measured run happens in its own child process (``benchmarks.variants``) with its own Ray
temp dir: no state leaks between runs, a run can be killed for real, and the parent can sample
the memory of the child's whole process tree (the driver, Ray's daemons and its workers).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "benchmarks"
DEFAULT_WORK_DIR = BENCH_DIR / "data"  # git-ignored: inputs and outputs
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"

ROWS_PER_FILE = 500_000
ROW_GROUP_ROWS = 100_000
BATCH_SIZE = 4096
THREADS = os.cpu_count() or 1
MIN_COMMITS_FOR_RATE = 5  # fewer commits arrive too close together to give a meaningful rate
#: The last commit whose driver received every row and wrote every range file, with a ledger of
#: one record per range and a plan listing every range: "before" in the scale-out benchmarks.
BEFORE_SCALE_OUT = "b0ef868"
#: Daft's own environment (``make daft-env``, from benchmarks/daft-requirements.txt): Daft 0.7
#: requires pyarrow < 26 and the project pins 26, so its variant runs with this interpreter
#: (``RAYBATCH_DAFT_PYTHON`` names another).
DAFT_PYTHON = Path(os.environ.get("RAYBATCH_DAFT_PYTHON") or REPO / ".venv-daft" / "bin" / "python")
DAFT_ENV_HINT = "create it with `make daft-env` (a venv from benchmarks/daft-requirements.txt, ~100 MB to download)"


# --- input ------------------------------------------------------------------------------------


def make_input(work_dir: Path, rows: int, rows_per_file: int = ROWS_PER_FILE, seed: int = 0) -> Path:
    """Parquet files of ``id`` (int64) and ``features`` (32 float32), reused when already there."""
    from benchmarks.model import FEATURES

    folder = work_dir / f"input-{rows}-{rows_per_file}"
    marker = folder / "_COMPLETE"  # a leading underscore: the planner skips it
    if marker.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    start, index = 0, 0
    while start < rows or index == 0:
        n = min(rows_per_file, rows - start)
        x = rng.standard_normal((n, FEATURES), dtype=np.float32)
        table = pa.table(
            {
                "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                "features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), FEATURES),
            }
        )
        pq.write_table(table, folder / f"part-{index:04d}.parquet", row_group_size=ROW_GROUP_ROWS)
        start, index = start + n, index + 1
    marker.touch()
    return folder


def weights(work_dir: Path, model: str = "heavy") -> Path:
    from benchmarks.model import SHAPES, save_weights

    name = "mlp.safetensors" if model == "heavy" else f"mlp-{model}.safetensors"
    return save_weights(work_dir / name, **SHAPES[model])


def moto_s3(bucket: str) -> tuple[dict[str, Any], Any]:
    """A moto S3 server on loopback holding an empty ``bucket``: (fsspec storage options, server to stop)."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{server._server.server_port}", "region_name": "us-east-1"},
    }
    boto3.client(
        "s3", aws_access_key_id="testing", aws_secret_access_key="testing", **options["client_kwargs"]
    ).create_bucket(Bucket=bucket)
    return options, server


@contextmanager
def provider_at(commit: str) -> Iterator[str]:
    """A folder holding the provider package as it was at ``commit`` (in a temporary git worktree).

    Put it first on a child's ``sys.path`` (the ``package_root`` parameter of the variants): only
    the provider comes from the earlier commit, the benchmark's own code stays this checkout's.
    """
    with tempfile.TemporaryDirectory(prefix="rbb-before-") as tmp:
        tree, package_root = Path(tmp) / "tree", Path(tmp) / "package"
        subprocess.run(["git", "worktree", "add", "--detach", tree, commit], cwd=REPO, check=True)
        try:
            package_root.mkdir()
            (package_root / "airflow_provider_raybatch").symlink_to(tree / "airflow_provider_raybatch")
            yield str(package_root)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=REPO, check=False)


# --- runs in child processes ------------------------------------------------------------------


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


class VariantRun:
    """One variant running in a child process with a private Ray temp dir.

    ``python``: the child's interpreter, this one's by default (another venv's for a variant
    whose dependencies cannot live beside the project's, such as ``daft``).
    """

    def __init__(
        self,
        variant: str,
        params: dict[str, Any],
        env: dict[str, str] | None = None,
        pss: bool = False,
        python: str | Path | None = None,
    ):
        # Short path: Ray's socket paths are length-limited.
        self.ray_tmp = tempfile.mkdtemp(prefix="rbb", dir="/tmp")
        child_env = {
            **os.environ,
            "RAY_TMPDIR": self.ray_tmp,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "AIRFLOW_HOME": os.environ.get("AIRFLOW_HOME", str(Path(self.ray_tmp) / "airflow")),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # Ray runs its workers at niceness 15: on a machine shared with other work, the
            # predictor would get the CPU only when others leave it, and a comparison with the
            # plain loop (niceness 0) would measure the neighbours. Same priority for every variant.
            "RAY_worker_niceness": "0",
            # A Ray of its own, started and stopped in the run (what was measured before the shared
            # local Ray existed); a benchmark measuring the shared Ray says so in ``env``.
            "RAYBATCH_LOCAL_RAY": "per-task",
            **(env or {}),
        }
        self.load_at_start = load_average()
        self.log_path = Path(self.ray_tmp) / "child.log"
        self.log = open(self.log_path, "w+")  # noqa: SIM115 - closed in finish()
        self.spawned = time.perf_counter()
        self.process = subprocess.Popen(
            [str(python or sys.executable), "-m", "benchmarks.variants", variant, json.dumps(params)],
            cwd=REPO,
            env=child_env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.memory = TreeMemory(self.process.pid, pss=pss).__enter__()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)

    def finish(self, timeout_s: float = 1800) -> dict[str, Any]:
        """Wait for the child, clean up what it left, return its result (with memory peaks)."""
        try:
            returncode = self.process.wait(timeout=timeout_s)
            # The child's whole life: interpreter start, every import, the run, its exit.
            process_s = time.perf_counter() - self.spawned
        finally:
            self.memory.__exit__()
            # Safety net: a SIGKILLed driver's reaper ends its Ray; end anything still running
            # from our private temp dir so that one variant cannot slow the next.
            kill_ray_leftovers(self.ray_tmp)
        self.log.seek(0)
        output = self.log.read()
        self.log.close()
        result: dict[str, Any] = {
            "returncode": returncode,
            "load_avg": self.load_at_start,
            "process_s": round(process_s, 3),
        }
        for line in output.splitlines():
            if line.startswith("RESULT "):
                result.update(json.loads(line[len("RESULT ") :]))
        if returncode == 0 and "wall_s" not in result:
            raise RuntimeError(f"child printed no result:\n{output[-4000:]}")
        if returncode not in (0, -signal.SIGKILL):
            raise RuntimeError(f"child failed with code {returncode}:\n{output[-4000:]}")
        result["peak_rss_mb"] = round(self.memory.peak_rss / 2**20, 1)
        if self.memory.pss:
            result["peak_pss_mb"] = round(self.memory.peak_pss / 2**20, 1)
        result["peak_processes"] = self.memory.peak_processes
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
        return result


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


def run_variant(
    variant: str,
    params: dict[str, Any],
    env: dict[str, str] | None = None,
    pss: bool = False,
    python: str | Path | None = None,
) -> dict[str, Any]:
    """Run one variant to completion in a child process (``python``: its interpreter) and return its result."""
    return VariantRun(variant, params, env, pss, python).finish()


def commit_records(output: Path) -> list[dict[str, Any]]:
    """The output's commit records, as its ledger reads them (also while a run writes them)."""
    from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger

    return list(OutputLedger.open(str(output)).committed().values())


def commit_timeline(output: Path, started_at: float) -> dict[str, Any]:
    """When ranges were committed, from the commit times their records hold.

    ``first_commit_s``: seconds from the run's start to its first committed range (the fixed
    cost a task pays before any result is safe); ``steady_rows_per_s``: the rate between the
    first and the last commit, i.e. the pipeline's speed once running.
    """
    records = [(r["committed_at"], r["rows"]) for r in commit_records(output) if "committed_at" in r]
    records = sorted(r for r in records if r[0] >= started_at)
    if not records:
        return {}
    first, last = records[0][0], records[-1][0]
    rows_after_first = sum(rows for _, rows in records[1:])
    timeline = {"first_commit_s": round(first - started_at, 2), "last_commit_s": round(last - started_at, 2)}
    if len(records) >= MIN_COMMITS_FOR_RATE and last > first:
        timeline["steady_rows_per_s"] = round(rows_after_first / (last - first), 1)
    return timeline


# --- the machine and the results --------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu_model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        ram_gib = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        ram_gib = None
    versions = {}
    for module in ("ray", "torch", "pyarrow"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = None
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "ram_gib": ram_gib,
        "cpu_model": cpu_model,
        "python": platform.python_version(),
        **versions,
    }


def load_average() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


class Results:
    """Tables of one benchmark, printed and written to ``<out>/<name>.json`` and ``<name>.md``.

    ``add`` appends a measured row; ``check`` appends a row to the table of targets.
    """

    def __init__(self, name: str, title: str, args: argparse.Namespace):
        self.name, self.title = name, title
        self.out = Path(args.out)
        self.params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        self.machine = machine()
        self.load_at_start = load_average()
        self.rows: list[dict[str, Any]] = []
        self.targets: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def add(self, **row: Any) -> dict[str, Any]:
        row.setdefault("load_avg", load_average())
        self.rows.append(row)
        print("  " + ", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        return row

    def check(self, measure: str, value: float, target: str, met: bool | None) -> None:
        """Record a measured value against its target (``met=None``: for information)."""
        verdict = "" if met is None else ("met" if met else "missed")
        self.targets.append({"measure": measure, "value": value, "target": target, "verdict": verdict})
        print(f"  {measure}: {value} (target {target}) {verdict}", flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(text, flush=True)

    def markdown(self) -> str:
        m = self.machine
        lines = [
            f"### {self.title}",
            "",
            f"{m['date']}; {m['nproc']} CPUs ({m['cpu_model']}), {m['ram_gib']} GiB RAM; "
            f"load average (1/5/15 min) at start {self.load_at_start}, at end {load_average()}; "
            f"ray {m['ray']}, torch {m['torch']}, pyarrow {m['pyarrow']}.",
            "",
            markdown_table(self.rows),
        ]
        if self.targets:
            lines += ["", markdown_table(self.targets)]
        if self.notes:
            lines += ["", *[f"- {n}" for n in self.notes]]
        return "\n".join(lines) + "\n"

    def write(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        data = {
            "benchmark": self.name,
            "title": self.title,
            "machine": self.machine,
            "params": self.params,
            "load_avg_start": self.load_at_start,
            "load_avg_end": load_average(),
            "rows": self.rows,
            "targets": self.targets,
            "notes": self.notes,
        }
        (self.out / f"{self.name}.json").write_text(json.dumps(data, indent=2) + "\n")
        markdown = self.markdown()
        (self.out / f"{self.name}.md").write_text(markdown)
        print("\n" + markdown, flush=True)
        return self.out / f"{self.name}.md"


def markdown_table(rows: Iterable[dict[str, Any]]) -> str:
    rows = list(rows)
    if not rows:
        return "(no rows)"
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def base_parser(description: str, rows: list[int]) -> argparse.ArgumentParser:
    """Options every benchmark script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--rows", type=int, nargs="+", default=rows, help=f"input sizes in rows (default: {' '.join(map(str, rows))})"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR, help="folder for the results (JSON, Markdown)")
    parser.add_argument(
        "--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="folder for generated input and outputs"
    )
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="rows per model call, in every variant")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch threads, in every variant")
    parser.add_argument("--rows-per-range", type=int, default=100_000, help="the operator's checkpoint granularity")
    return parser


def common_params(
    args: argparse.Namespace, input_path: Path, output_path: Path, model: str = "heavy"
) -> dict[str, Any]:
    return {
        "input": str(input_path),
        "output": str(output_path),
        "model": model,
        "weights": str(weights(args.work_dir, model)),
        "batch_size": args.batch_size,
        "threads": args.threads,
        "rows_per_range": args.rows_per_range,
    }


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def median(values: Iterable[float]) -> float:
    return float(np.median(list(values)))


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started
