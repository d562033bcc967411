"""The staging layout's readers (:mod:`.tables.staging`): which writers staged rows for a partition,
and a generation's table commits as they are on disk; the status and the verifier read them alike."""

from __future__ import annotations

import json

import fsspec
import pytest

from airflow_provider_raybatch.pipeline.errors import OutputNotFoundError
from airflow_provider_raybatch.pipeline.output_ref import OutputRef
from airflow_provider_raybatch.pipeline.status import read_table_status, verify
from airflow_provider_raybatch.pipeline.tables.staging import (
    StagedWriter,
    TableIntent,
    intent_path,
    intents,
    staged_writers,
)
from airflow_provider_raybatch.pipeline.tables.writer_commits import DataFile


def test_the_writers_of_a_partition_are_the_folders_with_a_generation_record_in_name_order(tmp_path):
    fs = fsspec.filesystem("file")
    for writer, number in (("b-2", 3), ("a-1", 0)):
        (tmp_path / "ds=1" / writer / "_raybatch").mkdir(parents=True)
        (tmp_path / "ds=1" / writer / "_raybatch" / "generation.json").write_text(json.dumps({"number": number}))
    (tmp_path / "ds=1" / "not-a-writer").mkdir()  # a folder of the table's own, say
    (tmp_path / "ds=1" / "part-0.parquet").write_bytes(b"")

    writers = staged_writers(fs, str(tmp_path), {"ds": "1"})

    assert writers == [StagedWriter("ds=1/a-1", 0), StagedWriter("ds=1/b-2", 3)]
    assert writers[1].generation_relpath == "ds=1/b-2/g3"
    assert staged_writers(fs, str(tmp_path), {"ds": "2"}) == []


def test_intents_are_read_as_earlier_releases_wrote_them_and_written_the_same_way(tmp_path):
    fs = fsspec.filesystem("file")
    generation = str(tmp_path / "ds=1" / "w" / "g0")
    # The format of an intent file, as written before it had a type (a run's retry reads its earlier tries' intents).
    written = {
        "seq": 0,
        "ranges": ["r1", "r2"],
        "files": [{"path": "ds=1/w/g0/part-r1.parquet", "size": 10, "rows": 5}],
        "replace": False,
    }
    path = intent_path(generation, 0)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe(path, json.dumps(written, sort_keys=True).encode())
    second = TableIntent(1, ["r3"], [DataFile("ds=1/w/g0/part-r3.parquet", 7, 2)], True)
    fs.pipe(intent_path(generation, 1), second.to_json())

    first = TableIntent(0, ["r1", "r2"], [DataFile("ds=1/w/g0/part-r1.parquet", 10, 5)], False)
    assert intents(fs, generation) == [first, second]
    assert first.to_json() == json.dumps(written, sort_keys=True).encode()
    assert intents(fs, generation, start=1) == [second]
    assert path.endswith("/g0/_raybatch/table/00000000.json")


def test_a_file_in_the_partitions_folder_is_no_writer_for_status_and_verify_alike(tmp_path):
    # Another writer's data file where the provider's writers' folders are (the status read it as a folder).
    (tmp_path / "ds=1").mkdir()
    (tmp_path / "ds=1" / "other.parquet").write_bytes(b"PAR1")

    with pytest.raises(OutputNotFoundError, match="no writer of this provider staged rows"):
        read_table_status(str(tmp_path), {"ds": "1"})
    ref = OutputRef(str(tmp_path), "delta", {"ds": "1"})
    assert verify(ref) == [f"{tmp_path}: no writer of this provider staged rows for partition {{'ds': '1'}}"]
