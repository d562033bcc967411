"""The `ray` connection: parsing, and the Test button against a real cluster and real failures."""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import threading
from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_raybatch.hooks.jobs_client import RayJobsClient, RayJobsError, run_sync
from airflow_provider_raybatch.hooks.ray import RayClusterSettings, RayHook
from tests.conftest import free_port


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
    with pytest.raises(ValueError, match="dashboard / Jobs API address"):
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
        },
    ).cluster
    assert cluster.headers == {"X-Proxy-Key": "pr0xy", "Authorization": "Bearer tok3n"}
    assert cluster.cookies == {"session": "c00kie"} and cluster.verify is False
    assert cluster.runtime_env == {"pip": ["torch"], "env_vars": {"A": "1"}}
    assert (cluster.entrypoint_num_cpus, cluster.entrypoint_num_gpus, cluster.entrypoint_memory) == (2.0, 1.0, 1000)
    assert cluster.namespace == "batch"
    assert not any(secret in repr(cluster) for secret in ("tok3n", "pr0xy", "c00kie"))


def test_an_explicit_authorization_header_wins_over_the_token(monkeypatch):
    cluster = hook_for(
        monkeypatch, host="http://head:8265", password="tok3n", extra={"headers": {"authorization": "Basic x"}}
    ).cluster
    assert cluster.headers == {"authorization": "Basic x"}


def test_bad_json_names_the_field_but_not_its_secret_value(monkeypatch):
    with pytest.raises(ValueError, match="extra 'headers' is not valid JSON") as error:
        hook_for(monkeypatch, host="http://head:8265", extra={"headers": '{"X-Key": "s3cret"'}).cluster  # noqa: B018
    assert "s3cret" not in str(error.value)


def test_the_test_button_reports_version_and_resources(monkeypatch, ray_cluster):
    ok, message = hook_for(monkeypatch, host=ray_cluster.dashboard, password=ray_cluster.token).test_connection()
    assert ok, message
    assert message.startswith(f"Ray 2.60.0 at {ray_cluster.dashboard}: ") and "CPUs, 0 GPUs" in message


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


def test_a_server_that_never_answers_times_out():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # accepts connections (backlog) and never answers
        client = RayJobsClient(RayClusterSettings(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=1))
        with pytest.raises(RayJobsError, match="no answer from the Ray Jobs API .* within 1s"):
            run_sync(client.version())
