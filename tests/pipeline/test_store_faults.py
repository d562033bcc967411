"""Exactly once when the object store fails the way stores do: ambiguous writes, lost replies, throttling.

A real moto S3 server behind :class:`tests.support.fault_proxy.FaultProxy` on loopback, reached through
s3fs, and a real local Ray. A "task" is a sequence of tries of ``run_batch_inference`` (as
Airflow's retries would make them); each case checks, after every successful try, that the
output passes the verifier, holds every input row exactly once and matches the try's summary.
"""

from __future__ import annotations

import io
import time
import uuid

import pyarrow.parquet as pq
import pytest
import s3fs

from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage
from airflow_provider_raybatch.pipeline.commit.verify import verify_output
from airflow_provider_raybatch.pipeline.errors import NotRetryableError, StoreUnavailableError
from airflow_provider_raybatch.pipeline.execution.range_reader import read_ranges
from airflow_provider_raybatch.pipeline.planning.input_files import read_file_info
from airflow_provider_raybatch.pipeline.planning.planner import plan_input
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.store.retries import STORE_RETRY_ENV
from airflow_provider_raybatch.pipeline.summary import RunSummary
from tests.support.data import put_input
from tests.support.fault_proxy import FaultProxy, Rule

pytestmark = pytest.mark.usefixtures("ray_local")

BUCKET = "raybatch-test"
ROWS = 100

#: Every object the commit protocol writes, by the path of its requests (S3 REST, through s3fs).
WRITES = {
    "data file": ("PUT", r"/_raybatch/tmp/.*part-[^/]*\.parquet$"),
    "receipt": ("PUT", r"/_raybatch/tmp/.*block-[^/]*\.metadata\.arrow$"),
    "published file": ("PUT", r"/out/part-[^/]*\.parquet$"),
    "segment": ("PUT", r"/_raybatch/segments/"),
    "manifest": ("PUT", r"/_raybatch/manifest\.json$"),
    "plan": ("PUT", r"/_raybatch/plan\.json$"),
    "schema": ("PUT", r"/_raybatch/schemas/"),
    "lease generation": ("PUT", r"/_raybatch/lease/"),
    "delete": ("POST", r"\?delete"),  # s3fs deletes in batches, one file or many
}


@pytest.fixture(autouse=True)
def _record_each_range(monkeypatch):
    """A segment per range: faults hit each commit. (Transient errors are retried for a few seconds
    within a try in this suite, see conftest.py: faults that outlast them fail the try.)"""
    monkeypatch.setenv("RAYBATCH_RECORD_INTERVAL_S", "0")


@pytest.fixture
def proxy(s3_server):
    with FaultProxy(s3_server["client_kwargs"]["endpoint_url"], seed=7) as proxy:
        yield proxy


def store_options(s3_server, proxy: FaultProxy) -> dict:
    """s3fs options that reach the server through ``proxy``; botocore does not retry (its default is five
    attempts with backoff; s3fs still retries a few times), so that faults reach our own retries in seconds."""
    return {
        **s3_server,
        "client_kwargs": {**s3_server["client_kwargs"], "endpoint_url": proxy.url},
        "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}},
        "skip_instance_cache": True,
    }


def write_input(s3_server, prefix: str, sizes: list[int]) -> None:
    put_input(s3fs.S3FileSystem(**s3_server), f"{BUCKET}/{prefix}/in", sizes, row_group_size=50)


def task_config(s3_server, proxy: FaultProxy, prefix: str) -> BatchInferenceConfig:
    return BatchInferenceConfig(
        input_path=f"s3://{BUCKET}/{prefix}/in",
        output_path=f"s3://{BUCKET}/{prefix}/out",
        stages=[Stage("tests.support.predictors:score")],
        id_column="id",
        rows_per_range=50,
        storage_options=store_options(s3_server, proxy),
        run_key=f"dag/{prefix}/task/-1",
    )


def output_rows(s3_server, prefix: str) -> list[int]:
    fs = s3fs.S3FileSystem(**s3_server, skip_instance_cache=True)
    ids: list[int] = []
    for path in fs.glob(f"{BUCKET}/{prefix}/out/part-*.parquet"):
        ids += pq.read_table(io.BytesIO(fs.cat_file(path)), columns=["id"]).column("id").to_pylist()
    return ids


