"""The runner on a real local Ray: output, exactly-once resume after real crashes, bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline import Stage
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.commit.verify import verify_output
from airflow_provider_raybatch.pipeline.errors import ConfigError, InputChangedError, InputError, StageError
from airflow_provider_raybatch.pipeline.execution.range_commits import RECORD_INTERVAL_ENV
from airflow_provider_raybatch.pipeline.execution.stages import HAND_ON_BYTES_ENV
from airflow_provider_raybatch.pipeline.planning.planner import recorded_ranges
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.summary import RunSummary
from benchmarks.support.processes import ray_processes_of
from tests.support.data import assert_exactly_once, assert_output_sound, features_table, read_output, write_input
from tests.support.pipeline_runs import (
    RECORD_EACH_RANGE,
    PlanRecorder,
    commit_count,
    config,
    kill_leftovers,
    own_ray_env,
    ray_processes,
    run_in_subprocess,
)

pytestmark = pytest.mark.usefixtures("ray_local")


def test_output_holds_kept_columns_and_predictions_once(tmp_path):
    write_input(tmp_path / "in", [250, 130])
    summary = run_batch_inference(config(tmp_path, keep_columns=["group"]))
    out = read_output(tmp_path / "out")
    assert set(out.column_names) == {"id", "group", "score"}
    assert_exactly_once(out, range(380))
    features = [
        features_table(n, start)["features"].combine_chunks().flatten().to_numpy()
        for n, start in [(250, 0), (130, 250)]
    ]
    expected = np.concatenate(features).reshape(-1, 8).sum(axis=1)
    assert np.allclose(out.sort_by("id")["score"].to_numpy(), expected, rtol=1e-5)
    assert summary.rows_in == summary.rows_out == summary.rows_processed == 380
    assert summary.ranges_total == summary.ranges_done == 5 and summary.ranges_skipped == 0
    # Bookkeeping stays under _raybatch/: Ray Data reads exactly the committed rows too.
    import ray

    assert ray.data.read_parquet(str(tmp_path / "out")).count() == 380


def test_a_finished_run_leaves_no_temporary_files(tmp_path):
    """The write steps' receipts (one per block) go once their ranges are recorded (issue 25, case 10)."""
    write_input(tmp_path / "in", [250, 130])
    run_batch_inference(config(tmp_path, rows_per_range=20))
    tmp = tmp_path / "out" / "_raybatch" / "tmp"
    assert not tmp.exists() or not any(tmp.rglob("*")), sorted(tmp.rglob("*"))[:5]
    assert_output_sound(tmp_path / "out", range(380))


def test_rerun_of_a_finished_output_is_a_fast_no_op(tmp_path):
    write_input(tmp_path / "in", [300])
    first = run_batch_inference(config(tmp_path))
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    again = run_batch_inference(config(tmp_path))
    assert (again.rows_in, again.rows_out, again.ranges_total) == (first.rows_in, first.rows_out, 3)
    assert again.ranges_skipped == 3 and again.ranges_done == 0 and again.rows_processed == 0
    assert again.seconds < first.seconds
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == files


def test_the_first_range_is_recorded_at_once_and_the_others_in_batches(tmp_path, monkeypatch):
    # Records wait up to the interval to share a segment; the run's first result does not wait.
    monkeypatch.setenv(RECORD_INTERVAL_ENV, "60")
    write_input(tmp_path / "in", [400])
    run_batch_inference(config(tmp_path))
    times = sorted(r.committed_at for r in OutputLedger.open(str(tmp_path / "out")).committed().values())
    assert len(times) == 4 and times[0] < times[1] == times[3]


def test_derived_row_id_is_stable_and_unique(tmp_path):
    write_input(tmp_path / "in", [150, 150])
    run_batch_inference(config(tmp_path, id_column=None))
    out = read_output(tmp_path / "out").sort_by("_row_id")
    row_ids = out["_row_id"].to_pylist()
    assert row_ids == [*range(150), *((1 << 40) + i for i in range(150))]
    assert out["id"].to_pylist() == list(range(300))


