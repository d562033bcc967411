"""The writer lease on real filesystems (local and a moto S3 server): one holder, takeovers, fencing."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from airflow_provider_raybatch.pipeline.commit.lease import Lease, LeaseHolder
from airflow_provider_raybatch.pipeline.errors import LeaseLostError, OutputBusyError
from airflow_provider_raybatch.pipeline.prepare import prepare
from airflow_provider_raybatch.pipeline.status import read_status
from airflow_provider_raybatch.pipeline.store.files import resolve
from tests.support.data import write_input
from tests.support.leases import write_holder
from tests.support.pipeline_runs import config


def lease(path: str, holder: LeaseHolder | None = None, timeout_s: float = 60.0, storage_options=None) -> Lease:
    fs, folder = resolve(path, storage_options)
    return Lease(fs, folder, path, holder or LeaseHolder(), timeout_s)


@pytest.fixture(
    params=["local", pytest.param("s3", marks=pytest.mark.servers), pytest.param("abfs", marks=pytest.mark.servers)]
)
def folder(request, tmp_path):
    """A lease folder on each store whose server honours create-if-absent (the GCS emulator does not:
    see tests/test_object_stores.py)."""
    if request.param == "local":
        return str(tmp_path / "lease"), None
    if request.param == "abfs":
        server = request.getfixturevalue("azure_server")
        account, key = server.extra["account"], server.extra["key"]
        options = {"connection_string": f"AccountName={account};AccountKey={key};BlobEndpoint={server.endpoint};"}
        fs, _ = resolve("abfs://raybatch-leases", options)
        if "raybatch-leases" not in {p.rstrip("/") for p in fs.ls("")}:
            fs.mkdir("raybatch-leases")
        return f"abfs://raybatch-leases/{tmp_path.name}", options
    options = request.getfixturevalue("s3_server")
    return f"s3://raybatch-test/leases/{tmp_path.name}", options


def test_one_holder_at_a_time_and_a_released_lease_is_taken(folder):
    path, options = folder
    first = lease(path, LeaseHolder(run_key="dag_a/run_1/predict/-1", try_number=1), storage_options=options)
    first.acquire()
    second = lease(path, LeaseHolder(run_key="dag_a/run_2/predict/-1", try_number=1), storage_options=options)
    with pytest.raises(
        OutputBusyError,
        match=r"is being written by dag dag_a, run run_1, task predict, try 1, pid \d+ on host .* since .*; "
        r"last heartbeat \d+ s ago",
    ):
        second.acquire()
    first.check()  # still the holder
    first.release()
    second.acquire()
    assert second.record.generation == 2
    with pytest.raises(LeaseLostError, match="no lease held"):
        first.check()  # a released writer commits nothing more either
    second.release()


def test_racing_writers_exactly_one_wins(folder):
    path, options = folder
    leases = [lease(path, LeaseHolder(run_key=f"d/r/t{i}/-1"), storage_options=options) for i in range(6)]
    outcomes: list[str] = []
    barrier = threading.Barrier(len(leases))

    def take(item: Lease) -> None:
        barrier.wait()
        try:
            item.acquire()
            outcomes.append("won")
        except OutputBusyError:
            outcomes.append("busy")

    threads = [threading.Thread(target=take, args=(item,)) for item in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["busy"] * 5 + ["won"]
    for item in leases:
        if item.record is not None:
            item.release()


def test_a_stale_heartbeat_is_taken_over_and_the_old_holder_is_fenced(tmp_path):
    path = str(tmp_path / "lease")
    # A holder on another host whose heartbeat stopped (its machine froze): its file, as it left it.
    old = lease(path, LeaseHolder(run_key="d/r/t/-1", try_number=1, host="worker-7"), timeout_s=1.0)
    old.acquire()
    old._stop.set()  # its heartbeat thread stops, as a frozen process's would
    old._thread.join()
    newer = lease(path, LeaseHolder(run_key="d/r/t/-1", try_number=2), timeout_s=1.0)
    with pytest.raises(OutputBusyError, match="try 1, pid .* on host worker-7"):
        newer.acquire()
    time.sleep(1.3)
    newer.acquire()
    with pytest.raises(LeaseLostError, match=r"taken over by dag d, run r, task t, try 2"):
        old.check()
    newer.release()


def test_a_writer_that_could_not_renew_stops_by_itself(tmp_path):
    holder = lease(str(tmp_path / "lease"), timeout_s=0.4)
    holder.acquire()
    holder._stop.set()
    holder._thread.join()
    time.sleep(0.3)
    with pytest.raises(LeaseLostError, match=r"was not renewed for 0 s \(lease_timeout=0.4 s\)"):
        holder.check()


def test_the_lease_of_a_killed_process_on_this_host_is_taken_at_once(tmp_path):
    path = str(tmp_path / "lease")
    code = (
        "import sys, time\n"
        "from airflow_provider_raybatch.pipeline.commit.lease import Lease, LeaseHolder\n"
        "from airflow_provider_raybatch.pipeline.store.files import resolve\n"
        "fs, folder = resolve(sys.argv[1])\n"
        "Lease(fs, folder, sys.argv[1], LeaseHolder(run_key='d/r/t/-1', try_number=1), 3600).acquire()\n"
        "print('held', flush=True)\n"
        "time.sleep(3600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    retry = lease(path, LeaseHolder(run_key="d/r/t/-1", try_number=2), timeout_s=3600)
    with pytest.raises(OutputBusyError, match="try 1"):
        retry.acquire()  # alive: busy
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    retry.acquire()  # its holder is gone: no need to wait an hour
    record = json.loads((tmp_path / "lease" / f"{retry.record.generation:012d}.json").read_text())
    assert record["holder"]["try_number"] == 2
    retry.release()


def test_a_release_that_cannot_write_does_not_hide_the_error_the_run_ends_on(tmp_path, caplog):
    disk = tmp_path / "small-disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        held = lease(str(disk / "lease"))
        held.acquire()
        # The disk fills up, as under the failing run.
        with open(disk / "filler", "wb", buffering=0) as f, pytest.raises(OSError, match="No space left"):
            while True:
                f.write(b"\0" * 4096)
        held.release()  # does not raise: the lease simply expires
        assert "Could not release the lease" in caplog.text
        assert held.record is None
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_lease_records_its_timeout_and_one_from_a_newer_release_is_still_read(tmp_path):
    first = lease(str(tmp_path / "lease"), timeout_s=42.0)
    first.acquire()
    first.release()
    path = sorted((tmp_path / "lease").glob("*.json"))[-1]
    record = json.loads(path.read_text())
    assert record["timeout_s"] == 42.0
    # Fields a newer release adds, to the record and to its holder, do not make the lease unreadable.
    record["added_later"], record["holder"]["added_later"] = 1, 2
    path.write_text(json.dumps(record))
    second = lease(str(tmp_path / "lease"))
    second.acquire()  # the released lease is read and taken
    second.release()


@pytest.fixture(scope="module")
def planned_output(tmp_path_factory):
    """An output whose plan is recorded (what ``raybatch status`` reads), its lease given back."""
    tmp_path = tmp_path_factory.mktemp("planned")
    write_input(tmp_path / "in", [100])
    prepare(config(tmp_path)).release()
    return tmp_path / "out"


#: (holder's recorded lease_timeout or None for an older release's record, its heartbeat's age,
#: the taker's lease_timeout, whether the holder is live). The holder's own timeout decides, in
#: both directions; a record without one is judged by DEFAULT_LEASE_TIMEOUT_S (120 s).
MATRIX = [
    (600, 100, 30, True),  # a slow-beating holder, a taker with a short timeout: not taken (issue 41)
    (600, 700, 30, False),
    (600, 700, 3600, False),  # stale by its own timeout, whatever the taker's
    (30, 20, 3600, True),
    (30, 60, 3600, False),
    (None, 100, 30, True),
    (None, 200, 3600, False),
    (None, 200, 30, False),
]


@pytest.mark.parametrize(("holder_timeout", "age", "taker_timeout", "live"), MATRIX)
def test_a_holder_is_judged_by_its_own_timeout_by_takers_and_status_alike(
    planned_output, holder_timeout, age, taker_timeout, live
):
    folder = planned_output / "_raybatch" / "lease"
    shutil.rmtree(folder, ignore_errors=True)
    write_holder(folder, age, holder_timeout)
    assert read_status(str(planned_output)).lease.live is live
    taker = lease(str(folder), LeaseHolder(run_key="dag_a/run_1/score/-1", try_number=2), timeout_s=taker_timeout)
    if live:
        with pytest.raises(OutputBusyError, match=rf"on host worker-7 .*taken over after {holder_timeout or 120:g} s"):
            taker.acquire()
    else:
        taker.acquire()
        assert taker.record.generation == 2
        taker.release()