def assert_sound(s3_server, prefix: str, summary: RunSummary) -> None:
    """The output as a reader finds it agrees with the verifier, with every input row once, and with the summary."""
    assert verify_output(f"s3://{BUCKET}/{prefix}/out", s3_server) == []
    ids = output_rows(s3_server, prefix)
    assert sorted(ids) == list(range(ROWS)), f"{len(ids)} rows, {len(set(ids))} distinct"
    assert summary.rows_out == len(ids) == summary.rows_in


def run_task(s3_server, proxy: FaultProxy, prefix: str, phases: tuple[list[Rule], ...] = (), tries: int = 3) -> list:
    """Tries of one task, each summary or error, until one succeeds (its output is then checked).

    :param phases: the proxy's rules during the first tries, one list per try; the rules in place
        when the test calls this are those of the first try (when ``phases`` is empty); later tries run clean.
    """
    outcomes: list[object] = []
    for attempt in range(tries):
        if attempt < len(phases):
            proxy.clear()
            for rule in phases[attempt]:
                proxy.rules.append(rule)
        elif attempt > 0:
            proxy.clear()
        try:
            summary = run_batch_inference(task_config(s3_server, proxy, prefix))
        except NotRetryableError:
            raise  # a store fault must never fail a task for good
        except Exception as e:  # noqa: BLE001 - a failed try: Airflow retries it
            outcomes.append(e)
            continue
        outcomes.append(summary)
        assert_sound(s3_server, prefix, summary)
        return outcomes
    pytest.fail(f"no try of {tries} succeeded: {outcomes}")


@pytest.mark.parametrize("kind", ["error_after", "drop_after"])
@pytest.mark.parametrize("write", list(WRITES))
def test_every_write_of_the_protocol_with_an_unknown_outcome_ends_exactly_once(s3_server, proxy, write, kind):
    """Each write the store applies but answers with an error (or whose reply is lost), on every
    request of that kind during the first try: the task ends, within its retries, in an output
    with every row once and a summary that counts exactly what is there."""
    prefix = f"classes-{uuid.uuid4().hex[:8]}"
    write_input(s3_server, prefix, [50, 50])
    method, path = WRITES[write]
    rule = proxy.add(kind, method=method, path=path, times=None)
    run_task(s3_server, proxy, prefix)
    assert rule.applied > 0, f"no {write} request met the fault"


@pytest.mark.parametrize("kind", ["error_after", "drop_after"])
def test_deletes_of_a_resume_with_an_unknown_outcome_end_exactly_once(s3_server, proxy, kind):
    """A try fails before recording its ranges (segments refused), so the next try deletes their
    published files before redoing them; those deletes are applied but answered with an error
    (or their replies lost). The task still ends with every row once."""
    prefix = f"deletes-{uuid.uuid4().hex[:8]}"
    write_input(s3_server, prefix, [50, 50])
    # Refused, and the try cannot read back whether: it leaves the ranges' files for the next try.
    refuse = [
        Rule("error", method="PUT", path=r"/_raybatch/segments/", times=None, after=1),
        Rule("error", method="GET", path=r"/_raybatch/segments/", times=None),
    ]
    deletes = Rule(kind, method="POST", path=r"\?delete", times=None)
    outcomes = run_task(s3_server, proxy, prefix, phases=(refuse, [deletes]))
    assert isinstance(outcomes[0], Exception), outcomes[0]
    assert deletes.applied > 0


def test_a_segment_applied_but_answered_500_is_not_lost_nor_counted_twice(s3_server, proxy):
    """Case 1: the store keeps a commit-record segment but answers 500, and reading it back fails
    too, so the try cannot tell: it fails without deleting the ranges' files, and the retry finds
    them committed (it used to delete them, then skip their ranges and report rows that were gone)."""
    prefix = f"segment-{uuid.uuid4().hex[:8]}"
    write_input(s3_server, prefix, [50, 50])
    put = proxy.add("error_after", method="PUT", path=r"/_raybatch/segments/", times=None, after=1)
    proxy.add("error", method="GET", path=r"/_raybatch/segments/", times=None)
    outcomes = run_task(s3_server, proxy, prefix)
    assert put.applied > 0
    assert isinstance(outcomes[0], Exception) and "cannot commit" in str(outcomes[0]), outcomes[0]


