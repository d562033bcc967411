"""The write step and the commits it feeds, driven without Ray Data: receipts, salvage, the driver's share."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.execution.block_writer import RECEIPT_SUFFIX, write_block
from airflow_provider_raybatch.pipeline.execution.range_commits import RECORD_INTERVAL_ENV, RangeCommits
from airflow_provider_raybatch.pipeline.execution.range_reader import read_ranges
from airflow_provider_raybatch.pipeline.prepare import prepare
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.summary import Progress
from tests.support.data import assert_exactly_once, assert_output_sound, read_output, write_input
from tests.support.pipeline_runs import config


def scored_block(run, index: int) -> pa.Table:
    """Range ``index`` as the last stage hands it to the write step: its rows with a score."""
    row_range = run.plan.ranges[index]
    file = run.plan.files[row_range.file_index]
    (table,) = read_ranges(run.in_fs, file, [(index, row_range)], run.plan.schema.names, run.keep, False)
    return table.append_column("score", pa.array([float(i) for i in range(table.num_rows)], pa.float32()))


@pytest.fixture
def prepared(tmp_path):
    write_input(tmp_path / "in", [300])  # 3 ranges of 100 rows
    cfg = config(tmp_path)
    run = prepare(cfg)
    yield cfg, run
    run.release()


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


def test_a_published_range_is_recorded_within_the_interval_though_nothing_else_arrives(prepared, monkeypatch):
    cfg, run = prepared
    monkeypatch.setenv(RECORD_INTERVAL_ENV, "0.5")
    with RangeCommits(run.ledger, run.plan, Progress(run.plan, run.committed), cfg) as commits:
        kwargs = commits.write_step_kwargs()
        commits.add(write_block(scored_block(run, 0), **kwargs))  # the run's first: recorded at once
        commits.add(write_block(scored_block(run, 2), **kwargs))
        published = time.monotonic()
        while len(OutputLedger.open(cfg.output_path).committed()) < 2 and time.monotonic() < published + 10:
            time.sleep(0.05)
        waited = time.monotonic() - published
        # In a segment of its own: written by the flushing thread, the stream idle meanwhile.
        assert sorted(OutputLedger.open(cfg.output_path).committed()) == sorted(run.plan.ranges[i].id for i in (0, 2))
        assert 0.3 < waited < 2, waited
        assert len(run.ledger.fs.ls(run.ledger.segments_dir)) == 2 and commits.progress.done == 2
        commits.add(write_block(scored_block(run, 1), **kwargs))
    # Leaving the block records what is still pending.
    assert len(OutputLedger.open(cfg.output_path).committed()) == 3 and commits.progress.done == 3


def test_a_bad_record_interval_is_named(prepared, monkeypatch):
    cfg, run = prepared
    monkeypatch.setenv(RECORD_INTERVAL_ENV, "soon")
    with pytest.raises(ConfigError, match=f"{RECORD_INTERVAL_ENV} must be a number of seconds >= 0, got 'soon'"):
        RangeCommits(run.ledger, run.plan, Progress(run.plan, run.committed), cfg)


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