def test_failed_first_try_resumes_from_committed_ranges(tmp_path):
    write_input(tmp_path / "in", [1000])
    marker = tmp_path / "fail-marker"
    marker.touch()
    cfg = config(
        tmp_path,
        predictor="tests.support.predictors:FailWhileMarked",
        predictor_kwargs={"marker": str(marker), "fail_from_id": 600, "output": str(tmp_path / "out")},
        batch_size=100,
    )
    with pytest.raises(Exception, match="injected failure"):
        run_batch_inference(cfg)
    committed_after_failure = commit_count(tmp_path / "out")
    assert 0 < committed_after_failure < 10
    marker.unlink()
    summary = run_batch_inference(cfg)
    assert summary.ranges_skipped == committed_after_failure
    assert summary.rows_processed == 1000 - 100 * committed_after_failure
    assert_output_sound(tmp_path / "out", range(1000))


def test_a_failed_run_kept_as_an_exception_releases_its_replicas(tmp_path):
    """A caller that keeps the error (a retry in the same process, a notebook's last traceback)
    does not keep the failed run's replicas, nor the CPUs they reserve, once their work ends."""
    import ray

    write_input(tmp_path / "in", [200])
    (tmp_path / "busy").mkdir()
    cfg = config(
        tmp_path,
        predictor="tests.support.predictors:FailWhileAnotherRangeRuns",
        predictor_kwargs={"folder": str(tmp_path / "busy")},
        concurrency=2,
    )

    def free_cpus_within(seconds: float, at_least: float) -> float:
        deadline = time.monotonic() + seconds
        while (free := ray.available_resources().get("CPU", 0)) < at_least and time.monotonic() < deadline:
            time.sleep(0.5)
        return free

    # What the run finds free (the shared Ray's other users, an earlier run's replicas still ending).
    before = free_cpus_within(30, ray.cluster_resources()["CPU"])
    with pytest.raises(Exception, match="injected failure") as failure:
        run_batch_inference(cfg)
    assert os.listdir(tmp_path / "busy"), "the other range was not being scored when the run failed"
    assert free_cpus_within(60, before) >= before, "a replica of the failed run still holds its CPU"
    assert "injected failure" in "".join(traceback.format_exception(failure.value))  # it still prints


def test_sigkill_between_publishing_and_committing_loses_nothing_and_duplicates_nothing(tmp_path):
    write_input(tmp_path / "in", [800])
    crashed = run_in_subprocess(
        tmp_path, "tests.support.predictors:score", {}, env={"RAYBATCH_TEST_CRASH": "published:3", **RECORD_EACH_RANGE}
    )
    kill_leftovers(crashed.ray_tmp)
    assert crashed.returncode == -signal.SIGKILL, crashed.output
    out = tmp_path / "out"
    assert commit_count(out) == 2
    assert len(list(out.glob("part-*.parquet"))) == 3  # the third file is in place, uncommitted
    summary = run_batch_inference(config(tmp_path))
    assert summary.ranges_skipped == 2 and summary.rows_processed == 600
    assert_output_sound(out, range(800))


def test_killed_process_resumes_and_embedded_ray_leaves_no_process(tmp_path):
    write_input(tmp_path / "in", [1500])
    out = tmp_path / "out"
    slow = {"delay_s": 0.4}
    running = run_in_subprocess(tmp_path, "tests.support.predictors:SlowScore", slow, wait=False)
    try:
        deadline = time.monotonic() + 120
        while commit_count(out) < 3 and running.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running.poll() is None, running.stdout.read()
        running.kill()  # SIGKILL, mid-run
        running.wait()
        # No finally ran in the killed process: its reaper ends the embedded Ray.
        deadline = time.monotonic() + 15
        while ray_processes_of(running.ray_tmp) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ray_processes_of(running.ray_tmp) == []
    finally:
        kill_leftovers(running.ray_tmp)
    committed = commit_count(out)
    assert 3 <= committed < 15

    resumed = run_in_subprocess(tmp_path, "tests.support.predictors:SlowScore", slow)
    assert resumed.returncode == 0, resumed.output
    summary = RunSummary.from_dict(json.loads(resumed.output.split("SUMMARY ", 1)[1].splitlines()[0]))
    assert summary.ranges_skipped == committed
    assert summary.rows_processed == 1500 - 100 * committed
    assert_output_sound(out, range(1500))
    time.sleep(2)
    assert ray_processes(resumed.ray_tmp) == []