def test_a_segment_known_not_written_unpublishes_its_ranges_at_once(s3_server, proxy):
    """A segment the store refuses (and reading it back says it is not there): the outcome is known,
    so the try removes the range's published files before failing; readers never see them."""
    prefix = f"refused-{uuid.uuid4().hex[:8]}"
    write_input(s3_server, prefix, [50, 50])
    proxy.add("error", method="PUT", path=r"/_raybatch/segments/", times=None, after=1)
    with pytest.raises(Exception, match="cannot commit range"):
        run_batch_inference(task_config(s3_server, proxy, prefix))
    proxy.clear()
    faults = verify_output(f"s3://{BUCKET}/{prefix}/out", s3_server)
    assert len(faults) == 1 and faults[0].startswith("1 planned range(s) not committed"), faults
    run_task(s3_server, proxy, prefix)


@pytest.mark.parametrize("kind", ["error", "error_after"])
def test_an_overwrite_s_reset_waits_out_deletes_answered_500(s3_server, proxy, monkeypatch, kind):
    """Issue 41: ``mode="overwrite"`` removes the output's files before its run; deletes answered 500
    (refused, or applied all the same) are retried within the try, as every write of the protocol is,
    instead of failing it; a delete retried after it was applied finds the files gone, which is done."""
    monkeypatch.setenv(STORE_RETRY_ENV, "30")  # the conftest's 3 s is shorter than three backoffs may be
    prefix = f"reset-{uuid.uuid4().hex[:8]}"
    write_input(s3_server, prefix, [50, 50])
    run_batch_inference(task_config(s3_server, proxy, prefix))
    deletes = proxy.add(kind, method="POST", path=r"\?delete", times=3)
    overwrite = task_config(s3_server, proxy, prefix)
    overwrite.mode, overwrite.run_key = "overwrite", f"dag/{prefix}-2/task/-1"
    summary = run_batch_inference(overwrite)
    assert deletes.applied == 3
    assert summary.ranges_done == 2
    assert_sound(s3_server, prefix, summary)


def test_a_data_file_put_that_lands_late_is_reported_by_verify_and_removed_by_the_next_run(s3_server, proxy):
    """Issue 41: a data file's PUT that lands after its writer gave up on it (s3fs timed it out and
    the run went on) is an object under ``_raybatch/tmp/`` that no writer will publish. Readers never
    see it; the verifier reports it (a warning: the output is sound) and the next run removes it."""
    prefix = f"late-{uuid.uuid4().hex[:8]}"
    write_input(s3_server, prefix, [50, 50])
    run_batch_inference(task_config(s3_server, proxy, prefix))
    fs = s3fs.S3FileSystem(**s3_server, skip_instance_cache=True)
    late = f"{BUCKET}/{prefix}/out/_raybatch/tmp/part-1.{uuid.uuid4().hex}.parquet"
    fs.pipe_file(late, fs.cat_file(fs.glob(f"{BUCKET}/{prefix}/out/part-*.parquet")[0]))
    warnings: list[str] = []
    assert verify_output(f"s3://{BUCKET}/{prefix}/out", s3_server, warnings=warnings) == []
    assert warnings == [
        "1 stray temporary file(s) that no live writer is writing (their writer gave up on them: never read, "
        f"removed by the next run of the output): _raybatch/tmp/{late.rsplit('/', 1)[1]}"
    ]
    summary = run_batch_inference(task_config(s3_server, proxy, prefix))  # a rerun: nothing left to do
    assert summary.ranges_skipped == 2 and not fs.exists(late)
    warnings.clear()
    assert verify_output(f"s3://{BUCKET}/{prefix}/out", s3_server, warnings=warnings) == [] and warnings == []


def test_a_lease_created_whose_reply_was_lost_is_the_writers_own(s3_server, proxy):
    """Case 2: the lease's create is applied, its reply dropped; the client retries and the store
    answers 412. The writer reads the lease back, recognises its own generation, and goes on."""
    prefix = f"lease-{uuid.uuid4().hex[:8]}"
    write_input(s3_server, prefix, [50, 50])
    rule = proxy.add("drop_after", method="PUT", path=r"/_raybatch/lease/0+1\.json$", times=1)
    summary = run_batch_inference(task_config(s3_server, proxy, prefix))
    assert rule.applied == 1
    assert_sound(s3_server, prefix, summary)


def test_a_throttling_burst_during_planning_is_waited_out(s3_server, proxy, monkeypatch):
    """Case 3: 503 SlowDown on the input's reads for longer than the client's own retries: the
    planner waits it out within the try's retry budget, and the task succeeds."""
    monkeypatch.setenv(STORE_RETRY_ENV, "60")
    prefix = f"throttle-{uuid.uuid4().hex[:8]}"
    write_input(s3_server, prefix, [50, 50])
    rule = proxy.add("throttle", method="GET", path=r"/in/part-0\.parquet$", times=30)
    summary = run_batch_inference(task_config(s3_server, proxy, prefix))
    assert rule.applied == 30
    assert_sound(s3_server, prefix, summary)


