"""Two writers on one output, in real processes: the lease keeps one at a time and fences the loser."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import time

import pytest

from airflow_provider_raybatch.pipeline.errors import LeaseLostError, OutputBusyError
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.shards import plan_shards
from tests.support.data import assert_output_sound, read_output, write_input
from tests.support.leases import make_stale
from tests.support.pipeline_runs import commit_count, config, kill_leftovers, run_in_subprocess
from tests.support.takeover import files_of, takeover_config

pytestmark = pytest.mark.usefixtures("ray_local")

#: The first writer's settings (a second writer with the same ones would resume its output).
SLOW = {"predictor": "tests.support.predictors:SlowScore", "predictor_kwargs": {"delay_s": 0.6}}


#: The error of a fenced writer: who took its lease over, and when.
TAKEOVER = (
    r"the lease on output \S+ was taken over by dag dag_a, run run_1, task score, try 2, pid \d+ on host \S+ "
    r"\(generation 2, taken at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC; this writer held generation 1, last renewed at "
    r"[^)]*\): this writer commits and removes nothing more"
)


def start_writer(tmp_path, **config_kwargs):
    """A first writer in its own process, slow enough to be caught mid-run; returns once it has committed."""
    proc = run_in_subprocess(
        tmp_path,
        SLOW["predictor"],
        SLOW["predictor_kwargs"],
        wait=False,
        run_key="dag_a/run_1/score/-1",
        try_number=1,
        **config_kwargs,
    )
    deadline = time.monotonic() + 120
    while commit_count(tmp_path / "out") == 0:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "the first writer committed nothing in 120 s"
        time.sleep(0.2)
    return proc


def finish(proc) -> str:
    output = proc.communicate(timeout=300)[0]
    kill_leftovers(proc.ray_tmp)
    return output


def test_a_second_writer_fails_naming_the_first_and_the_first_completes(tmp_path):
    write_input(tmp_path / "in", [1200])
    first = start_writer(tmp_path)
    try:
        with pytest.raises(
            OutputBusyError,
            match=rf"output {tmp_path}/out is being written by dag dag_a, run run_1, task score, try 1, "
            rf"pid {first.pid} on host .*; last heartbeat \d+ s ago",
        ):
            run_batch_inference(config(tmp_path, run_key="dag_a/run_2/score/-1", **SLOW))
    finally:
        output = finish(first)
    assert first.returncode == 0, output
    assert_output_sound(tmp_path / "out", range(1200))  # complete when the first reports success
    assert run_batch_inference(config(tmp_path, **SLOW)).ranges_skipped == 12  # and free again


def test_an_overwrite_waits_for_the_live_writer_and_then_runs(tmp_path):
    write_input(tmp_path / "in", [1200])
    first = start_writer(tmp_path)
    other = {"predictor": "tests.support.predictors:SlowScore", "predictor_kwargs": {"delay_s": 0.0}}
    try:
        with pytest.raises(OutputBusyError, match="is being written by dag dag_a, run run_1"):
            run_batch_inference(config(tmp_path, mode="overwrite", run_key="dag_a/run_2/score/-1", **other))
        assert commit_count(tmp_path / "out") >= 1  # nothing of the first writer's was removed
    finally:
        output = finish(first)
    assert first.returncode == 0, output
    assert_output_sound(tmp_path / "out", range(1200))
    summary = run_batch_inference(config(tmp_path, mode="overwrite", run_key="dag_a/run_2/score/-1", **other))
    assert summary.ranges_done == 12
    assert_output_sound(tmp_path / "out", range(1200))


def test_a_frozen_writer_is_taken_over_and_fails_naming_the_takeover_deleting_nothing(tmp_path):
    """Issue 41: a writer whose lease a second writer took (after its heartbeat went stale) finds on
    waking that its temporary files are gone (the new holder's start-up removed them). It fails with
    the takeover as its error (who took the lease, when), not the vanished file, and removes nothing."""
    write_input(tmp_path / "in", [1200])
    output = tmp_path / "out"
    zombie = start_writer(tmp_path)
    zombie.send_signal(signal.SIGSTOP)  # its worker lost contact: it neither runs nor heartbeats
    retry = {"run_key": "dag_a/run_1/score/-1", "try_number": 2, **SLOW}
    try:
        committed_before = commit_count(output)
        # Its heartbeat is recent by its own lease_timeout (120 s): a taker with a shorter one waits too.
        with pytest.raises(OutputBusyError, match="taken over after 120 s without one"):
            run_batch_inference(config(tmp_path, lease_timeout=30, **retry))
        make_stale(output / "_raybatch" / "lease")  # as if it had been frozen for longer than that
        summary = run_batch_inference(config(tmp_path, **retry))
        assert summary.ranges_skipped == committed_before and summary.ranges_done == 12 - committed_before
        before = files_of(output)
    finally:
        zombie.send_signal(signal.SIGCONT)
        output_log = finish(zombie)
    assert zombie.returncode != 0
    assert re.search(rf"LeaseLostError: {TAKEOVER}", output_log), output_log
    # The thawed writer removed, published and committed nothing; its workers' last files, if any
    # landed, are strays in the temporary folder, which no reader sees and the next run removes.
    after = files_of(output)
    assert {name: after.get(name) for name in before} == before
    assert all(name.startswith("_raybatch/tmp/") for name in after.keys() - before.keys())
    assert_output_sound(output, range(1200))
    assert read_output(output).num_rows == 1200
    assert run_batch_inference(config(tmp_path, run_key="dag_a/run_1/score/-1", try_number=3, **SLOW)).ranges_done == 0
    assert not (output / "_raybatch" / "tmp").exists()


def test_a_writer_whose_files_vanish_in_a_takeover_fails_naming_it_and_deletes_nothing(tmp_path):
    """Issue 41's sequence: a second writer takes the lease (the first one's heartbeat is stale) and
    its start-up removes the first writer's temporary files while the first one still runs. The
    first meets it as a write into a folder that is gone: it fails with the takeover as its error
    (who, when), that write's error chained to it, and removes nothing."""
    write_input(tmp_path / "in", [400])
    output = tmp_path / "out"
    with pytest.raises(LeaseLostError, match=TAKEOVER) as caught:
        run_batch_inference(takeover_config(tmp_path, try_number=1))
    # What it met first is chained to it.
    assert "cannot write rows" in str(caught.value.__cause__) and "FileNotFoundError" in str(caught.value.__cause__)
    after_takeover = json.loads((tmp_path / "after_takeover.json").read_text())
    after = files_of(output)
    assert {name: after.get(name) for name in after_takeover} == after_takeover
    assert all(name.startswith("_raybatch/tmp/") for name in after.keys() - after_takeover.keys())
    summary = run_batch_inference(takeover_config(tmp_path, try_number=3))
    assert summary.ranges_done + summary.ranges_skipped == 4
    assert_output_sound(output, range(400))


