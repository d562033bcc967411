"""The one module that maps a path's scheme to its store and picks its storage options."""

from __future__ import annotations

from airflow_provider_raybatch.pipeline.store.urls import AZURE, GCS, S3, options_for, store_of


def test_each_scheme_maps_to_its_store_and_connection_argument():
    assert [store_of(p) for p in ("s3://b/k", "S3A://b/k", "gs://b/k", "gcs://b/k")] == [S3, S3, GCS, GCS]
    assert [store_of(p) for p in ("abfs://c/k", "abfss://c@a.dfs.core.windows.net/k", "az://c/k")] == [AZURE] * 3
    assert [store_of(p) for p in ("/data/in", "file:///data/in", "memory://x", "hdfs://nn/x")] == [None] * 4
    assert (S3.conn_arg, GCS.conn_arg, AZURE.conn_arg) == ("aws_conn_id", "gcp_conn_id", "azure_conn_id")


def test_options_are_picked_per_store_and_never_given_to_local_paths():
    keyed = {"s3": {"key": "k"}, "gs": {"token": "t"}, "abfs": {"account_name": "a"}}
    assert options_for("s3a://b/in", keyed) == {"key": "k"}
    assert options_for("gcs://b/in", keyed) == {"token": "t"}
    assert options_for("az://c/in", keyed) == {"account_name": "a"}
    assert options_for("/data/in", keyed) == {} and options_for("file:///x", keyed) == {}
    assert options_for("gs://b/in", {"s3": {"key": "k"}}) == {}  # no connection for GCS: its environment
    # One filesystem's options (the earlier form) still go to every remote path.
    flat = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}
    assert options_for("s3://b/in", flat) == flat and options_for("/local", flat) == {}