def test_throttling_past_the_retry_budget_fails_the_try_retryably(s3_server, proxy):
    """Case 3: throttling that lasts past the budget fails the try with a retryable error naming
    the file, not a non-retryable input error; once it ends, the next try succeeds."""
    prefix = f"throttled-{uuid.uuid4().hex[:8]}"
    write_input(s3_server, prefix, [50, 50])
    proxy.add("throttle", method="GET", path=r"/in/part-1\.parquet$", times=None)
    outcomes = run_task(s3_server, proxy, prefix)
    first = outcomes[0]
    assert isinstance(first, StoreUnavailableError), repr(first)
    assert "in/part-1.parquet" in str(first) and not isinstance(first, NotRetryableError)


def test_throttling_while_reading_rows_is_not_taken_for_a_damaged_file(s3_server, proxy, monkeypatch):
    """Case 3: the same 503 twice on a row group read used to be reported as a damaged file
    ("replace it and rerun with mode='overwrite'", which throws away committed ranges)."""
    monkeypatch.setenv(STORE_RETRY_ENV, "60")
    prefix = f"reading-{uuid.uuid4().hex[:8]}"
    write_input(s3_server, prefix, [150])
    fs = s3fs.S3FileSystem(**store_options(s3_server, proxy))
    plan = plan_input(fs, f"{BUCKET}/{prefix}/in", "in", None, 50, "id")
    rule = proxy.add("throttle", method="GET", path=r"/in/part-0\.parquet$", times=20)
    tables = list(read_ranges(fs, plan.files[0], list(enumerate(plan.ranges)), ["id"], ["id"], False))
    assert rule.applied == 20
    assert sum(t.num_rows for t in tables) == 150


def test_a_file_that_stays_unreadable_is_still_an_input_error(s3_server, proxy):
    """What a retry cannot change stays permanent: a file that is not Parquet."""
    prefix = f"corrupt-{uuid.uuid4().hex[:8]}"
    fs = s3fs.S3FileSystem(**store_options(s3_server, proxy))
    fs.pipe_file(f"{BUCKET}/{prefix}/in/part-0.parquet", b"not parquet at all")
    with pytest.raises(NotRetryableError, match="part-0.parquet"):
        read_file_info(fs, f"{BUCKET}/{prefix}/in/part-0.parquet", f"{BUCKET}/{prefix}/in")


def test_a_whole_output_writer_and_a_shard_writer_starting_together_never_both_write(s3_server, proxy):
    """Case 4: a whole-output writer (an overwrite, say) whose lease create is slow (one PUT long on
    S3), and a shard's task that starts inside that window. The whole-output writer used to
    list the shards' leases before creating its own, so both passed their checks and wrote
    into one output. Now each looks for the other only once its own lease exists: one is refused."""
    import dataclasses
    import threading

    from airflow_provider_raybatch.pipeline.errors import OutputBusyError
    from airflow_provider_raybatch.pipeline.prepare import prepare
    from airflow_provider_raybatch.pipeline.shards import plan_shards

    prefix = f"handover-{uuid.uuid4().hex[:8]}"
    write_input(s3_server, prefix, [50, 50])
    whole = task_config(s3_server, proxy, prefix)
    first, _ = plan_shards(whole, 2)
    shard = dataclasses.replace(whole, range_ids=first.range_ids, run_key=f"dag/{prefix}/task/0")
    slow = proxy.add("delay", method="PUT", path=r"/_raybatch/lease/0+\d+\.json$", delay_s=4, times=1)
    outcome: dict[str, object] = {}

    def whole_writer() -> None:
        try:
            outcome["whole"] = prepare(whole)
        except OutputBusyError as e:
            outcome["whole"] = e

    thread = threading.Thread(target=whole_writer)
    thread.start()
    while not slow.applied:  # the whole-output writer's lease create is on its way
        time.sleep(0.05)
    try:
        outcome["shard"] = prepare(shard)
    except OutputBusyError as e:
        outcome["shard"] = e
    thread.join()
    writers = [run for run in outcome.values() if not isinstance(run, Exception)]
    for run in writers:
        run.release()
    assert len(writers) == 1, outcome


