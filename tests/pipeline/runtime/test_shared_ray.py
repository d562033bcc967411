"""The host's shared warm local Ray: real heads, real task processes, real kills."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.runtime.shared.client import JOB_ENV_FILE_ENV, apply_job_environment
from airflow_provider_raybatch.pipeline.runtime.shared.folder import read_record
from airflow_provider_raybatch.pipeline.runtime.shared.head import stop_shared_heads
from airflow_provider_raybatch.pipeline.runtime.shared.head_processes import head_processes
from airflow_provider_raybatch.pipeline.runtime.shared.settings import LocalRaySettings, head_dir
from tests.support.data import assert_output_sound, write_input
from tests.support.shared_ray import REPO, Task, wait_until

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shared Ray reads /proc"),
]

log = logging.getLogger(__name__)


def started_heads(output: str) -> int:
    return output.count("Starting the shared local Ray")


def listening_ports(pids: list[int]) -> set[int]:
    import psutil

    ports = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            ports |= {
                c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN
            }
    return ports


def test_two_tasks_share_one_head_each_with_its_own_environment_and_it_stops_when_idle(shared):
    env, root = shared
    first = Task(env, "first", release=root.parent.parent / "release-first")
    first_info = first.info()
    record = read_record(root)
    assert record is not None

    second = Task(env, "second")
    second_info = second.info()
    # `ray start` hands every worker and driver a port from 10002 up, and so does every other `ray start` on the
    # host (another Ray release's head, another user's): the process given a taken port dies. The kernel's own
    # ports are never in that range.
    ports = listening_ports([*head_processes(root), first.process.pid, second.process.pid])
    assert ports and not ports & set(range(10002, 20000)), sorted(ports)
    second_out = second.finish()
    first_out = first.finish()
    assert started_heads(first_out) == 1
    log.info(
        "connect: first task %.2f s (started the head), second %.2f s",
        first_info["connect_s"],
        second_info["connect_s"],
    )
    print(f"connect: first task {first_info['connect_s']:.2f} s, second {second_info['connect_s']:.2f} s")
    assert started_heads(second_out) == 0
    assert second_info["node"] == first_info["node"]
    assert read_record(root)["head_pid"] == record["head_pid"]
    # Each task's workers see that task's environment, not the first task's.
    assert first_info["worker"]["mark"] == "first" and second_info["worker"]["mark"] == "second"

    # No task connected: the head stops after its idle timeout (5 s here) and leaves nothing.
    assert head_processes(root)
    assert wait_until(lambda: read_record(root) is None and not head_processes(root), 5 + 30), (
        root / "monitor.log"
    ).read_text()
    assert "idle for 5 s: stopping the head" in (root / "monitor.log").read_text()


def test_a_task_that_disconnected_and_lives_on_is_not_stopped_with_the_head(shared, tmp_path):
    """Ray keeps a driver's log open after it disconnects: the head's stop (idle, here) must not take
    the process for one of the head's own (it killed `airflow dags test` between two tasks)."""
    env, root = shared
    task = Task(env, "lingering", release=tmp_path / "release", mode="linger")
    task.info()
    assert task.process.stdout.readline().startswith("LEFT")
    assert wait_until(lambda: read_record(root) is None and not head_processes(root), 5 + 30), (
        root / "monitor.log"
    ).read_text()
    assert task.process.poll() is None, "the head's stop killed a task process"
    task.finish()


def test_two_first_tasks_race_and_start_one_head(shared):
    env, root = shared
    tasks = [Task(env, "a"), Task(env, "b")]  # no head yet: both try to start it
    infos = [t.info() for t in tasks]
    outputs = [t.finish() for t in tasks]
    assert infos[0]["node"] == infos[1]["node"]
    assert sum(started_heads(o) for o in outputs) == 1, outputs
    assert (root / "monitor.log").read_text().count("head up in") == 1


