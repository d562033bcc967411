"""Real storage servers on loopback for the object-store tests: a GCS emulator, Azurite, an OAuth token endpoint.

moto's S3 (and STS) is ``benchmarks.support.data.moto_s3``. Each server here is a real process speaking
the store's HTTP API; the tests reach it through gcsfs / adlfs exactly as a cloud would be reached.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Azurite, installed once by npm into this git-ignored folder (node 20 and npm are on the machine).
AZURITE_VERSION = "3.37.0"
AZURITE_PREFIX = REPO / ".cache" / "azurite"


class ServerUnavailable(RuntimeError):
    """A server could not be installed or started (the fixture fails in CI, skips locally)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerUnavailable(f"exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise ServerUnavailable(f"not listening on {port} after {timeout_s:.0f} s: {log.read_text()[-2000:]}")


@dataclass
class Server:
    proc: subprocess.Popen
    endpoint: str
    log: Path
    extra: dict = field(default_factory=dict)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def gcs_emulator(work: Path) -> Server:
    """``gcp-storage-emulator`` (PyPI) in memory, logging every request line (with its query) to a file."""
    try:
        import gcp_storage_emulator  # noqa: F401
    except ImportError as e:
        raise ServerUnavailable(f"gcp-storage-emulator is not installed ({e}); it comes with the dev extra") from e
    port, log = free_port(), work / "gcs-emulator.log"
    args = [sys.executable, "-m", "tests.support.gcs_emulator", "start", "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "wb") as out:
        # From the checkout: the emulator runs with the move call added (tests/support/gcs_emulator.py).
        proc = subprocess.Popen([*args, "--in-memory"], stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    _wait_for_port(port, proc, log)
    return Server(proc, f"http://127.0.0.1:{port}", log)


def azurite_bin() -> Path:
    """Azurite's blob server, installed with npm into ``.cache/azurite`` on first use."""
    binary = AZURITE_PREFIX / "node_modules" / ".bin" / "azurite-blob"
    installed = AZURITE_PREFIX / "node_modules" / "azurite" / "package.json"
    if binary.exists() and json.loads(installed.read_text()).get("version") == AZURITE_VERSION:
        return binary
    npm = shutil.which("npm")
    if npm is None:
        raise ServerUnavailable("npm is not installed: Azurite (npm package azurite) cannot be installed")
    AZURITE_PREFIX.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "install", "--prefix", str(AZURITE_PREFIX), "--no-audit", "--no-fund", f"azurite@{AZURITE_VERSION}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 or not binary.exists():
        raise ServerUnavailable(f"npm install azurite@{AZURITE_VERSION} failed: {done.stderr[-2000:]}")
    return binary


def azurite(work: Path) -> Server:
    """Azurite's Blob service (in memory) with an account of our own and a fresh random key."""
    binary = azurite_bin()
    port, log = free_port(), work / "azurite.log"
    account, key = "raybatchacct", base64.b64encode(secrets.token_bytes(64)).decode()
    env = {**os.environ, "AZURITE_ACCOUNTS": f"{account}:{key}"}
    args = [str(binary), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*args, "--skipApiVersionCheck", "--loose"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    _wait_for_port(port, proc, log)
    return Server(proc, f"http://127.0.0.1:{port}/{account}", log, {"account": account, "key": key})


class TokenEndpoint:
    """An OAuth 2.0 token endpoint on loopback, where a service account's key file points its ``token_uri``.

    Google's endpoint cannot be reached from here; this one answers google-auth's signed JWT
    bearer grant with a fresh access token, so the service-account flow of a GCP connection runs
    for real (key parsing, JWT signing, token refresh) and its secrets can be looked for afterwards.
    """

    def __init__(self) -> None:
        self.tokens: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                token = "ya29.raybatch-" + secrets.token_urlsafe(24)
                owner.tokens.append(token)
                body = json.dumps({"access_token": token, "expires_in": 3600, "token_type": "Bearer"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def service_account_key(token_uri: str, project: str = "raybatch-test") -> dict:
    """A service account key file's content with a freshly generated RSA key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {
        "type": "service_account",
        "project_id": project,
        "private_key_id": secrets.token_hex(20),
        "private_key": pem,
        "client_email": f"raybatch@{project}.iam.gserviceaccount.com",
        "client_id": "1" * 21,
        "token_uri": token_uri,
    }
