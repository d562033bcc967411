"""Runs whose output is a Delta or Iceberg table: real runs on a local Ray, real tables (delta-rs;
pyiceberg with a SQL catalog on SQLite), read back by DuckDB from the files of the table's current
snapshot; crashes are real SIGKILLs of a run in a process of its own."""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import subprocess
import sys
import time

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline.errors import ConfigError, LeaseLostError, OutputBusyError, OutputSchemaError
from airflow_provider_raybatch.pipeline.output_ref import OutputRef
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.tables.table_commits import open_table_writer
from airflow_provider_raybatch.pipeline.tables.verify import verify_table
from airflow_provider_raybatch.pipeline.tables.writer_commits import DataFile
from tests.support.data import assert_exactly_once, features_table, write_input
from tests.support.leases import make_stale
from tests.support.pipeline_runs import RECORD_EACH_RANGE, kill_leftovers, run_in_subprocess
from tests.support.tables import FORMATS, IDENTIFIER, history, read_table, snapshot_files, table_config, table_spec

pytestmark = [pytest.mark.usefixtures("ray_local"), pytest.mark.parametrize("fmt", FORMATS)]

DS, OTHER_DS, THIRD_DS = "2026-11-24", "2026-11-23", "2026-11-22"


@pytest.fixture(autouse=True)
def _formats(fmt):
    pytest.importorskip("deltalake" if fmt == "delta" else "pyiceberg")
    pytest.importorskip("duckdb")


def intents(tmp_path, ds=DS) -> list[dict]:
    """The table commits decided for date ``ds`` (every generation), oldest first."""
    paths = sorted((tmp_path / "table" / f"ds={ds}").glob("*/g*/_raybatch/table/*.json"))
    return [json.loads(p.read_text()) for p in paths]


def test_a_run_adds_each_row_once_and_a_rerun_adds_nothing(tmp_path, fmt):
    write_input(tmp_path / "in", [250, 130])
    cfg = table_config(tmp_path, fmt, keep_columns=["group"])
    summary = run_batch_inference(cfg)
    rows = read_table(tmp_path, fmt)
    assert set(rows.column_names) == {"id", "group", "score", "ds"}
    assert_exactly_once(rows, range(380))
    assert set(rows["ds"].to_pylist()) == {DS}
    assert summary.rows_out == 380 and summary.table_version is not None
    assert len(intents(tmp_path)) == 1  # a short run: one commit, at its end
    assert verify_table(OutputRef.of(cfg)) == []

    again = run_batch_inference(cfg)
    assert again.ranges_skipped == 5 and again.rows_processed == 0
    assert again.table_version == summary.table_version  # nothing committed
    assert_exactly_once(read_table(tmp_path, fmt), range(380))


def test_commits_while_running_add_whole_ranges(tmp_path, fmt):
    write_input(tmp_path / "in", [600])
    cfg = table_config(
        tmp_path,
        fmt,
        keep_columns=["group"],
        predictor="tests.support.predictors:SlowScore",
        predictor_kwargs={"delay_s": 0.4},
        batch_size=100,
        table_kwargs={"commit_interval": 0.5},
    )
    run_batch_inference(cfg)
    made = intents(tmp_path)
    assert len(made) > 1
    assert [i["seq"] for i in made] == list(range(len(made)))
    ranges = [r for i in made for r in i["ranges"]]
    assert len(ranges) == len(set(ranges)) == 6
    assert_exactly_once(read_table(tmp_path, fmt), range(600))


def test_dates_are_partitions_and_an_overwrite_replaces_only_its_date(tmp_path, fmt):
    write_input(tmp_path / "in", [300])
    for ds in (DS, OTHER_DS):
        run_batch_inference(table_config(tmp_path, fmt, ds, keep_columns=["group"], run_key=f"run-{ds}"))
    rerun = table_config(
        tmp_path,
        fmt,
        DS,
        keep_columns=["group"],
        mode="overwrite",
        run_key="rerun",
    )
    run_batch_inference(rerun)
    assert_exactly_once(read_table(tmp_path, fmt, DS), range(300))
    assert_exactly_once(read_table(tmp_path, fmt, OTHER_DS), range(300))
    # The date's rows are the new generation's files now, the other date's are untouched.
    files = snapshot_files(tmp_path, fmt)
    assert {f.split("/g")[-1].split("/")[0] for f in files if f"ds={DS}" in f} == {"1"}
    assert {f.split("/g")[-1].split("/")[0] for f in files if f"ds={OTHER_DS}" in f} == {"0"}
    assert [i["replace"] for i in intents(tmp_path)] == [False, True]


