""":func:`.hooks.output_refs.resolve_output`: the one step from a task's arguments or the command
line's flags to an :class:`.output_ref.OutputRef` with its credentials (real Airflow connections,
from the environment)."""

from __future__ import annotations

import json

from airflow_provider_raybatch.hooks.output_refs import resolve_output


def test_the_stores_connection_and_the_catalogs_are_resolved_into_the_ref(monkeypatch, tmp_path):
    aws = {"conn_type": "aws", "login": "AKIDEXAMPLE", "password": "s3cr3t", "extra": {"region_name": "eu-west-1"}}
    monkeypatch.setenv("AIRFLOW_CONN_REF_S3", json.dumps(aws))
    monkeypatch.setenv("AIRFLOW_CONN_REF_CATALOG", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "c.db")}))

    ref = resolve_output(
        "s3://b/t", "iceberg", {"ds": "1"}, "ns.t", aws_conn_id="ref_s3", iceberg_conn_id="ref_catalog"
    )

    assert ref.storage_options["s3"]["key"] == "AKIDEXAMPLE"
    assert ref.storage_options["s3"]["secret"] == "s3cr3t"
    assert ref.catalog == {"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}"}
    assert (ref.path, ref.format, ref.partition, ref.identifier) == ("s3://b/t", "iceberg", {"ds": "1"}, "ns.t")


def test_a_catalog_given_as_properties_is_kept_and_no_connection_leaves_the_environments_credentials(monkeypatch):
    # The command line's --catalog: pyiceberg's own configuration when empty, never Airflow's default catalog.
    ref = resolve_output("/t", "iceberg", {"ds": "1"}, "ns.t", {})
    assert ref.catalog == {} and ref.storage_options is None
    assert resolve_output("/out").storage_options is None