def test_a_head_recorded_for_another_ray_version_is_replaced(shared):
    env, root = shared
    env = {**env, "RAYBATCH_LOCAL_RAY_IDLE_TIMEOUT_S": "120"}  # the old head must still run when the new task comes
    old = Task(env, "old")
    old_node = old.info()["node"]
    old.finish()
    record = read_record(root)
    record["ray_version"] = "0.0.1"  # as if another Ray had started it
    (root / "head.json").write_text(json.dumps(record))

    new = Task(env, "new")
    new_node = new.info()["node"]
    output = new.finish()
    assert "Replacing the shared local Ray" in output and "it runs Ray 0.0.1" in output
    assert started_heads(output) == 1
    assert new_node != old_node
    replaced = read_record(root)
    assert replaced["head_pid"] != record["head_pid"]
    assert not Path(f"/proc/{record['head_pid']}").exists()
    assert not Path(f"/proc/{record['monitor_pid']}").exists()


def settled(pids: set[int], interval_s: float = 0.5) -> bool:
    """Whether none of ``pids`` used CPU time within ``interval_s`` (a started worker waits idle)."""

    def cpu_ticks() -> list[int]:
        ticks = []
        for pid in sorted(pids):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks.append(int(fields[11]) + int(fields[12]))  # utime, stime
        return ticks

    try:
        before = cpu_ticks()
        time.sleep(interval_s)
        return cpu_ticks() == before
    except OSError:  # one has ended: not settled (the assertions after say what ran)
        return False


def job_processes(job_env: str) -> list[int]:
    """Processes started for one task's job: its runtime_env names its environment file."""
    mark = f"RAYBATCH_JOB_ENV={job_env}\0".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (
                    mark in (proc / "environ").read_bytes()
                    and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
                ):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_a_sigkilled_task_leaves_no_worker_behind_and_the_head_serves_others_then_stops(shared, tmp_path):
    env, root = shared
    other = Task(env, "other", release=tmp_path / "release")
    other.info()
    killed = Task(env, "killed", busy=True)
    info = killed.info()
    job_env = info["worker"]["job_env"]
    assert job_env and job_env.startswith(f"{root}/envs/")
    # The probe's worker, the actor, the task and the process the actor started.
    assert wait_until(lambda: len(job_processes(job_env)) >= 3, 30), job_processes(job_env)
    killed.process.kill()  # SIGKILL: no finally, no disconnect
    killed.process.wait()
    assert killed.process.returncode == -signal.SIGKILL
    assert wait_until(lambda: not job_processes(job_env), 30), job_processes(job_env)
    # Its environment's file (secrets) is removed by the monitor; the other task's stays.
    assert wait_until(lambda: not Path(job_env).exists(), 10)
    assert len(list((root / "envs").iterdir())) == 1

    # The head is still up, and serves the other task.
    record = read_record(root)
    assert record is not None and Path(f"/proc/{record['head_pid']}").exists()
    output = other.finish()
    assert json.loads(output.split("AGAIN ", 1)[1].splitlines()[0])["mark"] == "other"
    # The killed task's client lock went with it: once the other task is gone, the head goes.
    assert wait_until(lambda: read_record(root) is None and not head_processes(root), 5 + 30), (
        root / "monitor.log"
    ).read_text()
    assert not list((root / "clients").iterdir()) and not list((root / "envs").iterdir())


PRESTART_TASK = """
import json, os, sys, time
import ray
from airflow_provider_raybatch.pipeline.runtime.local_ray import prestart_workers, ray_session

@ray.remote
def probe(meet):
    # Both probes wait for each other, so each runs on a worker of its own (a probe that finished
    # first would let Ray hand the other to the same worker).
    open(os.path.join(meet, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(meet)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"pid": os.getpid(), "mark": os.environ.get("RAYBATCH_TEST_MARK")}

with ray_session() as client:
    print("PRESTART " + json.dumps({"job_env": str(client.env_path), "ok": prestart_workers(2)}), flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.1)
    meet = sys.argv[1] + ".meet"
    os.mkdir(meet)
    print("RAN " + json.dumps(ray.get([probe.remote(meet), probe.remote(meet)])), flush=True)
"""