def run_killed_at(tmp_path, cfg, point: str) -> None:
    """Run ``cfg`` in a process of its own, SIGKILLed the first time it reaches crash point ``point``."""
    crashed = run_in_subprocess(
        tmp_path,
        "tests.support.predictors:score",
        {},
        # On the host's shared Ray, as a task on a worker: the crash points are on the driver.
        env={"RAYBATCH_TEST_CRASH": f"{point}:1", "RAYBATCH_LOCAL_RAY": "shared", **RECORD_EACH_RANGE},
        output_path=cfg.output_path,
        keep_columns=cfg.keep_columns,
        mode=cfg.mode,
        run_key=cfg.run_key,
        table=table_spec(cfg),
    )
    kill_leftovers(crashed.ray_tmp)
    assert crashed.returncode == -signal.SIGKILL, crashed.output


@pytest.mark.parametrize("point", ["table_intent", "table_commit"])
def test_a_try_killed_around_a_table_commit_is_completed_once_by_the_next(tmp_path, fmt, point):
    # table_intent: the commit is decided, not applied; table_commit: applied, its try killed before going on.
    write_input(tmp_path / "in", [400])
    cfg = table_config(tmp_path, fmt, keep_columns=["group"], run_key="run-1")
    run_killed_at(tmp_path, cfg, point)
    assert len(intents(tmp_path)) == 1
    landed = snapshot_files(tmp_path, fmt) if point == "table_commit" else []
    assert len(landed) == (4 if point == "table_commit" else 0)
    summary = run_batch_inference(cfg)
    assert summary.ranges_skipped == 4 and summary.rows_processed == 0
    assert len(intents(tmp_path)) == 1  # the same commit, completed or found, never made again
    assert_exactly_once(read_table(tmp_path, fmt), range(400))


@pytest.mark.parametrize("point", ["table_intent", "table_commit"])
def test_an_overwrite_killed_around_its_commit_replaces_the_date_once(tmp_path, fmt, point):
    # table_intent: decided, not applied (readers still see the old rows); table_commit: applied, the try killed after.
    write_input(tmp_path / "in", [300])
    run_batch_inference(table_config(tmp_path, fmt, keep_columns=["group"], run_key="run-1"))
    before = sorted(snapshot_files(tmp_path, fmt))
    rerun = table_config(tmp_path, fmt, keep_columns=["group"], mode="overwrite", run_key="run-2")
    run_killed_at(tmp_path, rerun, point)
    if point == "table_intent":
        assert sorted(snapshot_files(tmp_path, fmt)) == before
        assert_exactly_once(read_table(tmp_path, fmt), range(300))
    run_batch_inference(rerun)  # the retry of the same run resumes its generation and commits it, or finds it
    after = snapshot_files(tmp_path, fmt)
    assert after and all("/g1/" in f for f in after)
    assert_exactly_once(read_table(tmp_path, fmt), range(300))
    # The table's log: the first run's commit, then ONE replacement; each version or snapshot holds
    # the date's rows once (time travel, incremental and change readers never see it empty or doubled).
    logged = history(tmp_path, fmt, DS)
    assert len(logged) == 2
    for rows in logged:
        assert_exactly_once(rows, range(300))
    assert verify_table(OutputRef.of(rerun)) == []


def test_the_verifier_finds_an_iceberg_replacement_made_in_two_snapshots(tmp_path, fmt, monkeypatch):
    if fmt == "delta":
        pytest.skip("a Delta replacement is one version: its remove and add actions are one commit")
    from pyiceberg.expressions import EqualTo

    from airflow_provider_raybatch.pipeline.tables.iceberg import IcebergTableWriter

    def delete_then_add(self, table, tx, partition, paths, properties):
        # As pyiceberg's delete then add_files make it (and this provider did): a DELETE snapshot, then an APPEND.
        tx.delete(EqualTo("ds", partition["ds"]), snapshot_properties=properties)
        tx.add_files(paths, snapshot_properties=properties, check_duplicate_files=False)

    write_input(tmp_path / "in", [100])
    run_batch_inference(table_config(tmp_path, fmt, keep_columns=["group"], run_key="run-1"))
    rerun = table_config(tmp_path, fmt, keep_columns=["group"], mode="overwrite", run_key="run-2")
    monkeypatch.setattr(IcebergTableWriter, "_replace", delete_then_add)
    run_batch_inference(rerun)
    assert [len(rows) for rows in history(tmp_path, fmt, DS)] == [100, 0, 100]
    faults = verify_table(OutputRef.of(rerun))
    assert len(faults) == 1 and "replaced the partition in 2 snapshots (delete, append)" in faults[0], faults


