"""The no-progress watchdog on a real local Ray, with a predictor that hangs on one batch."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage, TransformStage
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.commit.verify import verify_output
from airflow_provider_raybatch.pipeline.errors import ConfigError, NoProgressError, NotRetryableError
from airflow_provider_raybatch.pipeline.execution.watchdog import Watchdog
from airflow_provider_raybatch.pipeline.planning.planner import Plan, RowRange
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.summary import Progress
from tests.support.data import assert_exactly_once, assert_output_sound, read_output, write_input


def hanging_config(tmp_path: Path, hang_id: int, kind: type[Stage] = Stage, **kwargs) -> BatchInferenceConfig:
    """Two stages; the first hangs on the batch holding ``hang_id`` while its marker exists."""
    marker = tmp_path / "hang-marker"
    marker.touch()
    settings = {"input_path": str(tmp_path / "in"), "output_path": str(tmp_path / "out"), **kwargs}
    predictor = "tests.support.stall_predictors:" + ("hanging_transform" if kind is TransformStage else "HangOnce")
    return BatchInferenceConfig(
        stages=[
            kind(predictor, {"marker": str(marker), "hang_id": hang_id}, name="hangs", num_cpus=0.5, batch_size=100),
            Stage("tests.support.stall_predictors:double", name="doubles", num_cpus=0.5),
        ],
        id_column="id",
        rows_per_range=100,
        **settings,
    )


@pytest.fixture(scope="module")
def warm_ray(ray_local, tmp_path_factory):
    """The watchdog counts the stages' start-up. A cold local Ray took 17 s to its first batch on
    this loaded 2-core machine (6 s warm): warm its worker pool first, on an output of its own.

    With a transform first, so that read tasks run and leave their workers idle for the next
    run's (replicas on CPUs read in their own processes, which end with the run).
    """
    tmp_path = tmp_path_factory.mktemp("warm")
    write_input(tmp_path / "in", [100])
    run_batch_inference(hanging_config(tmp_path, hang_id=-1, kind=TransformStage))


def process_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.usefixtures("warm_ray")
def test_a_hung_predictor_fails_retryably_naming_the_stage_and_the_last_commit_and_a_retry_completes(tmp_path):
    write_input(tmp_path / "in", [1000])
    cfg = hanging_config(tmp_path, hang_id=550, progress_timeout=15)
    started = time.monotonic()
    with pytest.raises(NoProgressError) as failure:
        run_batch_inference(cfg)
    elapsed = time.monotonic() - started
    message = str(failure.value)
    assert not isinstance(failure.value, NotRetryableError)
    assert elapsed < 60, f"the watchdog took {elapsed:.0f}s"
    # 15 s, or a little more when the machine is busy: the watchdog checks once a second.
    assert re.search(r"no range committed and no batch received for \d+s \(progress_timeout=15s\)", message), message
    assert re.search(r"stage 'hangs'[^:]*: \d+ task\(s\) in flight that have not returned", message), message
    assert not re.search(r"'doubles': \d+ task", message), message  # the stage after it waits: not named

    ledger = OutputLedger.open(cfg.output_path)
    committed = set(ledger.committed())
    planned = ledger.load_plan().range_ids()
    hung = planned[5]  # ids 500-599
    assert hung not in committed and 0 < len(committed) < 10
    last = re.search(r"the last commit was range (\S+) at .* UTC, \d+s ago \((\d+) of 10 ranges committed\)", message)
    assert last, message
    assert last.group(1) in committed and int(last.group(2)) == len(committed)

    # The hung model's process is gone: Ray's actors of the run were killed, not left running.
    pid = int((tmp_path / "hang-marker.pid").read_text())
    assert process_gone(pid, within_s=20)

    # The committed ranges are readable, each row once; the verifier finds exactly the ranges not committed.
    missing = [r for r in planned if r not in committed]
    faults = verify_output(cfg.output_path)
    assert len(faults) == 1 and faults[0].startswith(f"{len(missing)} planned range(s) not committed: "), faults
    assert set(faults[0].split(": ", 1)[1].split(" and ")[0].split(", ")) <= set(missing)
    ids = read_output(tmp_path / "out")["id"].to_pylist()
    assert len(ids) == len(set(ids)) == 100 * len(committed)

    # A retry (the marker is gone: the model no longer hangs) completes the output exactly once.
    summary = run_batch_inference(cfg)
    assert summary.ranges_skipped == len(committed) and summary.ranges_done == len(missing)
    assert_output_sound(tmp_path / "out", range(1000))
    assert_exactly_once(read_output(tmp_path / "out"), range(1000))


@pytest.mark.usefixtures("warm_ray")
def test_a_hung_transform_stage_is_named_with_ray_data_s_step(tmp_path):
    write_input(tmp_path / "in", [300])
    cfg = hanging_config(tmp_path, hang_id=150, kind=TransformStage, progress_timeout=15)
    # Ray Data fuses the transform's step into the next stage's actors: both are named, with Ray's name.
    stalled = r"stage 'hangs' and stage 'doubles' \(Ray Data's MapBatches\(_score_or_hang\)->MapBatches\(WritingStageWorker\)\)"
    with pytest.raises(NoProgressError, match=stalled + r": \d+ task\(s\) in flight"):
        run_batch_inference(cfg)
    assert process_gone(int((tmp_path / "hang-marker.pid").read_text()), within_s=20)
    run_batch_inference(cfg)
    assert_output_sound(tmp_path / "out", range(300))


def test_progress_timeout_is_checked_and_is_not_part_of_the_job_signature(tmp_path):
    write_input(tmp_path / "in", [10])
    cfg = hanging_config(tmp_path, hang_id=0)
    assert cfg.progress_timeout == 3600
    for bad in (0, -1, "1h", True):
        cfg.progress_timeout = bad
        with pytest.raises(ConfigError, match="progress_timeout must be a number of seconds > 0 or None"):
            cfg.validate()
    signature = cfg.job_signature()
    cfg.progress_timeout = None
    cfg.validate()
    assert cfg.job_signature() == signature
    assert BatchInferenceConfig.from_spec(cfg.to_spec()).progress_timeout is None
    spec = cfg.to_spec()
    del spec["progress_timeout"]  # a spec written before the setting existed
    assert BatchInferenceConfig.from_spec(spec).progress_timeout == 3600


def two_ranges() -> Progress:
    return Progress(Plan([], [RowRange("r-0", 0, 0, 10), RowRange("r-1", 0, 10, 20)], pa.schema([])), {})


def stuck(seconds: float) -> None:
    """A driver busy in Python code that never finishes (a storage call retrying forever)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("where", ["main thread", "another thread"])
