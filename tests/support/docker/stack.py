"""docker/compose.yaml run for real: images, an env file, `docker-compose up`, the Airflow API.

Every published port listens on 127.0.0.1 at a free port; the containers talk to each other on
the compose network only. The Airflow API is driven with the admin user the stack's init
creates (FAB auth manager: a JWT from /auth/token).
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import REPO, free_port
from tests.support.docker import images
from tests.support.docker.engine import Engine

PROJECT = "raybatch-compose-test"
COMPOSE_FILE = REPO / "docker" / "compose.yaml"
DEMO_DATE = "2026-11-21"


@dataclass
class ComposeStack:
    engine: Engine
    env_file: Path
    settings: dict[str, str]
    timings: list[str] = field(default_factory=list)
    _token: str | None = None

    # -- compose ---------------------------------------------------------------------------
    def compose(self, *args: str, check: bool = True, timeout: float = 900):
        return self.engine.run(
            self.compose_cli(),
            "--project-name",
            PROJECT,
            "--env-file",
            str(self.env_file),
            "--file",
            str(COMPOSE_FILE),
            *args,
            check=check,
            timeout=timeout,
        )

    @staticmethod
    def compose_cli() -> str:
        return shutil.which("docker-compose") or "docker-compose"

    def set(self, **settings: str) -> None:
        """Change settings in the env file (a later `up` recreates the services they touch)."""
        self.settings.update(settings)
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in self.settings.items()))

    def logs(self, *services: str, tail: int = 80) -> str:
        result = self.compose("logs", "--no-color", f"--tail={tail}", *services, check=False, timeout=120)
        return result.stdout[-20000:]

    def down(self) -> None:
        # The stack is thrown away: its services get 1 s to stop, not Docker's 10 (measured: 4 s instead of 10).
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "1", check=False, timeout=300)

    def wait_healthy(self, services: list[str], timeout: float = 600) -> None:
        """Wait until each service's own health check passes, run here in its container every few seconds.

        Not Docker's health status: Docker runs the check at its interval, 30 s for the Airflow services, so the
        status turns healthy 30 s (or 60...) after a service started, however soon it was ready (at the stack's
        start: 33 s instead of 12, measured under load; docs/development.md).
        """
        deadline = time.monotonic() + timeout
        pending = list(services)
        while pending and time.monotonic() < deadline:
            for service in list(pending):
                if self.passes_health_check(service):
                    pending.remove(service)
            if pending:
                time.sleep(3)
        if pending:
            raise AssertionError(f"not healthy after {timeout:.0f} s: {pending}\n{self.logs(*pending)}")

    def passes_health_check(self, service: str) -> bool:
        """Whether the service runs and the health check of its compose definition passes now (`docker exec`)."""
        ids = self.compose("ps", "-q", service, check=False).stdout.split()
        if not ids:
            return False
        found = self.engine.run("docker", "inspect", ids[0], check=False)
        if found.returncode != 0:  # removed meanwhile
            return False
        (container,) = json.loads(found.stdout)
        state, check = container["State"], container["Config"]["Healthcheck"]
        if not state.get("Running"):
            return False
        if state.get("Health", {}).get("Status") == "healthy":
            return True
        kind, *command = check["Test"]
        command = ["sh", "-c", *command] if kind == "CMD-SHELL" else command
        timeout = (check.get("Timeout") or 30 * 10**9) / 10**9  # nanoseconds; Docker's default when unset
        try:
            return self.engine.run("docker", "exec", ids[0], *command, check=False, timeout=timeout).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def wait_running(self, services: list[str]) -> None:
        for service in services:
            ids = self.compose("ps", "-q", service, check=False).stdout.split()
            running = (
                ids
                and self.engine.run(
                    "docker", "inspect", "--format", "{{.State.Running}}", ids[0], check=False
                ).stdout.strip()
                == "true"
            )
            assert running, f"{service} is not running\n{self.logs(service)}"

    # -- Airflow API -------------------------------------------------------------------------
    @property
    def airflow_url(self) -> str:
        return f"http://127.0.0.1:{self.settings['AIRFLOW_PORT']}"

    def _request(self, method: str, path: str, body: dict | None = None, auth: bool = True) -> dict:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        request = urllib.request.Request(
            self.airflow_url + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers=headers,
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read() or b"{}")

    def token(self) -> str:
        if self._token is None:
            self._token = self._request(
                "POST",
                "/auth/token",
                {"username": self.settings["AIRFLOW_ADMIN_USER"], "password": self.settings["AIRFLOW_ADMIN_PASSWORD"]},
                auth=False,
            )["access_token"]
        return self._token

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        """A call to /api/v2 (raises urllib.error.HTTPError on an error status)."""
        return self._request(method, "/api/v2" + path, body)

    def wait_for_dag(self, dag_id: str, timeout: float = 300) -> dict:
        """The DAG once the dag-processor has parsed it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.api("GET", f"/dags/{dag_id}")
            except urllib.error.HTTPError as error:
                if error.code != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(3)

    def run_dag(self, dag_id: str, run_id: str, logical_date: str, timeout: float = 900) -> tuple[str, set[str]]:
        """Trigger a run and wait for its end: its state and every task state seen while it ran."""
        self.api("POST", f"/dags/{dag_id}/dagRuns", {"dag_run_id": run_id, "logical_date": logical_date})
        seen: set[str] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            tis = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
            seen |= {ti["state"] for ti in tis if ti["state"]}
            state = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]
            if state in ("success", "failed"):
                return state, seen
            time.sleep(1)
        raise AssertionError(f"{dag_id} {run_id} still running after {timeout:.0f} s (task states {seen})")

    # -- the S3 store --------------------------------------------------------------------------
    def s3(self):
        import s3fs

        return s3fs.S3FileSystem(
            key=self.settings["MINIO_ROOT_USER"],
            secret=self.settings["MINIO_ROOT_PASSWORD"],
            client_kwargs={"endpoint_url": f"http://127.0.0.1:{self.settings['S3_PORT']}", "region_name": "us-east-1"},
        )


