"""The write step and the commits it feeds, driven without Ray Data: receipts, salvage, the driver's share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.execution.block_writer import (
    RECEIPT_SUFFIX,
    _write_file,
    key_problem,
    parquet_options,
    write_block,
)
from airflow_provider_raybatch.pipeline.execution.range_commits import RangeCommits
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.summary import Progress
from tests.pipeline.execution.conftest import scored_block
from tests.support.data import assert_exactly_once, assert_output_sound, read_output


def test_a_block_is_written_to_the_temporary_folder_and_only_its_metadata_returned(prepared):
    cfg, run = prepared
    commits = RangeCommits(run.ledger, run.plan, Progress(run.plan, run.committed), cfg)
    # The run's first range is recorded at once: its first result does not wait for a batch.
    commits.add(write_block(scored_block(run, 0), **commits.write_step_kwargs()))
    assert list(OutputLedger.open(cfg.output_path).committed()) == [run.plan.ranges[0].id]
    block = scored_block(run, 1)
    metadata = write_block(block, **commits.write_step_kwargs())
    (file,) = metadata.to_pylist()
    assert file["range"] == 1 and file["kind"] == "output" and file["rows"] == 100 and file["problem"] is None
    assert file["path"].startswith(run.ledger.tmp_dir + "/")
    assert metadata.nbytes < block.nbytes / 10  # what the driver receives: no rows
    receipts = [p for p in run.ledger.fs.ls(run.ledger.tmp_dir) if p.endswith(RECEIPT_SUFFIX)]
    assert len(receipts) == 2 and any(file["block"] in receipt for receipt in receipts)  # range 0's, and its

    commits.add(metadata)
    # Published (its file has its final name), recorded with the next batch: committed only then.
    range_id = run.plan.ranges[1].id
    assert (Path(cfg.output_path) / f"part-{range_id}.parquet").exists()
    assert range_id not in OutputLedger.open(cfg.output_path).committed() and commits.progress.done == 1
    commits.flush()
    assert range_id in OutputLedger.open(cfg.output_path).committed() and commits.progress.done == 2


def test_ranges_written_before_the_stream_failed_are_committed_from_their_receipts(prepared):
    cfg, run = prepared
    commits = RangeCommits(run.ledger, run.plan, Progress(run.plan, run.committed), cfg)
    kwargs = commits.write_step_kwargs()
    # Range 1's metadata reached the driver; ranges 0 and 2 were written, but the stream failed
    # before their metadata arrived.
    commits.add(write_block(scored_block(run, 1), **kwargs))
    for index in (0, 2):
        write_block(scored_block(run, index), **kwargs)
    commits.salvage()
    run.release()
    assert sorted(OutputLedger.open(cfg.output_path).committed()) == sorted(r.id for r in run.plan.ranges)
    assert_exactly_once(read_output(cfg.output_path), range(300))

    # The ledger is consistent: a rerun finds everything committed, and the verifier agrees.
    summary = run_batch_inference(cfg)
    assert summary.ranges_skipped == 3 and summary.rows_processed == 0
    assert_output_sound(cfg.output_path, range(300))


def test_float_columns_and_the_key_are_written_without_dictionary_and_floats_uncompressed(tmp_path):
    import fsspec

    rows = 1000
    table = pa.table(
        {
            "id": pa.array(np.arange(rows)),
            "label": pa.array(np.arange(rows) % 3),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(np.ones(rows * 4, np.float32)), 4),
            "name": pa.array(["a", "b"] * (rows // 2)),
        }
    )
    options = parquet_options(table.schema, "id")
    assert options["use_dictionary"] == ["label", "name"]
    assert options["compression"] == {
        "id": "snappy",
        "label": "snappy",
        "embedding.list.element": "none",
        "name": "snappy",
    }
    path = str(tmp_path / "part.parquet")
    assert _write_file(fsspec.filesystem("file"), path, table, "id") == Path(path).stat().st_size
    columns = pq.ParquetFile(path).metadata.row_group(0)
    written = {columns.column(i).path_in_schema: columns.column(i) for i in range(columns.num_columns)}
    assert "RLE_DICTIONARY" in written["label"].encodings and "RLE_DICTIONARY" not in written["id"].encodings
    assert "RLE_DICTIONARY" not in written["embedding.list.element"].encodings
    assert written["embedding.list.element"].compression == "UNCOMPRESSED" and written["name"].compression == "SNAPPY"
    assert pq.read_table(path).equals(table)
    # Without a key (the rejects' files), every column but floats keeps its dictionary.
    assert parquet_options(table.schema, None)["use_dictionary"] == ["id", "label", "name"]


def test_increasing_ids_are_a_key_and_others_are_counted():
    ids = pa.chunked_array([[1, 2, 5], [7, 9]])
    assert key_problem([ids], "id") is None
    assert "1 duplicated id(s), e.g. 5" in key_problem([pa.chunked_array([[1, 5, 5]])], "id")
    assert key_problem([pa.chunked_array([[3, 1, 2]])], "id") is None  # not in order: counted, distinct
    assert "duplicated" in key_problem([pa.chunked_array([[1, 2]]), pa.chunked_array([[2]])], "id")
    assert key_problem([pa.chunked_array([["b", "a"]])], "id") is None
