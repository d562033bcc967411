""":class:`.output_ref.OutputRef`: an output as its readers name it."""

from __future__ import annotations

import pytest

from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, TableOutput
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.output_ref import OutputRef


def test_a_runs_config_names_its_folder_or_its_tables_partition():
    folder = BatchInferenceConfig(input_path="in", output_path="s3://b/out", stages=[], storage_options={"s3": {}})
    assert OutputRef.of(folder) == OutputRef("s3://b/out", storage_options={"s3": {}})
    assert not OutputRef.of(folder).is_table

    table = TableOutput("iceberg", {"ds": "1"}, writer="w", identifier="ns.t", catalog={"uri": "sqlite://"})
    ref = OutputRef.of(BatchInferenceConfig(input_path="in", output_path="/t", stages=[], table=table))
    assert (ref.path, ref.format, ref.partition, ref.identifier, ref.catalog) == (
        "/t",
        "iceberg",
        {"ds": "1"},
        "ns.t",
        {"uri": "sqlite://"},
    )
    assert ref.is_table


def test_an_unknown_format_is_refused_naming_it():
    with pytest.raises(ConfigError, match="output_format.*'csv'"):
        OutputRef("/out", "csv")


def test_its_repr_holds_no_credentials():
    ref = OutputRef(
        "s3://b/out", "iceberg", {"ds": "1"}, "ns.t", {"credential": "hunter2"}, {"s3": {"secret": "s3cr3t"}}
    )
    assert "hunter2" not in repr(ref) and "s3cr3t" not in repr(ref)
