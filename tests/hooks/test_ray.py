"""The `ray` connection: parsing, the Test button against a real cluster and real failures, and
the hook's Jobs API methods (submit or attach, get, stop, wait, sync and async) on a real cluster."""

from __future__ import annotations

import asyncio
import http.server
import json
import ssl
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_raybatch.hooks.jobs_client import run_sync
from airflow_provider_raybatch.hooks.jobs_types import JobDeadlineExceeded, JobFailure, RayJobsError
from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.pipeline.errors import ERROR_PREFIX, NOT_RETRYABLE_EXIT, ConfigError
from tests.conftest import free_port
from tests.support.ray_cluster import cluster_ray_version, connection


def hook_for(monkeypatch, **conn) -> RayHook:
    monkeypatch.setenv("AIRFLOW_CONN_RAY_TEST", json.dumps({"conn_type": "ray", **conn}))
    return RayHook("ray_test")


def test_no_connection_or_no_host_means_embedded_local_ray(monkeypatch):
    assert RayHook("ray_missing_conn").cluster is None
    assert RayHook(None).cluster is None
    assert hook_for(monkeypatch).cluster is None


@pytest.mark.parametrize(
    ("conn", "address"),
    [
        ({"host": "http://head:8265"}, "http://head:8265"),
        ({"host": "head", "port": 8265}, "http://head:8265"),
        ({"host": "https://ray.example.com/"}, "https://ray.example.com"),
    ],
)
def test_the_host_is_the_dashboard_address(monkeypatch, conn, address):
    assert hook_for(monkeypatch, **conn).cluster.address == address


def test_a_ray_client_address_is_refused_with_the_reason(monkeypatch):
    with pytest.raises(ConfigError, match="dashboard / Jobs API address"):
        hook_for(monkeypatch, host="ray://head:10001").cluster  # noqa: B018


def test_extras_token_and_secrets(monkeypatch):
    cluster = hook_for(
        monkeypatch,
        host="http://head:8265",
        password="tok3n",
        extra={
            "verify": "false",
            "headers": '{"X-Proxy-Key": "pr0xy"}',
            "cookies": {"session": "c00kie"},
            "runtime_env": {"pip": ["torch"], "env_vars": {"A": "1"}},
            "entrypoint_num_cpus": "2",
            "entrypoint_num_gpus": 1,
            "entrypoint_memory": "1000",
            "namespace": "batch",
            "outage_timeout": "90",
        },
    ).cluster
    assert cluster.headers == {"X-Proxy-Key": "pr0xy", "Authorization": "Bearer tok3n"}
    assert cluster.cookies == {"session": "c00kie"} and cluster.verify is False
    assert cluster.runtime_env == {"pip": ["torch"], "env_vars": {"A": "1"}}
    assert (cluster.entrypoint_num_cpus, cluster.entrypoint_num_gpus, cluster.entrypoint_memory) == (2.0, 1.0, 1000)
    assert cluster.namespace == "batch" and cluster.outage_timeout_s == 90
    assert not any(secret in repr(cluster) for secret in ("tok3n", "pr0xy", "c00kie"))


def test_the_outage_timeout_defaults_to_ten_minutes_and_is_at_least_zero(monkeypatch):
    assert hook_for(monkeypatch, host="http://head:8265").cluster.outage_timeout_s == 600
    with pytest.raises(ConfigError, match="extra 'outage_timeout' must be >= 0 seconds, got -1"):
        hook_for(monkeypatch, host="http://head:8265", extra={"outage_timeout": -1}).cluster  # noqa: B018


def test_an_explicit_authorization_header_wins_over_the_token(monkeypatch):
    cluster = hook_for(
        monkeypatch, host="http://head:8265", password="tok3n", extra={"headers": {"authorization": "Basic x"}}
    ).cluster
    assert cluster.headers == {"authorization": "Basic x"}


def test_bad_json_names_the_field_but_not_its_secret_value(monkeypatch):
    with pytest.raises(ConfigError, match="extra 'headers' is not valid JSON") as error:
        hook_for(monkeypatch, host="http://head:8265", extra={"headers": '{"X-Key": "s3cret"'}).cluster  # noqa: B018
    assert "s3cret" not in str(error.value)


