"""Shards of one output run by separate tasks, smoke runs on the first rows, the armed crash."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

import numpy as np
import pytest

from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.errors import ConfigError, InputChangedError
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.shards import Shard, plan_shards
from airflow_provider_raybatch.pipeline.store.files import resolve
from tests.support.data import assert_exactly_once, assert_output_sound, features_table, read_output, write_input
from tests.support.pipeline_runs import RECORD_EACH_RANGE, commit_count, config, kill_leftovers, run_in_subprocess

pytestmark = pytest.mark.usefixtures("ray_local")


def part_files(output: Path) -> list[str]:
    return sorted(p.name for p in output.glob("part-*.parquet"))


def test_shards_together_write_what_one_run_writes(tmp_path):
    write_input(tmp_path / "in", [450, 320])
    whole = run_batch_inference(config(tmp_path, output_path=str(tmp_path / "whole")))

    mapped = config(tmp_path, output_path=str(tmp_path / "mapped"))
    shards = plan_shards(mapped, 3)
    assert [p.index for p in shards] == [0, 1, 2] and {p.count for p in shards} == {3}
    assert sum(p.rows for p in shards) == 770
    ids = [i for p in shards for i in p.range_ids]
    assert len(ids) == len(set(ids)) == whole.ranges_total  # each range in exactly one shard
    assert plan_shards(mapped, 3) == shards  # deterministic: a rerun maps the same way
    assert commit_count(tmp_path / "mapped") == 0  # planning runs nothing

    summaries = [run_batch_inference(dataclasses.replace(mapped, range_ids=p.range_ids)) for p in shards]
    assert [s.ranges_total for s in summaries] == [len(p.range_ids) for p in shards]
    assert sum(s.rows_out for s in summaries) == 770

    assert part_files(tmp_path / "mapped") == part_files(tmp_path / "whole")
    one, many = read_output(tmp_path / "whole").sort_by("id"), read_output(tmp_path / "mapped").sort_by("id")
    assert_exactly_once(many, range(770))
    assert many.equals(one)


def test_a_shard_touches_only_its_own_ranges(tmp_path):
    write_input(tmp_path / "in", [600])
    cfg = config(tmp_path)
    first, second = plan_shards(cfg, 2)
    out = (*resolve(str(tmp_path / "out")), str(tmp_path / "out"))
    # Another shard's task is writing a range right now, and left an uncommitted file.
    in_flight = Path(OutputLedger(*out, range_ids=second.range_ids).tmp_file("7"))
    in_flight.write_bytes(b"being written")
    stale_own = Path(OutputLedger(*out, range_ids=first.range_ids).tmp_file("0"))
    stale_own.write_bytes(b"left by a killed try of this shard")

    summary = run_batch_inference(dataclasses.replace(cfg, range_ids=first.range_ids))
    assert summary.ranges_done == 3 and summary.rows_processed == 300
    assert in_flight.exists() and not stale_own.exists()
    # A retry of the shard resumes; the plan is never rewritten nor the output reset.
    plan_before = (tmp_path / "out" / "_raybatch" / "plan.json").read_text()
    again = run_batch_inference(dataclasses.replace(cfg, range_ids=first.range_ids, mode="overwrite"))
    assert again.ranges_skipped == 3 and again.ranges_done == 0
    assert (tmp_path / "out" / "_raybatch" / "plan.json").read_text() == plan_before
    assert commit_count(tmp_path / "out") == 3


def test_shards_need_a_planned_output_with_the_same_input_and_settings(tmp_path):
    write_input(tmp_path / "in", [300])
    cfg = config(tmp_path)
    with pytest.raises(ConfigError, match="has not been planned: run plan_shards"):
        run_batch_inference(dataclasses.replace(cfg, range_ids=["x-0-100"]))
    (shard,) = plan_shards(cfg, 1)
    with pytest.raises(
        ConfigError, match=r"planned with different settings .*: stages\[0\]\.predictor: .* -> '\S+:SlowScore'"
    ):
        run_batch_inference(
            dataclasses.replace(
                config(tmp_path, predictor="tests.support.predictors:SlowScore"), range_ids=shard.range_ids
            )
        )
    with pytest.raises(Exception, match="not in the input's plan"):
        run_batch_inference(dataclasses.replace(cfg, range_ids=["nope-0-1"]))
    write_input(tmp_path / "in", [300, 10])
    with pytest.raises(InputChangedError, match="rerun the planning task"):
        run_batch_inference(dataclasses.replace(cfg, range_ids=shard.range_ids))


def test_plan_shards_checks_its_arguments(tmp_path):
    write_input(tmp_path / "in", [100])
    with pytest.raises(ConfigError, match="shards must be an integer >= 1"):
        plan_shards(config(tmp_path), 0)
    with pytest.raises(ConfigError, match="shard must be one item returned by plan_shards"):
        Shard.from_dict({"index": 0})
    # More shards than ranges: one range each.
    assert [len(p.range_ids) for p in plan_shards(config(tmp_path, rows_per_range=50), 5)] == [1, 1]


def test_max_rows_processes_the_first_rows_once_and_is_part_of_the_job(tmp_path):
    write_input(tmp_path / "in", [250, 250])
    smoke = run_batch_inference(config(tmp_path, max_rows=230))
    assert smoke.rows_in == smoke.rows_out == 230 and smoke.ranges_total == 3
    out = read_output(tmp_path / "out")
    assert_exactly_once(out, range(230))
    expected = features_table(250, 0)["features"].combine_chunks().flatten().to_numpy().reshape(-1, 8)[:230]
    assert np.allclose(out.sort_by("id")["score"].to_numpy(), expected.sum(axis=1), rtol=1e-5)
    assert run_batch_inference(config(tmp_path, max_rows=230)).ranges_skipped == 3
    # A full run never completes (or mixes with) a smoke run's output.
    with pytest.raises(ConfigError, match=r"different settings .*: max_rows: 230 -> None"):
        run_batch_inference(config(tmp_path))
    with pytest.raises(ConfigError, match="max_rows must be an integer >= 1"):
        run_batch_inference(config(tmp_path, output_path=str(tmp_path / "o2"), max_rows=0))
    # More rows asked than there are: the whole input.
    assert run_batch_inference(config(tmp_path, output_path=str(tmp_path / "o3"), max_rows=10**6)).rows_out == 500


def test_an_armed_crash_fires_once(tmp_path, monkeypatch):
    write_input(tmp_path / "in", [400])
    armed = tmp_path / "armed"
    env = {"RAYBATCH_TEST_CRASH": "committed:1", "RAYBATCH_TEST_CRASH_ONCE": str(armed), **RECORD_EACH_RANGE}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # Not armed (no file): the crash point is inert, in this very process.
    assert run_batch_inference(config(tmp_path)).ranges_done == 4
    (tmp_path / "out" / "_raybatch" / "manifest.json").unlink()  # forget the commits: every range runs again

    armed.touch()
    crashed = run_in_subprocess(tmp_path, "tests.support.predictors:score", {}, env=env)
    kill_leftovers(crashed.ray_tmp)
    assert crashed.returncode == -signal.SIGKILL, crashed.output
    assert not armed.exists() and commit_count(tmp_path / "out") == 1
    # Fired, so disarmed: the retry runs through and resumes.
    summary = run_batch_inference(config(tmp_path))
    assert summary.ranges_skipped == 1 and summary.ranges_done == 3
    assert_output_sound(tmp_path / "out", range(400))