def test_a_driver_stuck_outside_ray_is_interrupted_in_its_own_thread(where):
    progress, errors = two_ranges(), []

    def consume():
        try:
            with Watchdog(0.5, progress, [Stage("m:model")]):
                progress.committed(0)
                stuck(30)
        except NoProgressError as e:
            errors.append(e)

    started = time.monotonic()
    if where == "main thread":
        consume()
    else:
        thread = threading.Thread(target=consume)
        thread.start()
        thread.join(40)
    assert time.monotonic() - started < 10
    assert len(errors) == 1
    message = str(errors[0])
    assert re.search(r"no range committed and no batch received for \ds \(progress_timeout=0.5s\)", message)
    assert "Ray Data's executor state is not available (stages: 'model')" in message
    assert re.search(r"the last commit was range r-0 at .* UTC, \d+s ago \(1 of 2 ranges committed\)", message)


def test_batches_and_commits_keep_the_watchdog_quiet_and_none_disables_it():
    progress = two_ranges()
    with Watchdog(0.6, progress, []) as watchdog:
        for _ in range(20):  # 2 s of batches
            time.sleep(0.1)
            watchdog.beat()
        progress.committed(0)
        stuck(0.4)
        progress.committed(1)
        stuck(0.4)
    with Watchdog(None, two_ranges(), []) as watchdog:
        stuck(1.5)
    assert watchdog._thread is None
    assert not [t for t in threading.enumerate() if t.name == "raybatch-watchdog"]
