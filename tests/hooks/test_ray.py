from __future__ import annotations

import json

import pytest

from airflow_provider_raybatch.hooks.ray import RayHook


def test_no_connection_means_embedded_local_ray():
    assert RayHook("ray_missing_conn").ray_address is None
    assert RayHook(None).ray_address is None


@pytest.mark.parametrize(
    ("conn", "address"),
    [
        ({"conn_type": "ray", "host": "ray://head", "port": 10001}, "ray://head:10001"),
        ({"conn_type": "ray", "host": "ray://head:10001"}, "ray://head:10001"),
        ({"conn_type": "ray", "host": "10.0.0.5", "port": 6379}, "10.0.0.5:6379"),
        ({"conn_type": "ray"}, None),
    ],
)
def test_connection_host_is_the_cluster_address(monkeypatch, conn, address):
    monkeypatch.setenv("AIRFLOW_CONN_RAY_TEST", json.dumps(conn))
    assert RayHook("ray_test").ray_address == address