def test_an_overwrite_of_a_date_while_other_dates_backfill_lands_every_date_once(tmp_path, fmt):
    write_input(tmp_path / "in", [400])
    run_batch_inference(table_config(tmp_path, fmt, DS, keep_columns=["group"], run_key="run-1"))
    # At once: DS replaced by a new run, two other dates appended (each its own process and writer).
    runs = {
        ds: run_in_subprocess(
            tmp_path,
            "tests.support.predictors:score",
            {},
            wait=False,
            env={"RAYBATCH_LOCAL_RAY": "shared"},
            output_path=str(tmp_path / "table"),
            keep_columns=["group"],
            mode=mode,
            run_key=f"backfill-{ds}",
            table=table_spec(table_config(tmp_path, fmt, ds)),
        )
        for ds, mode in ((DS, "overwrite"), (OTHER_DS, "resume"), (THIRD_DS, "resume"))
    }
    for proc in runs.values():
        output = proc.communicate(timeout=300)[0]
        kill_leftovers(proc.ray_tmp)
        assert proc.returncode == 0, output
    for ds in runs:
        assert_exactly_once(read_table(tmp_path, fmt, ds), range(400))
    assert all("/g1/" in f for f in snapshot_files(tmp_path, fmt) if f"ds={DS}/" in f)


def test_a_frozen_writer_of_a_date_is_taken_over_and_commits_nothing_after_it_thaws(tmp_path, fmt):
    if fmt == "iceberg":
        # The fence is TableCommits checking the lease before each decision, and the format's writer
        # before each attempt (each format's: test_a_writer_whose_lease_was_taken_over_commits_nothing
        # in test_table_writers.py): the delta run covers the takeover; CI's minutes go elsewhere.
        pytest.skip("the takeover is format-independent: covered by the delta run")
    write_input(tmp_path / "in", [800])
    slow = {"predictor": "tests.support.predictors:SlowScore", "predictor_kwargs": {"delay_s": 0.4}}
    cfg = table_config(tmp_path, fmt, keep_columns=["group"], run_key="daily/run-1", batch_size=100, **slow)
    zombie = run_in_subprocess(
        tmp_path,
        slow["predictor"],
        slow["predictor_kwargs"],
        wait=False,
        env={"RAYBATCH_RECORD_INTERVAL_S": "0"},
        output_path=cfg.output_path,
        keep_columns=["group"],
        run_key="daily/run-1",
        try_number=1,
        table={**table_spec(cfg), "commit_interval": 0.5},
    )
    try:
        deadline = time.monotonic() + 120
        while not intents(tmp_path):  # it has made a table commit
            assert zombie.poll() is None, zombie.stdout.read()
            assert time.monotonic() < deadline, "the first writer made no table commit in 120 s"
            time.sleep(0.2)
        zombie.send_signal(signal.SIGSTOP)  # its worker lost contact: it neither runs nor heartbeats
        with pytest.raises(OutputBusyError, match="writer 'daily.score'"):
            run_batch_inference(dataclasses.replace(cfg, try_number=2))
        # As if it had been frozen past its lease_timeout: the writer's lease folder holds its lease.
        (lease_folder,) = tmp_path.glob("table/**/_raybatch/lease")
        make_stale(lease_folder)
        run_batch_inference(dataclasses.replace(cfg, try_number=2))
        made = intents(tmp_path)
    finally:
        zombie.send_signal(signal.SIGCONT)
        output = zombie.communicate(timeout=300)[0]
        kill_leftovers(zombie.ray_tmp)
    assert zombie.returncode != 0
    assert LeaseLostError.__name__ in output, output
    assert intents(tmp_path) == made  # the thawed writer decided no table commit more
    assert_exactly_once(read_table(tmp_path, fmt), range(800))


def test_an_input_column_named_like_the_partition_column_is_refused_before_ray(tmp_path, fmt):
    write_input(tmp_path / "in", [100])
    cfg = table_config(tmp_path, fmt)
    cfg.table.partition = {"group": "g1"}
    with pytest.raises(ConfigError, match=r"input column\(s\) \['group'\] would be written to table .* leave it out"):
        run_batch_inference(cfg)
    assert not (tmp_path / "table").exists()