def test_overwrite_starts_afresh_once_per_run(tmp_path):
    write_input(tmp_path / "in", [300])
    run_batch_inference(config(tmp_path))
    stale = tmp_path / "out" / "part-stale.parquet"
    pq.write_table(features_table(3, 9000), stale)  # a leftover that no commit names

    again = run_batch_inference(config(tmp_path, mode="overwrite", run_key="run-1"))
    assert again.ranges_done == 3 and not stale.exists()
    retry = run_batch_inference(config(tmp_path, mode="overwrite", run_key="run-1"))
    assert retry.ranges_skipped == 3  # a retry of the same run resumes
    later = run_batch_inference(config(tmp_path, mode="overwrite", run_key="run-2"))
    assert later.ranges_done == 3
    assert_output_sound(tmp_path / "out", range(300))


def test_changed_input_is_refused_unless_overwriting(tmp_path):
    write_input(tmp_path / "in", [200, 100])
    run_batch_inference(config(tmp_path))
    pq.write_table(features_table(100, 300), tmp_path / "in" / "part-2.parquet")
    with pytest.raises(InputChangedError, match=r"changed since .* \(added: part-2.parquet\).*mode='overwrite'"):
        run_batch_inference(config(tmp_path))
    summary = run_batch_inference(config(tmp_path, mode="overwrite"))
    assert summary.rows_out == 400
    assert_output_sound(tmp_path / "out", range(400))


def test_changed_settings_are_refused(tmp_path):
    write_input(tmp_path / "in", [200])
    run_batch_inference(config(tmp_path))
    with pytest.raises(ConfigError, match=r"different settings .*: rows_per_range: 100 -> 50\. .*mode='overwrite'"):
        run_batch_inference(config(tmp_path, rows_per_range=50))
    with pytest.raises(ConfigError, match=r"stages\[0\]\.predictor: '\S+:score' -> '\S+:SlowScore'"):
        run_batch_inference(config(tmp_path, predictor="tests.support.predictors:SlowScore"))


def test_empty_input_files_commit_an_empty_readable_output(tmp_path):
    write_input(tmp_path / "in", [0, 0])
    summary = run_batch_inference(config(tmp_path, keep_columns=["group"]))
    assert summary.rows_out == 0 and summary.ranges_total == 2 and summary.ranges_done == 2
    assert commit_count(tmp_path / "out") == 2
    out = read_output(tmp_path / "out")
    assert out.num_rows == 0 and out.column_names == ["id", "group"]
    import ray

    assert ray.data.read_parquet(str(tmp_path / "out")).count() == 0


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"input_path": "{tmp}/missing"}, InputError, "input path '{tmp}/missing' does not exist"),
        ({"input_path": "{tmp}/in/*.csv"}, InputError, "input path '{tmp}/in/\\*.csv' matches no file"),
        (
            {"columns": ["id", "features", "nope"]},
            InputError,
            r"\['nope'\] not found in .* it has columns \['id', 'features', 'group'\]",
        ),
        (
            {"predictor": "tests.support.predictors:Missing"},
            ConfigError,
            "cannot import predictor 'tests.support.predictors:Missing'",
        ),
        ({"predictor": "no_such_module:Predictor"}, ConfigError, "cannot import predictor 'no_such_module:Predictor'"),
        (
            {"predictor": "tests.support.predictors:NOT_CALLABLE"},
            ConfigError,
            "predictor 'tests.support.predictors:NOT_CALLABLE' is not callable",
        ),
        ({"output_path": "{tmp}/in/out"}, ConfigError, "output path '{tmp}/in/out' overlaps input path"),
        ({"output_path": "{tmp}/in"}, ConfigError, "overlaps input path"),
        ({"num_gpus": 1}, ConfigError, r"num_gpus=1 per replica but the Ray cluster has 0 GPU"),
        (
            {"concurrency": 64},
            ConfigError,
            r"reserve 64 CPUs \(replicas x num_cpus: LoadMarker: 64 x 1\), but the Ray cluster has \d+ CPUs.*stall",
        ),
        ({"concurrency": (3, 2)}, ConfigError, "concurrency must be"),
        ({"keep_columns": ["nope"]}, InputError, r"keep_columns \['nope'\] are not input columns"),
    ],
)
def test_bad_settings_fail_before_the_model_loads(tmp_path, overrides, error, message):
    write_input(tmp_path / "in", [100])
    marker = tmp_path / "model-loaded"
    overrides = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in overrides.items()}
    cfg = config(
        tmp_path,
        **{
            "predictor": "tests.support.predictors:LoadMarker",
            "predictor_kwargs": {"marker": str(marker)},
            **overrides,
        },
    )
    with pytest.raises(error, match=message.format(tmp=tmp_path)):
        run_batch_inference(cfg)
    assert not marker.exists()
    assert not (tmp_path / "in" / "out").exists()