def test_the_test_button_reports_version_and_resources(monkeypatch, ray_cluster):
    ok, message = hook_for(monkeypatch, host=ray_cluster.dashboard, password=ray_cluster.token).test_connection()
    assert ok, message
    assert message.startswith(f"Ray {cluster_ray_version()} at {ray_cluster.dashboard}: ") and "CPUs, 0 GPUs" in message


@pytest.mark.parametrize(
    ("password", "reason"), [(None, "answered 401: authentication missing"), ("wrong", "answered 403")]
)
def test_authentication_failures_are_named(monkeypatch, ray_cluster, password, reason):
    ok, message = hook_for(monkeypatch, host=ray_cluster.dashboard, password=password).test_connection()
    assert not ok and reason in message


def test_nothing_listening(monkeypatch):
    ok, message = hook_for(monkeypatch, host=f"http://127.0.0.1:{free_port()}").test_connection()
    assert not ok and "cannot reach the Ray Jobs API" in message


def test_https_to_a_plain_http_dashboard(monkeypatch, ray_cluster):
    https = ray_cluster.dashboard.replace("http://", "https://")
    ok, message = hook_for(monkeypatch, host=https, password=ray_cluster.token).test_connection()
    assert not ok and "TLS" in message


class _NotRay(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html>some other service</html>")

    def log_message(self, *args):
        pass


def _serve(server) -> str:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"127.0.0.1:{server.server_address[1]}"


def test_a_port_that_is_not_the_dashboard(monkeypatch):
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotRay)
    try:
        ok, message = hook_for(monkeypatch, host=f"http://{_serve(server)}").test_connection()
    finally:
        server.shutdown()
    assert not ok and "did not answer like a Ray dashboard" in message


def _self_signed(tmp_path) -> ssl.SSLContext:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    return context


def test_an_untrusted_certificate_and_verify_false(monkeypatch, tmp_path):
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotRay)
    server.socket = _self_signed(tmp_path).wrap_socket(server.socket, server_side=True)
    address = f"https://{_serve(server)}"
    try:
        ok, message = hook_for(monkeypatch, host=address).test_connection()
        assert not ok and "certificate" in message and "verify=false" in message
        # Without verification TLS passes, and the next problem is named: no Ray there.
        ok, message = hook_for(monkeypatch, host=address, extra={"verify": False}).test_connection()
        assert not ok and "did not answer like a Ray dashboard" in message
    finally:
        server.shutdown()


# --- the Jobs API through the hook, against the real cluster ---

SLEEP = f"python -c {'import time; time.sleep(120)'!r}"


def python(code: str) -> str:
    return f"python -c {code!r}"


@pytest.fixture
def hook(ray_cluster, monkeypatch) -> RayHook:
    monkeypatch.setenv("AIRFLOW_CONN_RAY_JOBS_TEST", connection(ray_cluster))
    return RayHook("ray_jobs_test")


@pytest.fixture
def prefix() -> str:
    return f"hook-test-{uuid.uuid4().hex[:8]}"


def test_a_chain_walks_past_a_failed_job_and_then_takes_the_succeeded_one(hook, prefix):
    def entrypoint(submission_id: str) -> str:
        return python("import sys; sys.exit(1)") if submission_id.endswith("-0") else python("print('done')")

    submitted: list[int] = []
    first = hook.submit_or_attach(prefix, entrypoint, on_submit=submitted.append)
    assert (first.submission_id, first.status, submitted) == (f"{prefix}-0", "PENDING", [0])
    failed = hook.wait_for_job(first.submission_id, poll_interval=0.2)
    assert failed.status == "FAILED" and failed.failure.retryable

    # The next try starts from the attempt it recorded: the failed job makes room for attempt 1.
    second = hook.submit_or_attach(prefix, entrypoint, start_attempt=submitted[-1], on_submit=submitted.append)
    assert second.submission_id == f"{prefix}-1" and submitted == [0, 1]
    assert hook.wait_for_job(second.submission_id, poll_interval=0.2).is_successful

    # Walking from 0 (the record was lost): the failed job is passed, the succeeded one taken.
    third = hook.submit_or_attach(prefix, entrypoint, on_submit=submitted.append)
    assert (third.submission_id, third.status, submitted) == (f"{prefix}-1", "SUCCEEDED", [0, 1])
    assert hook.get_job_info(f"{prefix}-2") is None