def secret(size: int) -> str:
    """A random secret that never starts with "-" (a CLI would read it as an option)."""
    return "s" + secrets.token_urlsafe(size)


def start_stack(engine: Engine, workdir: Path, timings: list[str]) -> ComposeStack:
    """Build the images (stand-ins once per machine, the project's on top) and start the stack.

    :param timings: gets how long each image build and the start-up took.
    """
    images.ensure_standins(engine, timings)
    images.build_project_images(engine, timings)
    settings = {
        "RAY_AUTH_TOKEN": secret(24),
        "POSTGRES_PASSWORD": secret(16),
        "AIRFLOW_JWT_SECRET": secret(32),
        "AIRFLOW_ADMIN_USER": "admin",
        "AIRFLOW_ADMIN_PASSWORD": secret(16),
        "MINIO_ROOT_USER": "raybatch",
        "MINIO_ROOT_PASSWORD": secret(16),
        "RAYBATCH_DEMO_DATE": DEMO_DATE,
        "BIND_ADDRESS": "127.0.0.1",
        "AIRFLOW_PORT": str(free_port()),
        "RAY_DASHBOARD_PORT": str(free_port()),
        "S3_PORT": str(free_port()),
        "S3_CONSOLE_PORT": str(free_port()),
        "RAY_HEAD_CPUS": "2",
        "RAY_WORKER_CPUS": "2",
        "AIRFLOW_DEFAULT_DEFERRABLE": "false",
    }
    stack = ComposeStack(engine=engine, env_file=workdir / ".env", settings={}, timings=timings)
    stack.set(**settings)
    stack.down()  # what an interrupted earlier session left
    started = time.monotonic()
    try:
        stack.compose("up", "--detach", "--no-build", timeout=1200)
        # The dag-processor's and triggerer's health checks start the Airflow CLI, which can take
        # longer than their timeout on a loaded machine: the tests prove both work instead (the
        # DAG gets parsed; the deferred run resumes from the triggerer).
        stack.wait_healthy(["airflow-apiserver", "airflow-scheduler"])
        stack.wait_running(["airflow-dag-processor", "airflow-triggerer", "ray-worker"])
    except Exception:
        stack.down()
        raise
    timings.append(f"stack up: {time.monotonic() - started:.0f} s")
    return stack