@pytest.mark.parametrize("mode", ["resume", "overwrite"])
def test_a_folder_of_someone_elses_files_is_refused_in_either_mode(tmp_path, mode):
    write_input(tmp_path / "in", [10])
    (tmp_path / "out").mkdir()
    names = [f"report-{i}.csv" for i in range(7)]
    for name in names:
        (tmp_path / "out" / name).write_text("precious")
    with pytest.raises(
        ConfigError, match=rf"is not empty and was not written by raybatch \(found {names[:5]}\)".replace("[", r"\[")
    ):
        run_batch_inference(config(tmp_path, mode=mode))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == names


def test_overwrite_removes_only_what_the_provider_wrote(tmp_path):
    write_input(tmp_path / "in", [300])
    run_batch_inference(config(tmp_path, keep_columns=["group"]))
    notes = tmp_path / "out" / "NOTES.txt"
    notes.write_text("kept by the team")
    (tmp_path / "out" / "archive").mkdir()
    (tmp_path / "out" / "archive" / "part-old.parquet").write_bytes(b"someone else's")

    summary = run_batch_inference(config(tmp_path, mode="overwrite", run_key="another run"))
    assert summary.ranges_done == 3
    assert notes.read_text() == "kept by the team"
    assert (tmp_path / "out" / "archive" / "part-old.parquet").read_bytes() == b"someone else's"
    assert verify_output(str(tmp_path / "out")) == []
    assert_exactly_once(pq.read_table([str(p) for p in (tmp_path / "out").glob("part-*.parquet")]), range(300))


def test_a_filesystem_or_bucket_root_is_refused_as_output(tmp_path, s3_server):
    write_input(tmp_path / "in", [10])
    with pytest.raises(ConfigError, match=r"output path '/' is a filesystem or bucket root"):
        run_batch_inference(config(tmp_path, output_path="/", mode="overwrite"))
    with pytest.raises(ConfigError, match=r"output path 's3://raybatch-test/' is a filesystem or bucket root"):
        run_batch_inference(config(tmp_path, output_path="s3://raybatch-test/", storage_options=s3_server))


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_an_output_overlapping_the_input_through_dots_or_a_symlink_is_refused(tmp_path):
    """Paths are compared resolved, in both directions: compared as written, the output was written
    into the input, and the next run over that input read it back as input."""
    write_input(tmp_path / "data" / "in", [100])
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "in_link").symlink_to(tmp_path / "data" / "in")
    (tmp_path / "data_link").symlink_to(tmp_path / "data")
    before = files_under(tmp_path / "data")
    cases = [
        # The output inside the input.
        ("data/in", "elsewhere/../data/in/out"),
        ("data/in", "in_link/out"),
        ("in_link/*.parquet", "data/in/out"),
        # The input inside the output.
        ("data/in", "elsewhere/../data"),
        ("data_link/in", "data"),
    ]
    for input_path, output_path in cases:
        cfg = config(tmp_path, input_path=f"{tmp_path}/{input_path}", output_path=f"{tmp_path}/{output_path}")
        with pytest.raises(ConfigError, match=re.escape(f"output path '{tmp_path}/{output_path}' overlaps input path")):
            run_batch_inference(cfg)
    assert files_under(tmp_path / "data") == before and files_under(tmp_path / "elsewhere") == []