def test_a_table_on_s3_through_a_real_s3_protocol(tmp_path, fmt, s3_server):
    write_input(tmp_path / "in", [250])
    root = f"s3://raybatch-test/tables/{fmt}-{tmp_path.name}"
    cfg = table_config(tmp_path, fmt, keep_columns=["group"], output_path=root, storage_options=s3_server)
    if fmt == "iceberg":
        cfg.table.catalog["warehouse"] = f"s3://raybatch-test/warehouse-{tmp_path.name}"
    summary = run_batch_inference(cfg)
    assert run_batch_inference(cfg).ranges_skipped == summary.ranges_total == 3
    if fmt == "delta":
        from deltalake import DeltaTable

        from airflow_provider_raybatch.pipeline.tables.delta_storage import delta_storage_options

        rows = DeltaTable(root, storage_options=delta_storage_options(root, s3_server)).to_pyarrow_table()
    else:
        from airflow_provider_raybatch.pipeline.tables.iceberg import load_catalog
        from airflow_provider_raybatch.pipeline.tables.iceberg_storage import file_io_properties

        catalog = load_catalog({**file_io_properties(root, s3_server), **cfg.table.catalog})
        rows = catalog.load_table(IDENTIFIER).scan().to_arrow()
    assert_exactly_once(rows, range(250))
    assert rows["ds"].unique().to_pylist() == [DS]


