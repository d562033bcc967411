"""A Docker engine for the compose test: the one running, or Debian's `docker.io` started here.

On a machine without an engine (CI's fresh machine, a developer's box) and with root and
apt-get, :func:`ensure_engine` installs `docker.io`, `docker-compose` (1.29, Python; the compose
v2 plugin is not packaged) and `mmdebstrap` (for the stand-in base images), then starts `dockerd`
with its own data root, so images built once stay for later sessions. It stops only the daemon it
started. Without root or apt-get it returns a reason to skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = {"dockerd": "docker.io", "docker-compose": "docker-compose", "mmdebstrap": "mmdebstrap"}
#: The daemon started here keeps its images under this folder between sessions.
DATA_ROOT = Path(os.environ.get("RAYBATCH_DOCKER_DATA_ROOT", "/var/lib/raybatch-docker"))
RUN_DIR = Path("/run/raybatch-docker")
SOCKET = RUN_DIR / "docker.sock"


class EngineUnavailable(Exception):
    """No engine runs and none can be started here; the message says why."""


@dataclass
class Engine:
    #: Environment for `docker` and `docker-compose` subprocesses (DOCKER_HOST of this engine).
    env: dict[str, str]
    process: subprocess.Popen | None = None
    log: Path | None = None
    installed: list[str] = field(default_factory=list)

    def run(self, *args: str, check: bool = True, timeout: float = 1800, **kwargs) -> subprocess.CompletedProcess:
        """Run a command (`docker ...`, `docker-compose ...`) against this engine, output captured."""
        result = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs)
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
            )
        return result

    def image_exists(self, tag: str) -> bool:
        return self.run("docker", "image", "inspect", tag, check=False).returncode == 0

    def stop(self) -> None:
        """Stop the daemon if this session started it (its containers stop with it)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _responds(env: dict[str, str]) -> bool:
    if not shutil.which("docker", path=env.get("PATH")):
        return False
    try:
        return subprocess.run(["docker", "info"], env=env, capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _install(missing: list[str]) -> None:
    if os.geteuid() != 0:
        raise EngineUnavailable(
            f"{', '.join(missing)} not installed and not root (apt-get install {' '.join(missing)})"
        )
    if not shutil.which("apt-get"):
        raise EngineUnavailable(f"{', '.join(missing)} not installed and no apt-get here")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
    ):
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
        if result.returncode != 0:
            raise EngineUnavailable(f"{' '.join(command)} failed: {result.stderr[-2000:]}")


def ensure_engine(log_dir: Path) -> Engine:
    """The running engine, or one started here (installing its packages first).

    :param log_dir: where the started daemon's log goes.
    :raises EngineUnavailable: when neither is possible, with the reason.
    """
    # The classic builder: BuildKit needs the buildx plugin with recent clients, which Debian's
    # docker.io does not ship; the Dockerfiles need nothing BuildKit-only.
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    missing = [package for tool, package in PACKAGES.items() if not shutil.which(tool)]
    if not missing and _responds(env):
        return Engine(env=env)
    own = {**env, "DOCKER_HOST": f"unix://{SOCKET}"}
    if SOCKET.exists() and _responds(own):  # started by an earlier session and left running
        return Engine(env=own)
    installed = []
    if missing:
        _install(missing)
        installed = missing
    if _responds(env):  # the package may have started the system's daemon
        return Engine(env=env, installed=installed)
    if os.geteuid() != 0:
        raise EngineUnavailable("no Docker engine responds and starting dockerd needs root")
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    log = log_dir / "dockerd.log"
    command = [
        shutil.which("dockerd") or "/usr/sbin/dockerd",
        f"--host=unix://{SOCKET}",
        f"--data-root={DATA_ROOT}",
        f"--exec-root={RUN_DIR / 'exec'}",
        f"--pidfile={RUN_DIR / 'dockerd.pid'}",
    ]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    engine = Engine(env=own, process=process, log=log, installed=installed)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EngineUnavailable(f"dockerd exited {process.returncode}: {log.read_text()[-2000:]}")
        if _responds(own):
            return engine
        time.sleep(1)
    engine.stop()
    raise EngineUnavailable(f"dockerd did not answer within 60 s: {log.read_text()[-2000:]}")