def test_an_s3_output_overlapping_the_input_through_dots_is_refused(tmp_path, s3_server):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server)
    with fs.open("raybatch-test/dots/in/data.parquet", "wb") as f:
        pq.write_table(features_table(10), f)
    for output_path in ("s3://raybatch-test/dots/other/../in/out", "s3://raybatch-test/dots/./in/out"):
        cfg = config(
            tmp_path, input_path="s3://raybatch-test/dots/in", output_path=output_path, storage_options=s3_server
        )
        with pytest.raises(ConfigError, match=re.escape(f"output path '{output_path}' overlaps input path")):
            run_batch_inference(cfg)
    fs.invalidate_cache()
    assert fs.find("raybatch-test/dots") == ["raybatch-test/dots/in/data.parquet"]


def test_an_output_path_that_is_a_file_is_refused(tmp_path, s3_server):
    """Writing the output's bookkeeping would fail, and every retry the same way."""
    import s3fs

    write_input(tmp_path / "in", [100])
    (tmp_path / "results.parquet").write_bytes(b"someone's file")
    with pytest.raises(ConfigError, match=re.escape(f"output path '{tmp_path}/results.parquet' is an existing file")):
        run_batch_inference(config(tmp_path, output_path=str(tmp_path / "results.parquet")))
    with pytest.raises(
        ConfigError,
        match=re.escape(f"output path '{tmp_path}/results.parquet/out' lies under '{tmp_path}/results.parquet'"),
    ):
        run_batch_inference(config(tmp_path, output_path=str(tmp_path / "results.parquet" / "out")))
    assert (tmp_path / "results.parquet").read_bytes() == b"someone's file"

    fs = s3fs.S3FileSystem(**s3_server)
    fs.pipe("raybatch-test/results.parquet", b"someone's object")
    with pytest.raises(
        ConfigError, match=re.escape("output path 's3://raybatch-test/results.parquet' is an existing file")
    ):
        run_batch_inference(
            config(tmp_path, output_path="s3://raybatch-test/results.parquet", storage_options=s3_server)
        )
    fs.invalidate_cache()
    assert fs.cat("raybatch-test/results.parquet") == b"someone's object"
    assert [p for p in fs.find("raybatch-test") if p.startswith("raybatch-test/results.parquet/")] == []


def test_a_file_name_that_is_not_utf8_is_refused_by_its_escaped_name(tmp_path):
    """Such a name is listed with surrogate escapes, which fail when encoded (range ids, the plan, logs)."""
    write_input(tmp_path / "in", [100])
    with open(os.path.join(os.fsencode(tmp_path / "in"), b"caf\xe9.parquet"), "wb") as f:
        pq.write_table(features_table(10, 100), f)
    with pytest.raises(InputError) as raised:
        run_batch_inference(config(tmp_path))
    message = str(raised.value)
    assert f"'{tmp_path}/in/caf\\xe9.parquet'" in message and "rename" in message, message
    message.encode("utf-8")  # the message itself can be logged
    assert not (tmp_path / "out").exists()


