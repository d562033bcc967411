"""The driver's commits (RangeCommits), fed by the real write step without Ray Data: batching of
records, ranges in several blocks, and what is refused before anything of a range is committed."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.errors import ConfigError, OutputSchemaError, RayBatchError, RowKeyError
from airflow_provider_raybatch.pipeline.execution import range_commits
from airflow_provider_raybatch.pipeline.execution.block_writer import write_block
from airflow_provider_raybatch.pipeline.execution.range_commits import RECORD_INTERVAL_ENV, RangeCommits
from airflow_provider_raybatch.pipeline.prepare import prepare
from airflow_provider_raybatch.pipeline.summary import Progress
from tests.pipeline.execution.conftest import scored_block
from tests.support.data import assert_exactly_once, read_output, write_input
from tests.support.pipeline_runs import config


def commits_of(run, cfg) -> RangeCommits:
    return RangeCommits(run.ledger, run.plan, Progress(run.plan, run.committed), cfg)


def committed(cfg) -> list[str]:
    return sorted(OutputLedger.open(cfg.output_path).committed())


def test_a_range_in_several_blocks_is_committed_once_all_its_rows_arrived(prepared):
    cfg, run = prepared
    commits = commits_of(run, cfg)
    kwargs = commits.write_step_kwargs()
    block = scored_block(run, 0)
    commits.add(write_block(block.slice(0, 40), **kwargs))
    assert committed(cfg) == [] and 0 in commits.arrived  # 40 of its 100 rows: nothing published
    commits.add(write_block(block.slice(40), **kwargs))
    range_id = run.plan.ranges[0].id
    assert committed(cfg) == [range_id]  # the run's first range: recorded at once
    assert sorted(p.name for p in Path(cfg.output_path).glob("part-*")) == [
        f"part-{range_id}.0.parquet",
        f"part-{range_id}.1.parquet",
    ]
    assert_exactly_once(read_output(cfg.output_path), range(100))


def test_ids_repeated_across_a_ranges_blocks_commit_nothing_of_the_range(prepared):
    cfg, run = prepared
    commits = commits_of(run, cfg)
    kwargs = commits.write_step_kwargs()
    block = scored_block(run, 0)
    # Each block's ids are a key on its own; across the two, id 0 comes twice.
    commits.add(write_block(block.slice(0, 50), **kwargs))
    again = pa.concat_tables([block.slice(0, 1), block.slice(51)])
    with pytest.raises(RowKeyError, match=f"range {run.plan.ranges[0].id}"):
        commits.add(write_block(again, **kwargs))
    assert committed(cfg) == [] and not list(Path(cfg.output_path).glob("part-*"))


def test_more_rows_than_a_range_holds_are_refused(prepared):
    cfg, run = prepared
    commits = commits_of(run, cfg)
    kwargs = commits.write_step_kwargs()
    block = scored_block(run, 1)
    commits.add(write_block(block.slice(0, 60), **kwargs))
    with pytest.raises(RayBatchError, match=f"range {run.plan.ranges[1].id} received 120 rows but holds 100"):
        commits.add(write_block(block.slice(40), **kwargs))
    assert committed(cfg) == []


def test_a_stream_that_ends_before_a_range_is_complete_fails_and_keeps_what_was_committed(prepared):
    cfg, run = prepared
    commits = commits_of(run, cfg)
    kwargs = commits.write_step_kwargs()
    commits.add(write_block(scored_block(run, 0), **kwargs))
    commits.add(write_block(scored_block(run, 1).slice(0, 10), **kwargs))
    with pytest.raises(RayBatchError, match=rf"the stream ended before ranges \['{run.plan.ranges[1].id}'\]"):
        commits.check_done()
    assert committed(cfg) == [run.plan.ranges[0].id]


def test_a_range_whose_schema_differs_from_the_committed_ones_is_refused(prepared):
    cfg, run = prepared
    commits = commits_of(run, cfg)
    kwargs = commits.write_step_kwargs()
    commits.add(write_block(scored_block(run, 0), **kwargs))
    other = scored_block(run, 1)
    other = other.set_column(other.schema.get_field_index("score"), "score", other["score"].cast(pa.float64()))
    with pytest.raises(OutputSchemaError, match=f"range {run.plan.ranges[1].id} with a schema other than"):
        commits.add(write_block(other, **kwargs))
    assert committed(cfg) == [run.plan.ranges[0].id]


def test_a_column_of_nulls_is_promoted_to_the_recorded_type(prepared):
    cfg, run = prepared
    commits = commits_of(run, cfg)
    kwargs = commits.write_step_kwargs()
    commits.add(write_block(scored_block(run, 0), **kwargs))
    nulls = scored_block(run, 1)
    index = nulls.schema.get_field_index("score")
    nulls = nulls.set_column(index, "score", pa.nulls(nulls.num_rows))  # type null: a batch of all-None scores
    commits.add(write_block(nulls, **kwargs))
    commits.flush()
    (path,) = Path(cfg.output_path).glob(f"part-{run.plan.ranges[1].id}*.parquet")
    assert pq.read_schema(path).field("score").type == pa.float32()
    assert pq.read_table(path)["score"].null_count == 100


def test_an_empty_range_is_committed_without_a_file(tmp_path):
    write_input(tmp_path / "in", [100, 0])  # the second file is empty: a range of no rows
    cfg = config(tmp_path)
    run = prepare(cfg)
    try:
        commits = commits_of(run, cfg)
        empty = next(i for i, r in enumerate(run.plan.ranges) if r.rows == 0)
        commits.commit_empty(empty, run.keep)
        commits.flush()
        assert committed(cfg) == [run.plan.ranges[empty].id]
        assert OutputLedger.open(cfg.output_path).committed()[run.plan.ranges[empty].id].files == ()
    finally:
        run.release()


def test_with_interval_zero_each_range_is_a_segment_of_its_own(prepared, monkeypatch):
    cfg, run = prepared
    monkeypatch.setenv(RECORD_INTERVAL_ENV, "0")
    commits = commits_of(run, cfg)
    kwargs = commits.write_step_kwargs()
    for index in range(3):
        commits.add(write_block(scored_block(run, index), **kwargs))
        assert len(committed(cfg)) == index + 1
    assert len(run.ledger.fs.ls(run.ledger.segments_dir)) == 3


def test_a_burst_is_recorded_without_waiting_once_the_batch_is_full(prepared, monkeypatch):
    cfg, run = prepared
    monkeypatch.setattr(range_commits, "MAX_RECORDS_PER_BATCH", 2)
    commits = commits_of(run, cfg)
    kwargs = commits.write_step_kwargs()
    commits.add(write_block(scored_block(run, 0), **kwargs))  # the first: at once
    commits.add(write_block(scored_block(run, 1), **kwargs))
    assert len(committed(cfg)) == 1
    commits.add(write_block(scored_block(run, 2), **kwargs))  # two pending: a full batch
    assert len(committed(cfg)) == 3 and len(run.ledger.fs.ls(run.ledger.segments_dir)) == 2


def test_a_failed_record_on_the_flushing_thread_fails_the_driver_and_commits_nothing_more(prepared, monkeypatch):
    cfg, run = prepared
    monkeypatch.setenv(RECORD_INTERVAL_ENV, "0.2")
    with RangeCommits(run.ledger, run.plan, Progress(run.plan, run.committed), cfg) as commits:
        kwargs = commits.write_step_kwargs()
        commits.add(write_block(scored_block(run, 0), **kwargs))

        def refuse(records):
            raise OSError("the store refused the segment")

        monkeypatch.setattr(run.ledger, "record", refuse)
        commits.add(write_block(scored_block(run, 1), **kwargs))
        deadline = time.monotonic() + 10
        while commits._failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(OSError, match="refused the segment"):
            commits.add(write_block(scored_block(run, 2), **kwargs))
    assert committed(cfg) == [run.plan.ranges[0].id] and commits.progress.done == 1


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
