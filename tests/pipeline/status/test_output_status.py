"""An output's status read from its bookkeeping: after a run killed part-way (partial, its holder
gone), while a writer holds the lease (running), after the resumed run (done, as its summary
says), for a mapped shard, and for a Delta table's date."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import time

import pytest

from airflow_provider_raybatch.pipeline.commit.lease import Lease, LeaseHolder
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.shards import plan_shards
from airflow_provider_raybatch.pipeline.status import (
    OutputNotFoundError,
    TimelinePoint,
    read_status,
    read_table_status,
)
from airflow_provider_raybatch.pipeline.status.timeline import RATE_WINDOW_S
from airflow_provider_raybatch.pipeline.status.timeline import current_rate as _rate
from airflow_provider_raybatch.pipeline.status.timeline import thin as _thin
from tests.support.data import write_input
from tests.support.pipeline_runs import RECORD_EACH_RANGE, config, kill_leftovers, run_in_subprocess

pytestmark = pytest.mark.usefixtures("ray_local")


def run_killed_after(tmp_path, commits: int, **config_kwargs):
    """Run in a process of its own on the shared Ray, SIGKILLed right after its ``commits``-th commit record."""
    crashed = run_in_subprocess(
        tmp_path,
        "tests.support.predictors:score",
        {},
        env={"RAYBATCH_TEST_CRASH": f"committed:{commits}", "RAYBATCH_LOCAL_RAY": "shared", **RECORD_EACH_RANGE},
        **config_kwargs,
    )
    kill_leftovers(crashed.ray_tmp)
    assert crashed.returncode == -signal.SIGKILL, crashed.output
    return crashed


def test_a_killed_run_reads_partial_with_its_holder_gone_then_done_as_the_resume_says(tmp_path):
    write_input(tmp_path / "in", [250, 150])  # ranges of 100, 100, 50, 100, 50 rows
    out = str(tmp_path / "out")
    crashed = run_killed_after(tmp_path, 2)

    status = read_status(out)
    assert status.state == "partial"
    assert (status.ranges_planned, status.rows_planned) == (5, 400)
    assert status.ranges_committed == 2 and 0 < status.rows_done < 400 and status.rows_out == status.rows_done
    assert status.eta_s is None  # nobody is writing
    lease = status.lease
    assert lease is not None and not lease.released and not lease.live
    assert lease.pid == crashed.pid and lease.host == socket.gethostname() and lease.holder_gone is True
    assert f"pid {crashed.pid}" in lease.holder
    assert [p.rows for p in status.timeline][-1] == status.rows_done
    assert status.timeline == sorted(status.timeline, key=lambda p: p.time)
    assert status.objects_read["segments"] >= 1  # a killed run's records are in its segments

    summary = run_batch_inference(config(tmp_path))
    done = read_status(out)
    assert done.state == "done" and done.fraction_done == 1.0
    assert done.ranges_committed == summary.ranges_total == summary.ranges_done + summary.ranges_skipped
    assert (done.rows_planned, done.rows_out, done.rows_rejected) == (
        summary.rows_in,
        summary.rows_out,
        summary.rows_rejected,
    )
    assert done.lease.released and done.lease.pid == os.getpid() and done.lease.generation == lease.generation + 1
    assert done.timeline[-1].rows == 400 and done.timeline[-1].ranges == 5
    assert done.eta_s is None and done.objects_read == {"manifest": 1, "segments": 0, "records": 0}


def test_a_held_lease_reads_running_with_its_task_instance_until_its_heartbeat_is_stale(tmp_path):
    write_input(tmp_path / "in", [300])
    run_killed_after(tmp_path, 1)
    ledger = OutputLedger.open(str(tmp_path / "out"))
    holder = LeaseHolder(run_key="daily/scheduled__2026-11-24/score/3", try_number=2)
    lease = Lease(ledger.fs, ledger.lease_folder(), "out", holder, timeout_s=60)
    lease.acquire()
    try:
        status = read_status(str(tmp_path / "out"))
        assert status.state == "running"
        held = status.lease
        assert (held.dag_id, held.run_id, held.task_id, held.map_index, held.try_number) == (
            "daily",
            "scheduled__2026-11-24",
            "score",
            3,
            2,
        )
        assert held.live and not held.released and held.holder_gone is False and held.heartbeat_age_s < 30
        assert status.commit_rows_per_s == 0.0  # nothing committed since it took the lease
        # Read as if its heartbeat had stopped 90 s ago: past the holder's own lease_timeout (60 s,
        # recorded with its lease), though within the reader's default for older records (120 s).
        later = read_status(str(tmp_path / "out"), now=time.time() + 90)
        assert later.state == "partial" and not later.lease.live and later.lease.heartbeat_age_s >= 90
    finally:
        lease.release()


def test_a_mapped_shard_is_read_with_its_lease_and_its_commits(tmp_path):
    write_input(tmp_path / "in", [400])
    cfg = config(tmp_path)
    shards = plan_shards(cfg, 2)
    run_batch_inference(dataclasses.replace(cfg, range_ids=shards[0].range_ids))

    status = read_status(cfg.output_path)
    assert status.state == "partial" and status.ranges_committed == len(shards[0].range_ids)
    assert status.lease is not None and status.lease.released  # the planning task's
    # Both planned shards are listed, in map order, the second before its task ever started.
    first, second = status.shards
    assert (first.index, first.ranges_planned, first.rows_planned) == (
        0,
        len(shards[0].range_ids),
        shards[0].rows,
    )
    assert first.ranges_committed == len(shards[0].range_ids) and first.rows_committed == shards[0].rows
    assert first.lease is not None and first.lease.released and first.lease.scope == first.key
    assert (second.index, second.ranges_planned, second.rows_planned) == (
        1,
        len(shards[1].range_ids),
        shards[1].rows,
    )
    assert (second.ranges_committed, second.lease) == (0, None)
    # The document `raybatch status --json` prints names them shards.
    assert [s["index"] for s in status.to_dict()["shards"]] == [0, 1]


def test_a_delta_tables_date_is_read_per_writer_from_its_current_generation(tmp_path):
    pytest.importorskip("deltalake")
    from tests.support.tables import table_config

    write_input(tmp_path / "in", [250])
    cfg = table_config(tmp_path, "delta")
    summary = run_batch_inference(cfg)
    [writer] = read_table_status(cfg.output_path, {"ds": "2026-11-24"})
    assert writer.state == "done" and writer.generation == 0 and writer.writer.startswith("ds=2026-11-24/daily.score-")
    assert writer.path == f"{cfg.output_path}/{writer.writer}/g0"
    assert (writer.ranges_planned, writer.rows_out) == (summary.ranges_total, summary.rows_out)
    assert writer.table_commits == 1 and writer.ranges_in_table_commits == writer.ranges_planned
    assert writer.lease is not None and writer.lease.released  # the writer's lease, beside its generations
    with pytest.raises(OutputNotFoundError, match="ds=2026-11-23"):
        read_table_status(cfg.output_path, {"ds": "2026-11-23"})


def test_a_path_without_an_output_is_named(tmp_path):
    with pytest.raises(OutputNotFoundError, match=str(tmp_path / "nothing")):
        read_status(str(tmp_path / "nothing"))


def test_the_rate_is_measured_over_the_window_and_the_current_writers_time():
    points = [TimelinePoint(1000.0 + 10 * i, i + 1, 100 * (i + 1)) for i in range(30)]  # 10 rows/s
    last = points[-1].time
    assert _rate(points, None, None) == pytest.approx(10.0)  # finished: the window up to the last commit
    assert _rate(points, last + RATE_WINDOW_S, None) == 0.0  # running, and silent for the whole window
    # A writer that took over 35 s before the last commit: only its own commits count, from then.
    assert _rate(points, last, last - 35) == pytest.approx(400 / 35)
    assert _rate(points[:1], None, None) is None
    assert _rate([], 5.0, None) is None
    thinned = _thin(points, 7)
    assert len(thinned) == 7 and thinned[0] == points[0] and thinned[-1] == points[-1]