def test_a_stage_returning_the_wrong_row_count_is_named(tmp_path):
    write_input(tmp_path / "in", [100])
    # Raised on a Ray worker; the driver raises the stage's error itself, not Ray's wrapper.
    with pytest.raises(
        StageError, match=r"^stage 'drop_one_row' returned column 'score' with 99 rows for a batch of 100"
    ):
        run_batch_inference(config(tmp_path, predictor="tests.support.predictors:drop_one_row"))
    assert commit_count(tmp_path / "out") == 0


def test_s3_input_and_output_through_a_real_s3_protocol(tmp_path, s3_server):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server)
    for i, n in enumerate([150, 100]):
        with fs.open(f"raybatch-test/in/part-{i}.parquet", "wb") as f:
            pq.write_table(features_table(n, 150 * i), f, row_group_size=50)
    cfg = config(
        tmp_path, input_path="s3://raybatch-test/in/", output_path="s3://raybatch-test/out/", storage_options=s3_server
    )
    summary = run_batch_inference(cfg)
    assert summary.rows_out == 250
    fs.invalidate_cache()
    assert not any(p.rsplit("/", 1)[-1].startswith("part-") for p in fs.ls("raybatch-test/out/_raybatch"))
    out = pq.read_table("raybatch-test/out", filesystem=fs)
    assert_exactly_once(out, range(250))
    assert run_batch_inference(cfg).ranges_skipped == summary.ranges_total


def test_an_output_of_a_newer_layout_is_refused_and_left_alone(tmp_path):
    write_input(tmp_path / "in", [200])
    run_batch_inference(config(tmp_path))
    plan_file = tmp_path / "out" / "_raybatch" / "plan.json"
    plan_file.write_text(json.dumps({**json.loads(plan_file.read_text()), "version": 99}))
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "out").rglob("*"))
    for mode in ("resume", "overwrite"):
        with pytest.raises(
            ConfigError, match=r"written by a newer version .* \(layout version 99; this version reads up to 2\)"
        ):
            run_batch_inference(config(tmp_path, mode=mode))
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "out").rglob("*")) == before


def as_layout_1(output: Path, keep: int) -> list[str]:
    """Rewrite a finished output as version 1 of the provider wrote it (a record file per range, the
    ranges listed in the plan), with only its first ``keep`` records; return the ranges' ids."""
    meta = output / "_raybatch"
    plan = json.loads((meta / "plan.json").read_text())
    ranges = recorded_ranges(plan["input"], plan["job"]["rows_per_range"])
    files = [{k: v for k, v in f.items() if k != "row_groups"} for f in plan["input"]["files"]]
    plan.update(version=1, input={"files": files, "ranges": [dataclasses.asdict(r) for r in ranges]})
    (meta / "plan.json").write_text(json.dumps(plan))
    committed = OutputLedger.open(str(output)).committed()
    (meta / "commits").mkdir()
    for range_id in [r.id for r in ranges][:keep]:
        record = dataclasses.replace(committed[range_id], committed_at=None, plan=None)
        (meta / "commits" / f"{range_id}.json").write_text(json.dumps(record.to_json()))
    (meta / "manifest.json").unlink()
    return [r.id for r in ranges]


def test_an_output_of_layout_1_is_verified_resumed_and_upgraded(tmp_path):
    write_input(tmp_path / "in", [500])
    run_batch_inference(config(tmp_path))
    out = tmp_path / "out"
    ids = as_layout_1(out, keep=3)
    faults = verify_output(str(out))  # read as version 1 wrote it: the two ranges without a record
    assert faults[0] == f"2 planned range(s) not committed: {ids[3]}, {ids[4]}", faults
    assert faults[1] == f"2 part file(s) without a commit record: part-{ids[3]}.parquet, part-{ids[4]}.parquet"

    summary = run_batch_inference(config(tmp_path))
    assert summary.ranges_skipped == 3 and summary.ranges_done == 2 and summary.rows_processed == 200
    assert_output_sound(out, range(500))
    # Upgraded: a manifest instead of a record per range, the plan without its list of ranges.
    plan = json.loads((out / "_raybatch" / "plan.json").read_text())
    assert plan["version"] == 2 and "ranges" not in plan["input"]
    assert not (out / "_raybatch" / "commits").exists() and (out / "_raybatch" / "manifest.json").exists()
    assert run_batch_inference(config(tmp_path)).ranges_skipped == 5