def test_the_verifier_finds_rows_another_writer_added_to_the_partition(tmp_path, fmt):
    write_input(tmp_path / "in", [200])
    cfg = table_config(tmp_path, fmt, keep_columns=["group"])
    run_batch_inference(cfg)
    command = [sys.executable, "-m", "airflow_provider_raybatch", "verify", cfg.output_path, "--format", fmt]
    command += ["--table-partition", f"ds={DS}"]
    if fmt == "iceberg":
        command += ["--table", IDENTIFIER, *(f"--catalog={k}={v}" for k, v in cfg.table.catalog.items())]
    ok = subprocess.run(command, capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("OK "), ok.stdout + ok.stderr
    # Another writer adds a copy of one of the partition's files in a commit of its own.
    staged = sorted((tmp_path / "table").glob(f"ds={DS}/*/g0/part-*.parquet"))[0]
    copy = tmp_path / "table" / f"ds={DS}" / "other.parquet"
    shutil.copy(staged, copy)
    other = open_table_writer(OutputRef.of(cfg), "someone-else", pq.read_schema(copy))
    other.commit(0, [DataFile(f"ds={DS}/other.parquet", copy.stat().st_size, 100)], {"ds": DS}, ["x"])
    faults = verify_table(OutputRef.of(cfg))
    assert any("in the table's current snapshot that no current generation committed" in f for f in faults), faults
    assert any("id value(s) more than once in the partition" in f for f in faults), faults
    bad = subprocess.run(command, capture_output=True, text=True)
    assert bad.returncode == 1 and "FAULT 1 file(s) in the table's current snapshot" in bad.stdout, bad.stdout


def test_an_overwrite_whose_input_changed_between_tries_starts_a_new_generation(tmp_path, fmt):
    write_input(tmp_path / "in", [300])
    cfg = table_config(tmp_path, fmt, keep_columns=["group"], mode="overwrite", run_key="run-1")
    run_batch_inference(cfg)
    write_input(tmp_path / "in", [200])  # the date's input rewritten upstream, then the same run retried
    summary = run_batch_inference(cfg)
    assert summary.rows_out == 200
    assert_exactly_once(read_table(tmp_path, fmt), range(200))
    assert all("/g1/" in f for f in snapshot_files(tmp_path, fmt))


def test_a_run_with_a_new_column_is_refused_unless_it_may_add_it_and_then_older_rows_read_null(tmp_path, fmt):
    write_input(tmp_path / "in", [300])
    run_batch_inference(table_config(tmp_path, fmt, DS, keep_columns=["group"], run_key="run-1"))
    wider = table_config(tmp_path, fmt, OTHER_DS, keep_columns=["group", "features"], run_key="run-2")
    with pytest.raises(OutputSchemaError, match=r"features \(table: missing, output: .*table_add_columns=True"):
        run_batch_inference(wider)
    assert read_table(tmp_path, fmt, OTHER_DS).num_rows == 0  # nothing of the date joined the table
    assert "features" not in read_table(tmp_path, fmt).column_names

    # The same run again with the option (the task fixed and cleared): its staged ranges join the table.
    wider.table.add_columns = True
    summary = run_batch_inference(wider)
    assert summary.ranges_skipped == 3 and summary.rows_processed == 0
    expected = dict(zip(range(300), features_table(300)["features"].to_pylist(), strict=True))
    readers = {"duckdb": read_table(tmp_path, fmt)}
    if fmt == "iceberg":
        from airflow_provider_raybatch.pipeline.tables.iceberg import load_catalog

        # pyiceberg reads the staged files (no field ids) by the table's name mapping.
        readers["pyiceberg"] = load_catalog(wider.table.catalog).load_table(IDENTIFIER).scan().to_arrow()
    for name, rows in readers.items():
        for ds, features in ((DS, None), (OTHER_DS, expected)):
            date = rows.filter(pc.equal(rows["ds"], ds))
            assert_exactly_once(date, range(300))
            got = dict(zip(date["id"].to_pylist(), date["features"].to_pylist(), strict=True))
            assert got == (features or dict.fromkeys(range(300))), f"{name}: features of {ds}"
    assert verify_table(OutputRef.of(wider)) == []
    # A run of another date without the column is refused now: the table has it.
    with pytest.raises(OutputSchemaError, match=r"features \(table: .*, output: missing\)"):
        run_batch_inference(table_config(tmp_path, fmt, THIRD_DS, keep_columns=["group"], run_key="run-3"))


def test_mapped_shards_of_a_date_commit_into_one_table(tmp_path, fmt):
    """A mapped run writes one table partition from several shards' tasks: the planning task chooses the
    generation; its shards' tasks, at once in processes of their own, share its commits (each
    range in one commit, every row once); an overwrite replaces the date in one commit, made by
    the task that finishes last; a shard planned for an older generation is refused."""
    from airflow_provider_raybatch.pipeline.shards import plan_shards

    write_input(tmp_path / "in", [300, 300])
    cfg = table_config(tmp_path, fmt, keep_columns=["group"], run_key="daily/run-1/plan/-1")
    parts = plan_shards(cfg, 3)
    assert [p.generation for p in parts] == [0, 0, 0] and {p.writer for p in parts} == {cfg.table.writer}

    def spec(part, commit_interval):
        table = {**table_spec(cfg), "generation": part.generation, "commit_interval": commit_interval}
        return {"table": table, "range_ids": part.range_ids, "keep_columns": ["group"], "output_path": cfg.output_path}

    runs = [
        run_in_subprocess(
            tmp_path,
            "tests.support.predictors:score",
            {},
            wait=False,
            env={"RAYBATCH_LOCAL_RAY": "shared", **RECORD_EACH_RANGE},
            run_key=f"daily/run-1/score/{part.index}",
            **spec(part, 0.2),  # commits as ranges are recorded: the tasks race for the commits' numbers
        )
        for part in parts
    ]
    for proc in runs:
        output = proc.communicate(timeout=300)[0]
        kill_leftovers(proc.ray_tmp)
        assert proc.returncode == 0, output
    made = intents(tmp_path)
    committed = [r for intent in made for r in intent["ranges"]]
    assert sorted(committed) == sorted(r for p in parts for r in p.range_ids)  # each range in one commit
    assert [intent["seq"] for intent in made] == list(range(len(made)))
    assert verify_table(OutputRef.of(cfg)) == []
    assert_exactly_once(read_table(tmp_path, fmt), range(600))

    # Another run overwrites the date on new input: until its last shard's task ends, readers see the old rows.
    write_input(tmp_path / "in", [200, 200])
    rerun = dataclasses.replace(cfg, mode="overwrite", run_key="daily/run-2/plan/-1")
    new_parts = plan_shards(rerun, 3)
    assert {p.generation for p in new_parts} == {1}
    for n, part in enumerate(new_parts):
        table = dataclasses.replace(rerun.table, generation=part.generation)
        run_key = f"daily/run-2/score/{part.index}"
        summary = run_batch_inference(
            dataclasses.replace(rerun, table=table, range_ids=part.range_ids, run_key=run_key)
        )
        last = n == len(new_parts) - 1
        assert (summary.table_version is not None) == last
        assert_exactly_once(read_table(tmp_path, fmt), range(400) if last else range(600))
    assert all("/g1/" in f for f in snapshot_files(tmp_path, fmt))
    assert verify_table(OutputRef.of(cfg)) == []
    with pytest.raises(ConfigError, match="was planned for generation 0, and the writer's current one is generation 1"):
        table = dataclasses.replace(cfg.table, generation=0)
        run_batch_inference(dataclasses.replace(cfg, table=table, range_ids=parts[0].range_ids))
