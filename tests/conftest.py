"""Shared fixtures: a real local Ray, a real Airflow metadata DB, a real S3 protocol (moto)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# `make test` runs the suite on two pytest-xdist workers, which inherit the environment of the
# process that started them: each worker makes the folders below its own (its Airflow DB, its
# shared Ray), where the subprocesses its tests start reuse them.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if os.environ.get("RAYBATCH_TEST_WORKER", "") != _WORKER:
    os.environ["RAYBATCH_TEST_WORKER"] = _WORKER
    for _name in ("RAYBATCH_TEST_AIRFLOW_HOME", "RAYBATCH_LOCAL_RAY_DIR"):
        os.environ.pop(_name, None)
# Airflow reads its configuration at import: point it at a throwaway home first (shared with the
# subprocesses a test starts, which import this module again).
_AIRFLOW_HOME = os.environ.get("RAYBATCH_TEST_AIRFLOW_HOME") or tempfile.mkdtemp(prefix="raybatch-airflow-")
os.environ["RAYBATCH_TEST_AIRFLOW_HOME"] = os.environ["AIRFLOW_HOME"] = _AIRFLOW_HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
# gcsfs >= 2026.8 probes each bucket's layout over gRPC first, which an emulator does not speak
# (60 s per bucket before falling back): the plain JSON API client, as against most endpoints.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# Embedded tasks use the host's shared local Ray (the default mode): the suite's own, in a private
# folder (short: Ray's socket paths are length-limited), stopped at the end of the session and,
# should the session be killed, after a minute idle. Tests of per-task behaviour opt out
# (RAYBATCH_LOCAL_RAY=per-task in their task's environment).
if "RAYBATCH_LOCAL_RAY_DIR" not in os.environ:
    os.environ["RAYBATCH_LOCAL_RAY_DIR"] = _SHARED_RAY_DIR = tempfile.mkdtemp(prefix="rbl", dir="/tmp")
else:
    _SHARED_RAY_DIR = None  # a parent's (this is a test's subprocess) or the developer's: not ours to remove
os.environ.setdefault("RAYBATCH_LOCAL_RAY_IDLE_TIMEOUT_S", "60")
# Ray runs its workers at niceness 15: beside the suite's other worker on two cores, a test's
# replicas would get the CPU only when that worker's tests leave it, and a progress_timeout or a
# wait in a test would measure the neighbour (a replica's start took over 45 s that way). Every
# Ray the suite starts (local, shared, clusters) inherits this.
os.environ.setdefault("RAY_worker_niceness", "0")
# Transient store errors are retried for seconds within a try here, not minutes: the fault tests
# make faults outlast them. Set before the suite's shared Ray is joined, so its workers have it too.
os.environ.setdefault("RAYBATCH_STORE_RETRY_S", "3")


#: Fixtures that start a server (a storage server, a Ray cluster, the compose stack): their tests
#: are marked ``servers``. Tests that run work on a local Ray are marked ``ray`` (by this fixture,
#: or by their module). ``make test-fast`` leaves out both, with ``slow`` and ``docker``.
SERVER_FIXTURES = frozenset({"s3_server", "gcs_server", "azure_server", "ray_cluster", "compose_stack"})
RAY_FIXTURES = frozenset({"ray_local"})


#: Environment variable: tests marked ``vllm`` fail, rather than skip, where vLLM's CPU build is
#: missing (``make test-vllm``, which CI runs: the real engine must have run).
REQUIRE_VLLM_ENV = "RAYBATCH_REQUIRE_VLLM"


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & SERVER_FIXTURES:
            item.add_marker(pytest.mark.servers)
        if used & RAY_FIXTURES:
            item.add_marker(pytest.mark.ray)
    _skip_vllm_tests_without_vllm(items)


def _skip_vllm_tests_without_vllm(items) -> None:
    """Tests marked ``vllm`` run vLLM's CPU build (``make vllm-env``); without it they skip (``make test``)."""
    if not any(item.get_closest_marker("vllm") for item in items):
        return
    from airflow_provider_raybatch.llm.engines.vllm import installed_vllm

    if (build := installed_vllm()) == "cpu":
        return
    why = f"vLLM's CPU build is not installed here (found: {build or 'no vllm'}); `make test-vllm` runs these tests"
    if os.environ.get(REQUIRE_VLLM_ENV):
        raise pytest.UsageError(why)
    for item in items:
        if item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session", autouse=True)
def _stop_shared_ray():
    """No shared head outlives the session."""
    yield
    from airflow_provider_raybatch.pipeline.runtime.shared.head import stop_shared_heads

    stop_shared_heads(os.environ["RAYBATCH_LOCAL_RAY_DIR"])
    if _SHARED_RAY_DIR is not None:
        shutil.rmtree(_SHARED_RAY_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """A migrated SQLite metadata DB, as `dag.test()` needs one."""
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)
    return _AIRFLOW_HOME


def run_dag(dag, logical_date, conf=None):
    """`dag.test()` for a DAG defined in a test: serialise it first, as the DAG processor would.

    The run id follows from the logical date, so running a date again is a new try of the same
    task instances (as a retry or a clear would be).
    """
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    from tests.support.airflow_versions import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder=tempfile.mkdtemp())
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)
    return dag.test(logical_date=logical_date, run_after=logical_date, run_conf=conf)


@pytest.fixture(scope="module")
def ray_local():
    """The local Ray, joined the way the provider joins it (the shared Ray by default).

    One driver per test module, as each Airflow task is a driver of its own: what a module's runs
    leave in Ray ends with its job. (On Ray 2.55 a long-lived driver can keep a finished run's
    replica alive, holding its CPUs: a later module's run then waited for them until it timed out.)
    Joining the shared Ray again costs about a second.
    """
    import ray

    from airflow_provider_raybatch.pipeline.runtime.local_ray import ray_session

    with ray_session():
        yield ray.cluster_resources()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """tiny-llava and tiny-qwen2 (the demo's recipe), saved with save_pretrained, loaded through from_pretrained."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # the real loading path, with no hub to fall back on
    from airflow_provider_raybatch.examples.tiny_models import build_all

    return build_all(tmp_path_factory.mktemp("models"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on loopback; yields fsspec storage options that reach it."""
    from benchmarks.support.data import moto_s3

    options, server = moto_s3("raybatch-test")
    yield options
    server.stop()


def _server_or_skip(start, tmp_path_factory, name: str):
    """Start a storage server; if it cannot be installed or started: fail in CI, skip locally."""
    from tests.support.storage_servers import ServerUnavailable

    try:
        return start(tmp_path_factory.mktemp(name))
    except ServerUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required in CI: {e}")
        pytest.skip(f"{name} unavailable: {e}")


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """gcp-storage-emulator on loopback, plus an OAuth token endpoint for service-account keys."""
    from tests.support.storage_servers import TokenEndpoint, gcs_emulator

    server = _server_or_skip(gcs_emulator, tmp_path_factory, "gcs-emulator")
    tokens = TokenEndpoint()
    server.extra["token_endpoint"] = tokens
    yield server
    tokens.stop()
    server.stop()


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory):
    """Azurite's Blob service on loopback (installed by npm into .cache/azurite on first use)."""
    from tests.support.storage_servers import azurite

    server = _server_or_skip(azurite, tmp_path_factory, "azurite")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ray_cluster():
    """A real Ray cluster (`ray start --head`, dashboard, token auth) on loopback."""
    from tests.support.ray_cluster import start_cluster

    cluster = start_cluster()
    yield cluster
    cluster.stop()