def test_a_crash_while_records_wait_for_their_batch_redoes_only_those_ranges(tmp_path):
    write_input(tmp_path / "in", [800])
    # Records wait up to a minute: the third range is published when the process dies, and only
    # the first one, recorded at once, is recorded.
    env = {"RAYBATCH_TEST_CRASH": "published:3", "RAYBATCH_RECORD_INTERVAL_S": "60"}
    crashed = run_in_subprocess(tmp_path, "tests.support.predictors:score", {}, env=env)
    kill_leftovers(crashed.ray_tmp)
    assert crashed.returncode == -signal.SIGKILL, crashed.output
    out = tmp_path / "out"
    assert commit_count(out) == 1
    assert len(list(out.glob("part-*.parquet"))) == 3  # two of them published without a record
    summary = run_batch_inference(config(tmp_path))
    assert summary.ranges_skipped == 1 and summary.rows_processed == 700
    assert_output_sound(out, range(800))


# --- where rows are read and written -----------------------------------------------------------


def test_replicas_on_cpus_read_and_write_their_own_rows(tmp_path):
    write_input(tmp_path / "in", [250, 130])
    stages = [
        Stage("tests.support.predictors:normalize", batch_size=40),
        Stage("tests.support.predictors:SumModel", batch_size=40),
    ]
    with PlanRecorder() as recorder:
        run_batch_inference(config(tmp_path, stages=stages))
    (plan,) = recorder.plans
    # Rows cross no object store: the first stage's replicas read, the last one's write.
    assert plan == (
        "InputDataBuffer[Input] -> ActorPoolMapOperator[ReadRange->MapBatches(StageWorker)] -> "
        "ActorPoolMapOperator[MapBatches(WritingStageWorker)]"
    ), plan
    out = read_output(tmp_path / "out")
    assert_exactly_once(out, range(380))
    # Batches of 40 rows inside blocks of 100: a range's rows still go to one file.
    assert len(list((tmp_path / "out").glob("part-*.parquet"))) == 3 + 2


HAND_ON_SCRIPT = """
import sys
from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
stages = [Stage("tests.support.predictors:normalize", batch_size=40), Stage("tests.support.predictors:SumModel", batch_size=40)]
run_batch_inference(BatchInferenceConfig(sys.argv[1], sys.argv[2], stages, id_column="id", rows_per_range=100))
"""