def test_shards_run_side_by_side_and_exclude_a_whole_output_writer(tmp_path):
    write_input(tmp_path / "in", [1200])
    first, second = plan_shards(config(tmp_path, **SLOW), 2)
    writer = start_writer(tmp_path, range_ids=first.range_ids)
    try:
        with pytest.raises(
            OutputBusyError,
            match=r"shard [0-9a-f]{16} of output .* is being written by dag dag_a, run run_1, task score, try 1",
        ):
            run_batch_inference(config(tmp_path, run_key="dag_a/run_1/score/0", range_ids=first.range_ids, **SLOW))
        with pytest.raises(OutputBusyError, match=r"shard [0-9a-f]{16} of output .* is being written by dag dag_a"):
            run_batch_inference(config(tmp_path, mode="overwrite", run_key="dag_a/run_2/plan/-1", **SLOW))
        # The other shard runs meanwhile.
        other = run_batch_inference(config(tmp_path, run_key="dag_a/run_1/score/1", range_ids=second.range_ids, **SLOW))
        assert other.ranges_done == len(second.range_ids)
    finally:
        output = finish(writer)
    assert writer.returncode == 0, output
    assert_output_sound(tmp_path / "out", range(1200))


def test_a_range_committed_under_a_replaced_plan_is_found_by_the_verifier_and_redone(tmp_path):
    """Case 4's other half: whatever lets a writer of an old plan through (a race the leases now
    close, a writer frozen between its fence and its write), the range it commits after an
    overwrite replaced the plan is told apart: its record names the plan it was written under.
    The verifier reports the mixed output, and the next run of the new plan redoes the range."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger, read_plan
    from airflow_provider_raybatch.pipeline.commit.verify import verify_output
    from airflow_provider_raybatch.pipeline.store.files import resolve

    write_input(tmp_path / "in", [200])
    output = tmp_path / "out"
    old = config(tmp_path, "tests.support.predictors:add_bias", predictor_kwargs={"bias": 1.0}, run_key="dag/1/t/-1")
    run_batch_inference(old)
    fs, root = resolve(str(output))
    # A writer that checked the old plan.
    stale = OutputLedger(fs, root, str(output), plan=read_plan(fs, root, str(output)))
    new = config(tmp_path, "tests.support.predictors:add_bias", predictor_kwargs={"bias": 5.0}, run_key="dag/2/t/-1")
    run_batch_inference(dataclasses.replace(new, mode="overwrite"))
    assert verify_output(str(output)) == []

    # The stale writer commits its result of one range, over the new plan's file of that range.
    range_id, record = sorted(OutputLedger.open(str(output)).committed().items())[0]
    table = pq.read_table(output / record.files[0])
    tmp = stale.tmp_file(range_id)
    with stale.fs.open(tmp, "wb") as f:
        old_result = pa.array([-1.0] * len(table), table.schema.field("biased").type)
        pq.write_table(table.set_column(table.schema.get_field_index("biased"), "biased", old_result), f)
    stale.record([stale.publish(range_id, [tmp], table.num_rows)])

    faults = verify_output(str(output))
    assert faults == [f"1 range(s) committed under another plan than the output's (a mixed output): {range_id}"]
    summary = run_batch_inference(new)  # the same run again: it resumes, and redoes that range
    assert (summary.ranges_done, summary.ranges_skipped, summary.rows_out) == (1, 1, 200)
    assert_output_sound(output, range(200))
    assert -1.0 not in read_output(output)["biased"].to_pylist()
