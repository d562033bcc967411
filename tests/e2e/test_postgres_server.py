"""The end-to-end test's PostgreSQL server (tests/support/postgres.py): reachable with its password on
loopback only, run by the ``postgres`` user when the test is root, and gone after a failure."""

from __future__ import annotations

import os
import pwd
import socket
import time
from pathlib import Path

import psycopg2
import pytest

from tests.support.postgres import SERVER_USER, postgres_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_the_server_serves_its_database_and_is_gone_after_a_failure():
    with pytest.raises(RuntimeError, match="the test body failed"), postgres_server() as server:
        query = "SELECT current_user, current_database(), setting FROM pg_settings WHERE name = %s"
        assert server.query(query, "listen_addresses") == [("airflow", "airflow", "127.0.0.1")]
        with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
            psycopg2.connect(host="127.0.0.1", port=server.port, dbname="airflow", user="airflow", password="wrong")
        pid = int((server.folder / "data" / "postmaster.pid").read_text().splitlines()[0])
        owner = os.stat(f"/proc/{pid}").st_uid
        assert owner == (pwd.getpwnam(SERVER_USER).pw_uid if os.geteuid() == 0 else os.geteuid())
        assert (server.folder / f".s.PGSQL.{server.port}").is_socket()
        raise RuntimeError("the test body failed")

    assert not server.folder.exists()
    assert not _alive(pid)
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", server.port)) != 0


def _alive(pid: int, wait_s: float = 5.0) -> bool:
    """Whether the process still runs after ``wait_s`` (a zombie awaiting its reaping by init is not)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state == "Z":
            return False
        time.sleep(0.1)
    return True