def test_large_scored_rows_go_on_within_a_range_and_each_range_is_committed_once(tmp_path):
    write_input(tmp_path / "in", [250, 130])
    # Every scored batch weighs more than a byte: each is handed on at once, within its range.
    ray_tmp, env = own_ray_env({HAND_ON_BYTES_ENV: "1"})
    args = [sys.executable, "-c", HAND_ON_SCRIPT, str(tmp_path / "in"), str(tmp_path / "out")]
    try:
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    finally:
        kill_leftovers(ray_tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "out"
    # Ranges of 100 rows reached the writing stage in blocks of 40 + 40 + 20 rows: a file each,
    # and each range committed once, when all its files were written.
    assert len(list(out.glob("part-*.parquet"))) == 3 + 3 + 2 + 3 + 1
    assert commit_count(out) == 5
    assert_output_sound(out, range(380))


def test_each_range_is_committed_while_the_next_is_scored(tmp_path, monkeypatch):
    """A range's commit does not wait for later ranges: one replica scores the ranges one after
    another, each batch (a whole range) taking a second, and by the end of each the ranges before
    it are committed. (Ray Data's iterator, prefetching, had handed the driver each range's
    metadata only once two more ranges were written.)"""
    monkeypatch.setenv(RECORD_INTERVAL_ENV, "0")
    write_input(tmp_path / "in", [300], row_group_size=50)  # a block per range
    out = tmp_path / "out"
    run_batch_inference(
        config(
            tmp_path,
            predictor="tests.support.predictors:CommittedSeen",
            predictor_kwargs={"output": str(out), "delay_s": 1.0},
            concurrency=1,
            batch_size=50,
            rows_per_range=50,
        )
    )
    rows = read_output(out).sort_by("id")
    seen = {i // 50: c for i, c in zip(rows["id"].to_pylist(), rows["committed"].to_pylist(), strict=True)}
    # All the ranges before it (0, 1, 2, ... here); the range just before may still be on its way
    # to the driver on a loaded machine. The lag of two blocks gave 0, 0, 0, 1, 2, 3.
    assert all(seen[i] >= i - 1 for i in range(6)), seen


def test_concurrency_none_fills_the_cpus_with_replicas_whose_threads_match_their_cpus(tmp_path, caplog):
    import ray

    write_input(tmp_path / "in", [250, 250])
    cpus = int(ray.cluster_resources()["CPU"])
    with caplog.at_level("INFO", logger="airflow_provider_raybatch.pipeline.runner"):
        run_batch_inference(
            config(tmp_path, predictor="tests.support.predictors:ThreadsSeen", concurrency=None, batch_size=50)
        )
    # Replicas that read their own rows: one per CPU (5 ranges to share).
    assert f"Stage 'ThreadsSeen': {min(cpus, 5)} replica(s) of 1 CPU (concurrency=None)" in caplog.text
    out = read_output(tmp_path / "out")
    assert_exactly_once(out, range(500))
    assert len(set(out["pid"].to_pylist())) <= min(cpus, 5)
    # One CPU each: one torch thread and one Arrow thread, also where a warm worker imported torch first.
    assert set(out["torch_threads"].to_pylist()) == {1} and set(out["arrow_threads"].to_pylist()) == {1}


GPU_SCRIPT = """
import json, logging, sys
import ray
from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.runtime.local_ray import python_path_runtime_env
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from tests.support.pipeline_runs import PlanRecorder
# A GPU declared to Ray (none is there): the model stage reserves it, and its code runs on CPU.
ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, runtime_env=python_path_runtime_env())
def config(output, *stages):
    return BatchInferenceConfig(sys.argv[1], output, list(stages), id_column="id", rows_per_range=100)
try:  # read tasks need a CPU of their own beside a GPU stage's replicas
    run_batch_inference(config(sys.argv[2] + "-refused", Stage("tests.support.predictors:SumModel", num_cpus=2, num_gpus=1)))
except Exception as e:
    print("REFUSED " + str(e))
stages = [Stage("tests.support.predictors:normalize", batch_size=40),
          Stage("tests.support.predictors:SumModel", batch_size=40, num_gpus=1)]
with PlanRecorder() as recorder:
    run_batch_inference(config(sys.argv[2], *stages))
ray.shutdown()
print("PLANS " + json.dumps(recorder.plans))
"""


def test_a_replica_on_a_gpu_leaves_reading_and_writing_to_tasks(tmp_path):
    write_input(tmp_path / "in", [250, 130])
    ray_tmp, env = own_ray_env()
    args = [sys.executable, "-c", GPU_SCRIPT, str(tmp_path / "in"), str(tmp_path / "out")]
    try:
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    finally:
        kill_leftovers(ray_tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reserve 2 CPUs (replicas x num_cpus: SumModel: 1 x 2) and reading needs 1" in done.stdout, done.stdout
    (plans,) = [json.loads(line[6:]) for line in done.stdout.splitlines() if line.startswith("PLANS ")]
    # The GPU stage neither reads nor writes: tasks on CPUs do, while it scores the next block.
    assert plans == [
        "InputDataBuffer[Input] -> ActorPoolMapOperator[ReadRange->MapBatches(StageWorker)] -> "
        "ActorPoolMapOperator[MapBatches(StageWorker)] -> TaskPoolMapOperator[MapBatches(write_block)]"
    ], plans
    assert_exactly_once(read_output(tmp_path / "out"), range(380))