def test_workers_prestarted_for_a_task_have_its_environment_and_run_its_work(shared, tmp_path):
    env, _ = shared
    release = tmp_path / "release"
    task = subprocess.Popen(
        [sys.executable, "-c", PRESTART_TASK, str(release)],
        env={**env, "RAYBATCH_TEST_MARK": "prestarted"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in task.stdout:
        lines.append(line)
        if line.startswith("PRESTART "):
            break
    started = json.loads(lines[-1][len("PRESTART ") :])
    assert started["ok"], "".join(lines)
    # Nothing is scheduled yet: the job's worker processes are the two asked for, started now.
    assert wait_until(lambda: len(job_processes(started["job_env"])) == 2, 60), "".join(lines)
    prestarted = set(job_processes(started["job_env"]))
    # Released once both have started (their CPU time stands still): a worker still starting when
    # the probes come is not one Ray can hand them, and Ray would start another.
    assert wait_until(lambda: settled(prestarted), 120), "".join(lines)
    release.touch()
    rest, _ = task.communicate(timeout=120)
    assert task.returncode == 0, "".join(lines) + rest
    ran = json.loads(rest.split("RAN ", 1)[1].splitlines()[0])
    assert {r["pid"] for r in ran} == prestarted
    assert {r["mark"] for r in ran} == {"prestarted"}  # the task's environment, from the setup hook


WHERE_SCORED = """
import sys
from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
stages = [Stage("tests.support.predictors:WhereScored", concurrency=1)]
run_batch_inference(BatchInferenceConfig(sys.argv[1], sys.argv[2], stages, id_column="id", rows_per_range=100))
"""


def test_a_task_leaves_warm_workers_that_only_the_next_task_with_its_environment_gets(shared, tmp_path):
    env, root = shared
    write_input(tmp_path / "in", [300])
    warm_log = tmp_path / "warm.log"
    # Warm workers live as long as the head stays up idle: here longer than a task's start.
    env = {**env, "RAYBATCH_TEST_WARM_LOG": str(warm_log), "RAYBATCH_LOCAL_RAY_IDLE_TIMEOUT_S": "120"}

    def run(name: str, mark: str, try_number: str) -> pa.Table:
        task_env = {**env, "RAYBATCH_TEST_MARK": mark, "AIRFLOW_CTX_TRY_NUMBER": try_number}
        args = [sys.executable, "-c", WHERE_SCORED, str(tmp_path / "in"), str(tmp_path / name)]
        done = subprocess.run(args, env=task_env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return pq.read_table(tmp_path / name)

    def warm_pids() -> list[str]:
        return warm_log.read_text().split() if warm_log.exists() else []

    first = run("first", "same", "1")
    assert set(first["mark"].to_pylist()) == {"same"} and not any(first["preloaded"].to_pylist())
    # It left one warm worker (its one replica read, scored and wrote), which imported ahead.
    assert wait_until(lambda: len(warm_pids()) == 1, 60), warm_pids()
    (env_file,) = (root / "envs").iterdir()
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert "AIRFLOW_CTX_TRY_NUMBER" not in json.loads(env_file.read_text())  # one try's, left out

    # The next task with that environment (another try of it) is scored by that worker, with
    # what it imported ahead; and leaves one in its turn.
    second = run("second", "same", "2")
    assert set(second["pid"].to_pylist()) == {int(warm_pids()[0])}
    assert set(second["mark"].to_pylist()) == {"same"} and all(second["preloaded"].to_pylist())
    assert wait_until(lambda: len(warm_pids()) == 2, 60), warm_pids()

    # A task with another environment never gets a worker that holds the first one's.
    other = run("other", "other", "1")
    assert not set(other["pid"].to_pylist()) & {int(pid) for pid in warm_pids()}
    assert set(other["mark"].to_pylist()) == {"other"} and not any(other["preloaded"].to_pylist())
    for name in ("first", "second", "other"):
        assert_output_sound(tmp_path / name, range(300))

    # Once the head is gone, so are the environments and warm counts it kept for its workers.
    stop_shared_heads(root.parent.parent)
    assert not list((root / "envs").iterdir()) and not list((root / "warm").iterdir())


# A run whose replica holds a GPU and a CPU, and whose read tasks need another CPU: on a head of
# 2 CPUs, two such runs started together without turns each got their replica and no read CPU,
# and neither finished (seen: 150 s).
PIPELINE = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
stages = [Stage("tests.support.predictors:WaitWhileMarked", {"marker": sys.argv[3]}, num_gpus=1)]
timeout = float(sys.argv[4]) if len(sys.argv) > 4 else None
run_batch_inference(
    BatchInferenceConfig(sys.argv[1], sys.argv[2], stages, id_column="id", rows_per_range=500, progress_timeout=timeout)
)
"""


def test_tasks_started_together_on_a_small_head_take_turns_instead_of_stalling(shared, tmp_path):
    env, _ = shared
    env = {**env, "RAYBATCH_LOCAL_RAY_NUM_CPUS": "2", "RAYBATCH_LOCAL_RAY_NUM_GPUS": "2"}  # GPUs Ray only counts
    write_input(tmp_path / "in", [2000])
    marker = tmp_path / "hold"
    marker.touch()  # the run that gets its turn first holds both CPUs until the marker goes

    def start(name: str, *extra: str) -> tuple[subprocess.Popen, Path]:
        log_path = tmp_path / f"{name}.log"
        args = [sys.executable, "-c", PIPELINE, str(tmp_path / "in"), str(tmp_path / f"out-{name}"), str(marker)]
        with log_path.open("w") as log_file:
            return subprocess.Popen([*args, *extra], env=env, stdout=log_file, stderr=subprocess.STDOUT), log_path

    runs = [start("a"), start("b")]
    waiting = (
        "Waiting for the shared local Ray's CPU: this task needs 2 CPU, 1 GPU at once, "
        "other tasks hold 2 CPU, 1 GPU of 2 CPU, 2 GPU"
    )
    assert wait_until(lambda: any(waiting in path.read_text() for _, path in runs), 180), [
        path.read_text() for _, path in runs
    ]
    holder = next(process for process, path in runs if waiting not in path.read_text())

    # A task that cannot get its turn within its progress_timeout fails, naming who holds the head.
    late, late_log = start("c", "3")
    assert late.wait(timeout=120) != 0
    assert re.search(
        rf"NoProgressError: waited \d+ s \(progress_timeout\) for the shared local Ray's CPU.*"
        rf"\(task processes \[{holder.pid}\]\)",
        late_log.read_text(),
    ), late_log.read_text()

    marker.unlink()
    for process, path in runs:
        assert process.wait(timeout=300) == 0, path.read_text()
        assert_output_sound(tmp_path / f"out-{path.stem}", range(2000))
    assert sum("Got this task's share of the shared local Ray after" in path.read_text() for _, path in runs) == 1


def test_a_worker_whose_environment_file_is_gone_fails_to_start_rather_than_run_without_it(tmp_path, monkeypatch):
    monkeypatch.setenv(JOB_ENV_FILE_ENV, str(tmp_path / "gone.env"))
    with pytest.raises(FileNotFoundError):
        apply_job_environment()


def test_settings_from_the_environment():
    assert LocalRaySettings.from_env({}) == LocalRaySettings()
    assert LocalRaySettings.from_env({}).idle_timeout_s == 600
    settings = LocalRaySettings.from_env(
        {
            "RAYBATCH_LOCAL_RAY": "per_task",
            "RAYBATCH_LOCAL_RAY_IDLE_TIMEOUT_S": "30",
            "RAYBATCH_LOCAL_RAY_DIR": "/x",
            "RAYBATCH_LOCAL_RAY_NUM_CPUS": "4",
        }
    )
    assert settings == LocalRaySettings(mode="per-task", idle_timeout_s=30, base_dir="/x", num_cpus=4)
    assert not settings.shared
    with pytest.raises(ConfigError, match="RAYBATCH_LOCAL_RAY must be"):
        LocalRaySettings.from_env({"RAYBATCH_LOCAL_RAY": "global"})
    with pytest.raises(ConfigError, match="RAYBATCH_LOCAL_RAY_IDLE_TIMEOUT_S"):
        LocalRaySettings.from_env({"RAYBATCH_LOCAL_RAY_IDLE_TIMEOUT_S": "0"})
    with pytest.raises(ConfigError, match="RAYBATCH_LOCAL_RAY_NUM_GPUS"):
        LocalRaySettings.from_env({"RAYBATCH_LOCAL_RAY_NUM_GPUS": "one"})


def test_head_folder_is_per_user_ray_version_and_python(tmp_path):
    settings = LocalRaySettings(base_dir=str(tmp_path))
    folder = head_dir(settings, "2.60.0")
    assert folder.parent == tmp_path / f"rbray-{os.getuid()}"
    assert folder.name.startswith("2.60.0-")
    assert head_dir(settings, "2.61.0") != folder


def long_folder(parent: Path, length: int = 60) -> Path:
    """An ordinary folder path of ``length`` characters under ``parent``: Ray's socket paths under it would be too
    long (107 bytes at most) without the short link the provider gives Ray."""
    folder = parent / "airflow-worker-local-ray"
    return folder.with_name(folder.name + "x" * (length - len(str(folder))))


def remove_links_to(folder: Path) -> None:
    """Remove the short links the provider made to Ray temp dirs under ``folder`` (``settings.ray_temp_dir``)."""
    for link in Path(f"/tmp/rbray-{os.getuid()}").glob("*"):
        if link.is_symlink() and os.readlink(link).startswith(str(folder)):
            link.unlink()


def test_a_shared_ray_in_a_long_folder_starts_and_keeps_its_sessions_there(shared):
    env, _ = shared
    base = long_folder(Path(env["RAYBATCH_LOCAL_RAY_DIR"]))
    assert len(str(base)) == 60
    env = {**env, "RAYBATCH_LOCAL_RAY_DIR": str(base)}
    root = head_dir(LocalRaySettings(base_dir=str(base)))
    try:
        task = Task(env, "long")
        info = task.info()
        task.finish()
        assert info["worker"]["mark"] == "long"
        # Ray's sessions (logs, spilled objects) are in the folder asked for, not elsewhere.
        sessions = [p for p in (root / "r").iterdir() if p.name.startswith("session_2") and not p.is_symlink()]
        assert len(sessions) == 1 and (sessions[0] / "logs").is_dir()
    finally:
        stop_shared_heads(base)
        remove_links_to(base)
    assert head_processes(root) == []


PER_TASK_PROBE = """
import os
import ray
from airflow_provider_raybatch.pipeline.runtime.local_ray import ray_session
with ray_session():
    session = ray._private.worker._global_node.get_session_dir_path()
    print("RAN", ray.get(ray.remote(lambda: os.getpid()).remote()), os.path.realpath(session), flush=True)
"""


def test_a_per_task_ray_under_a_long_ray_tmpdir_starts_and_keeps_its_sessions_there():
    folder = long_folder(Path(tempfile.mkdtemp(prefix="rbl", dir="/tmp")))
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAYBATCH_LOCAL_RAY": "per-task", "RAY_TMPDIR": str(folder)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", PER_TASK_PROBE], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout + done.stderr
        session = done.stdout.split("RAN ", 1)[1].split()[1]
        assert session.startswith(f"{folder}/ray/session_")
    finally:
        remove_links_to(folder)
        shutil.rmtree(folder.parent, ignore_errors=True)


def test_a_folder_too_long_for_rays_sockets_gets_a_short_link_or_a_config_error_naming_the_setting(tmp_path):
    # Imported here: without it, only this test fails, not the module.
    from airflow_provider_raybatch.pipeline.runtime.shared.settings import ray_temp_dir

    links = Path(tempfile.mkdtemp(prefix="l", dir="/tmp"))  # as short as /tmp/rbray-<uid> with a long uid
    try:
        short = Path("/tmp/rbray-0/2.60.0-8655c2/r")  # the default folder: Ray gets it as it is
        assert ray_temp_dir(short, "RAYBATCH_LOCAL_RAY_DIR", links) == short
        folder = long_folder(tmp_path, 120)
        link = ray_temp_dir(folder, "RAYBATCH_LOCAL_RAY_DIR", links)
        assert link.parent == links / f"rbray-{os.getuid()}" and os.readlink(link) == str(folder)
        assert ray_temp_dir(folder, "RAYBATCH_LOCAL_RAY_DIR", links) == link  # the same link, again

        (links / "file").touch()  # where no link can be made
        with pytest.raises(ConfigError) as raised:
            ray_temp_dir(folder, "RAY_TMPDIR", links / "file")
        message = str(raised.value)
        assert message.startswith("RAY_TMPDIR is too long for Ray: its socket paths under ")
        assert "up to 187 bytes, over the limit of 107 for a Unix socket path" in message
        assert message.endswith("Shorten RAY_TMPDIR by at least 80 characters.")
    finally:
        shutil.rmtree(links)