def test_a_live_job_is_reattached_stopped_and_then_resubmitted(hook, prefix):
    first = hook.submit_or_attach(prefix, lambda _: SLEEP)
    again = hook.submit_or_attach(prefix, lambda _: SLEEP, on_submit=lambda attempt: pytest.fail("submitted twice"))
    assert again.submission_id == first.submission_id and again.is_active
    assert hook.stop_job(first.submission_id) is True
    stopped = hook.wait_for_job(first.submission_id, poll_interval=0.2)
    assert stopped.status == "STOPPED" and stopped.failure.retryable
    assert hook.stop_job(first.submission_id) is False  # it had ended already
    assert hook.submit_or_attach(prefix, lambda _: SLEEP).submission_id == f"{prefix}-1"
    hook.stop_job(f"{prefix}-1")


def test_a_job_submitted_meanwhile_by_another_process_is_attached_not_duplicated(hook, prefix):
    def rival_submits_first(attempt: int) -> None:
        # Between this walk's lookup and its submission, another process submits the same id.
        async def submit() -> None:
            async with hook.get_conn() as client:
                await client.submit(f"{prefix}-{attempt}", SLEEP, {"by": "rival"})

        run_sync(submit())

    info = hook.submit_or_attach(prefix, lambda _: SLEEP, on_submit=rival_submits_first)
    assert info.submission_id == f"{prefix}-0" and info.is_active
    assert hook.get_job_info(f"{prefix}-1") is None
    hook.stop_job(info.submission_id)


def test_a_settings_error_is_not_retryable_and_carries_the_job_s_own_message(hook, prefix):
    code = f"import sys; print('working'); print({ERROR_PREFIX + 'no input at /x'!r}, file=sys.stderr); sys.exit({NOT_RETRYABLE_EXIT})"
    info = hook.wait_for_job(hook.submit_or_attach(prefix, lambda _: python(code)).submission_id, poll_interval=0.2)
    assert info.status == "FAILED" and info.driver_exit_code == NOT_RETRYABLE_EXIT
    assert info.failure == JobFailure("no input at /x", retryable=False)


def test_the_async_twins_wait_with_the_log_and_stop_at_a_deadline(hook, prefix):
    lines: list[str] = []

    async def scenario():
        done = await hook.asubmit_or_attach(prefix, lambda _: python("print('one'); print('two')"))
        ended = await hook.await_for_job(done.submission_id, poll_interval=0.2, log_line=lines.append)
        slow = await hook.asubmit_or_attach(f"{prefix}-slow", lambda _: SLEEP)
        with pytest.raises(JobDeadlineExceeded, match="at the task's deadline"):
            await hook.await_for_job(slow.submission_id, poll_interval=0.2, deadline=time.time() + 1)
        running = await hook.aget_job_info(slow.submission_id)
        stopped = await hook.astop_job(slow.submission_id)
        return ended, running, stopped, await hook.await_for_job(slow.submission_id, poll_interval=0.2)

    ended, running, stopped, after = asyncio.run(scenario())
    assert ended.is_successful and lines.index("one") < lines.index("two")
    assert running.is_active and running.failure is None and stopped and after.status == "STOPPED"


def test_a_connection_without_a_cluster_is_named(monkeypatch):
    with pytest.raises(RayJobsError, match="'ray_test' names no Ray cluster"):
        hook_for(monkeypatch).get_job_info("x")
    with pytest.raises(RayJobsError, match="'ray_missing_conn' names no Ray cluster"):
        asyncio.run(RayHook("ray_missing_conn").astop_job("x"))