# --- Azure (Azurite) and GCS (gcp-storage-emulator) behind the same proxy ----------------------------

#: The output's requests on either store: Azure names the blob in the path, GCS's uploads in the
#: query (URL-encoded), and GCS deletes many objects in one batch request.
OUTPUT_REQUESTS = r"out(/|%2F)|/batch/"


def cloud_store(name: str, server, proxy: FaultProxy) -> tuple[dict, object]:
    """Storage options that reach ``server`` through ``proxy``, and a filesystem that reaches it directly."""
    if name == "gs":
        import gcsfs

        options = {"token": "anon", "project": "raybatch-test"}
        direct = gcsfs.GCSFileSystem(endpoint_url=server.endpoint, skip_instance_cache=True, **options)
        if not direct.exists(BUCKET):
            direct.mkdir(BUCKET)
        return {"endpoint_url": proxy.url, "skip_instance_cache": True, **options}, direct
    import adlfs

    account, key = server.extra["account"], server.extra["key"]

    def connection(endpoint: str) -> str:
        return f"AccountName={account};AccountKey={key};BlobEndpoint={endpoint};"

    direct = adlfs.AzureBlobFileSystem(connection_string=connection(server.endpoint), skip_instance_cache=True)
    if BUCKET not in {p.rstrip("/") for p in direct.ls("")}:
        direct.mkdir(BUCKET)
    options = {"connection_string": connection(f"{proxy.url}/{account}"), "skip_instance_cache": True}
    return options, direct


@pytest.mark.parametrize("name", ["gs", "abfs"])
def test_writes_with_an_unknown_outcome_on_azure_and_gcs_end_exactly_once(request, name):
    """A fifth of the output's writes (data files, publishing, records, plan, schemas, lease, deletes)
    applied and answered with an error, or with their replies lost, during the first try: the task
    ends, within its retries, with every row once and a summary that counts what is there."""
    server = request.getfixturevalue({"gs": "gcs_server", "abfs": "azure_server"}[name])
    with FaultProxy(server.endpoint, seed=11) as proxy:
        options, direct = cloud_store(name, server, proxy)
        prefix = f"{name}-{uuid.uuid4().hex[:8]}"
        put_input(direct, f"{BUCKET}/{prefix}/in", [50, 50], row_group_size=50)
        config = BatchInferenceConfig(
            input_path=f"{name}://{BUCKET}/{prefix}/in",
            output_path=f"{name}://{BUCKET}/{prefix}/out",
            stages=[Stage("tests.support.predictors:score")],
            id_column="id",
            rows_per_range=50,
            storage_options=options,
            run_key=f"dag/{prefix}/task/-1",
        )
        rules = [
            # Once each: Azure's client waits 15 s and more before it retries a request.
            Rule(kind, method=method, path=OUTPUT_REQUESTS, times=1, probability=0.15)
            for kind in ("error_after", "drop_after")
            for method in ("PUT", "POST", "DELETE")
        ]
        proxy.rules.extend(rules)
        outcomes: list[object] = []
        for _ in range(3):
            try:
                outcomes.append(run_batch_inference(config))
                break
            except NotRetryableError:
                raise
            except Exception as e:  # noqa: BLE001 - a failed try: Airflow retries it
                outcomes.append(e)
                proxy.clear()
        summary = outcomes[-1]
        assert isinstance(summary, RunSummary), outcomes
        assert all(sum(r.applied for r in rules if r.kind == kind) for kind in ("error_after", "drop_after")), [
            (r.kind, r.method, r.applied) for r in rules
        ]
        proxy.clear()
        assert verify_output(config.output_path, options) == []
        direct.invalidate_cache()
        ids = pq.read_table(f"{BUCKET}/{prefix}/out", filesystem=direct, columns=["id"])["id"].to_pylist()
        assert sorted(ids) == list(range(ROWS))
        assert summary.rows_out == len(ids) == summary.rows_in


def test_a_seeded_soak_never_ends_in_success_over_a_wrong_output():
    """A few tasks of the soak (`make soak` runs many): random faults on 5% of all requests."""
    from benchmarks.store_fault_soak import soak

    counts = soak(tasks=3, rate=0.05, seed=3)
    assert counts.faults > 0
    assert counts.wrong == [] and counts.permanent == [], counts
    assert counts.sound + counts.out_of_tries == counts.tasks >= 1 and counts.sound >= 1, counts
