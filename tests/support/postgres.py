"""A throwaway PostgreSQL server on loopback: Airflow's production metadata database for the
end-to-end test.

The server runs from the binaries of Debian's ``postgresql`` package (``.ci/run`` installs it
when missing), in a temporary folder owned by the ``postgres`` system user when the test runs as
root (PostgreSQL refuses to run as root), listening on 127.0.0.1 only, with its unix socket in
that folder. It is stopped and its folder removed when the context ends, failure or not.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port

#: The system user that owns and runs the server when the test runs as root (Debian's package creates it).
SERVER_USER = "postgres"


@dataclass(frozen=True)
class PostgresServer:
    """A running server and the database made for its one client (a role that owns it, random password)."""

    folder: Path
    port: int
    database: str
    user: str
    password: str

    def url(self, driver: str = "psycopg2") -> str:
        return f"postgresql+{driver}://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.database}"

    def query(self, sql: str, *params: object) -> list[tuple]:
        """The rows of one statement, as the database's role over TCP (a connection of its own, closed after)."""
        import psycopg2

        connection = psycopg2.connect(
            host="127.0.0.1", port=self.port, dbname=self.database, user=self.user, password=self.password
        )
        try:
            with connection, connection.cursor() as cursor:
                cursor.execute(sql, params)
                return cursor.fetchall()
        finally:
            connection.close()


def server_binaries() -> Path:
    """The folder holding initdb and pg_ctl: on PATH, or the newest under /usr/lib/postgresql (Debian)."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).resolve().parent
    versions = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.name)],
    )
    if not versions:
        raise RuntimeError(
            "PostgreSQL's server binaries (initdb, pg_ctl) are missing: the end-to-end test runs Airflow on "
            "PostgreSQL. Install Debian's package as root (`apt-get install postgresql`; .ci/run does this)."
        )
    return versions[-1]


@contextlib.contextmanager
def postgres_server(database: str = "airflow", user: str = "airflow") -> Iterator[PostgresServer]:
    """Start a fresh server, create ``database`` owned by ``user``; stop it and delete its folder at the end."""
    binaries = server_binaries()
    as_root = os.geteuid() == 0
    owner = pwd.getpwnam(SERVER_USER) if as_root else pwd.getpwuid(os.geteuid())
    # Short: the socket path (folder + /.s.PGSQL.<port>) must fit in 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="rbpg-", dir="/tmp"))
    data = folder / "data"
    os.chown(folder, owner.pw_uid, owner.pw_gid)

    def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(binaries / args[0]), *args[1:]],
            user=owner.pw_uid if as_root else None,
            group=owner.pw_gid if as_root else None,
            extra_groups=[] if as_root else None,
            cwd=folder,
            check=True,
            capture_output=True,
            text=True,
            **kwargs,
        )

    port, password = free_port(), secrets.token_hex(16)
    started = False
    try:
        try:
            # The superuser is the owner, over the socket only (peer); TCP clients need a password.
            run("initdb", "-D", str(data), "-U", owner.pw_name, "--auth-local=peer", "--auth-host=scram-sha-256",
                "--no-locale", "-E", "UTF8", "--no-sync")  # fmt: skip
            options = (
                f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={folder} "
                # A test database: durability is not the point, speed is.
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            )
            started = True  # from here on, stop it: pg_ctl may fail after the server came up
            run("pg_ctl", "-D", str(data), "-l", str(folder / "server.log"), "-o", options, "-w", "-t", "60", "start")
            psql = ("psql", "-h", str(folder), "-p", str(port), "-d", "postgres", "-v", "ON_ERROR_STOP=1")
            run(*psql, "-c", f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
            run(*psql, "-c", f"CREATE DATABASE {database} OWNER {user}")
        except subprocess.CalledProcessError as error:
            log = folder / "server.log"
            detail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            raise RuntimeError(f"{Path(error.cmd[0]).name} failed: {error.stderr}\n{detail}") from error
        yield PostgresServer(folder, port, database, user, password)
    finally:
        if started:
            _stop(run, data)
        shutil.rmtree(folder, ignore_errors=True)


def _stop(run, data: Path) -> None:
    """Fast shutdown (clients disconnected); if that fails, kill the postmaster by its pid."""
    try:
        run("pg_ctl", "-D", str(data), "-m", "fast", "-w", "-t", "30", "stop")
    except (subprocess.CalledProcessError, OSError):
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((data / "postmaster.pid").read_text().splitlines()[0])
            os.kill(pid, 9)
            time.sleep(1)  # its backends exit when the postmaster is gone
