"""The UI plugin's API on a real output: a task instance killed part-way by SIGKILL (its figures
then), resumed by its next try (its figures after), read through the task instance Airflow recorded
(its rendered fields name the output), with Airflow's own authentication: 401 without a token,
403 for a user whose team does not own the DAG, the verifier for those who may act on it."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
from datetime import UTC, datetime

import pytest

from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.status import read_status
from tests.conftest import run_dag
from tests.support.data import write_input
from tests.support.leases import write_holder
from tests.support.ui_outputs import (
    DAG_ID,
    REJECTED,
    ROWS_PER_FILE,
    TASK_ID,
    Api,
    auth_environment,
    environment,
    give_dag_to_team,
    outputs_dag,
    run_killed,
    tokens_of,
)

pytestmark = pytest.mark.usefixtures("airflow_db", "ray_local")

KILLED_DATE = datetime(2026, 11, 20, tzinfo=UTC)
DONE_DATE = datetime(2026, 11, 21, tzinfo=UTC)
#: A date whose output another writer holds (its lease written by hand, live for an hour).
BUSY_DATE = datetime(2026, 11, 22, tzinfo=UTC)
#: A secret Airflow masks, in the holder's name: the refusal names the holder, never the secret.
SECRET = "s3cret-token-4242"


def ti_path(run_id: str) -> str:
    return f"/api/ti/{DAG_ID}/{run_id}/{TASK_ID}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The DAG run for DONE_DATE to the end; KILLED_DATE's task SIGKILLed after 2 commits, its API
    figures read, then resumed by a second try and read again."""
    root = tmp_path_factory.mktemp("ui")
    home = tmp_path_factory.mktemp("ui-home")
    write_input(root / "in", ROWS_PER_FILE)
    dag = outputs_dag(root)
    done = run_dag(dag, DONE_DATE)
    killed = run_killed(root, KILLED_DATE, commits=2)
    assert killed.returncode == -signal.SIGKILL, killed.output[-3000:]
    auth = auth_environment(home)
    with environment(auth):
        give_dag_to_team(DAG_ID, "team_a")
        api = Api()
        run_id = killed_run_id()
        before = {
            "ti": api.call("GET", ti_path(run_id)).json(),
            "dag": api.call("GET", f"/api/dag/{DAG_ID}").json(),
            "run": api.call("GET", f"/api/run/{DAG_ID}/{run_id}").json(),
            "verify": api.call("POST", ti_path(run_id) + "/verify", headers={"X-Raybatch-Action": "verify"}).json(),
            "model": read_status(str(root / "out" / "2026-11-20")),
        }
    resumed = run_dag(dag, KILLED_DATE)
    # A no-op rerun of the finished date (a second try of its task instance), its log kept.
    lines = _Lines()
    logging.getLogger("airflow_provider_raybatch").addHandler(lines)
    try:
        rerun = run_dag(dag, DONE_DATE)
    finally:
        logging.getLogger("airflow_provider_raybatch").removeHandler(lines)
    # A second writer refused: another holds the date's output.
    from airflow.sdk.log import mask_secret

    mask_secret(SECRET)
    lease = root / "out" / "2026-11-22" / "_raybatch" / "lease"
    write_holder(lease, age_s=0, timeout_s=3600)
    held = json.loads((lease / "000000000001.json").read_text())
    held["holder"]["run_key"] = f"other_dag/{SECRET}/score/-1"
    (lease / "000000000001.json").write_text(json.dumps(held))
    busy = run_dag(dag, BUSY_DATE)
    with environment(auth):
        after = {
            "ti": api.call("GET", ti_path(run_id)).json(),
            "dag": api.call("GET", f"/api/dag/{DAG_ID}").json(),
            "verify": api.call("POST", ti_path(run_id) + "/verify", headers={"X-Raybatch-Action": "verify"}).json(),
            "rerun": api.call("GET", ti_path(done.run_id)).json(),
            "busy": api.call("GET", ti_path(busy.run_id)).json(),
        }
        yield {
            "root": root,
            "run_id": run_id,
            "done_run_id": done.run_id,
            "killed": killed,
            "resumed": resumed,
            "rerun": rerun,
            "rerun_log": lines.messages,
            "before": before,
            "after": after,
            "api": api,
        }


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def killed_run_id() -> str:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return session.scalar(select(DagRun.run_id).where(DagRun.dag_id == DAG_ID, DagRun.logical_date == KILLED_DATE))


def test_a_task_killed_part_way_reads_partial_with_its_holder_gone(runs):
    data = runs["before"]["ti"]
    assert data["found"] is True, data
    task = data["task"]
    assert (task["dag_id"], task["run_id"], task["task_id"], task["map_index"]) == (DAG_ID, runs["run_id"], TASK_ID, -1)
    assert task["source"] == "rendered" and task["path"] == str(runs["root"] / "out" / "2026-11-20")
    assert task["try_number"] == 1
    [out] = data["outputs"]
    assert out["state"] == "partial" and out["ranges_planned"] == 5 and out["ranges_committed"] == 2
    assert 0 < out["rows_done"] < 400 and out["rows_planned"] == 400
    assert out["fraction_done"] == pytest.approx(out["rows_done"] / 400)
    assert out["committed_mask"].count("1") == 2 and len(out["committed_mask"]) == 5
    assert [f["relpath"] for f in out["files"]] == ["part-0.parquet", "part-1.parquet"]
    assert (
        sum(f["ranges_committed"] for f in out["files"]) == 2
        and sum(f["rows_done"] for f in out["files"]) == out["rows_done"]
    )
    assert out["timeline"][-1]["rows"] == out["rows_done"] and out["eta_s"] is None
    lease = out["lease"]
    assert (lease["dag_id"], lease["run_id"], lease["task_id"], lease["map_index"]) == (
        DAG_ID,
        runs["run_id"],
        TASK_ID,
        -1,
    )
    assert lease["try_number"] == 1 and lease["pid"] == runs["killed"].pid and lease["host"] == socket.gethostname()
    assert lease["holder_gone"] is True and not lease["released"] and not lease["live"]
    # The same figures as the status model reads (what `raybatch status` prints).
    model = runs["before"]["model"]
    assert (model.ranges_committed, model.rows_done, model.rows_rejected) == (2, out["rows_done"], out["rows_rejected"])
    assert (model.tokens_in, model.tokens_out) == (out["tokens_in"], out["tokens_out"])
    assert 0 < out["tokens_in"] < tokens_of(range(400))[0]  # the two committed ranges' rows only
    # The verifier gives no verdict on an unfinished output: it says what is done so far, no fault.
    verdict = runs["before"]["verify"]
    assert verdict["ok"] is None and verdict["unfinished"] is True and verdict["faults"] == [], verdict
    assert verdict["message"].startswith("not done yet (stopped part-way, no writer running): 2 of 5 planned ranges")


def test_the_resumed_task_reads_done_with_its_summary_rejects_and_a_clean_verify(runs):
    data = runs["after"]["ti"]
    [out] = data["outputs"]
    assert data["task"]["state"] == "success"
    assert out["state"] == "done" and out["fraction_done"] == 1.0 and out["committed_mask"] == "11111"
    assert (out["ranges_committed"], out["rows_done"], out["rows_rejected"], out["engine_errors"]) == (
        5,
        400,
        REJECTED,
        2,
    )
    assert out["rows_out"] == 400 - REJECTED
    # Tokens of the committed rows, each once: the killed try's two ranges and the resumed three.
    assert (out["tokens_in"], out["tokens_out"]) == tokens_of(range(400))
    lease = out["lease"]
    assert lease["released"] and lease["try_number"] == data["task"]["try_number"] and lease["pid"] == os.getpid()
    assert lease["generation"] == runs["before"]["ti"]["outputs"][0]["lease"]["generation"] + 1
    assert out["timeline"][-1]["rows"] == 400 and out["timeline"][-1]["ranges"] == 5
    rejects = out["rejects"]
    assert rejects["rejected"] == REJECTED and rejects["engine_errors"] == 2 and len(rejects["rows"]) == 20
    assert {"id", "reason", "kind"} <= set(rejects["rows"][0]) and "id 0 is invalid" in {
        r["reason"] for r in rejects["rows"]
    }
    assert runs["after"]["verify"] == {"ok": True, "faults": [], "seconds": runs["after"]["verify"]["seconds"]}


def test_the_dag_page_shows_each_date_partial_then_done(runs):
    def cells(document):
        return {run["run_id"]: run["cells"][TASK_ID] for run in document["runs"]}

    before, after = cells(runs["before"]["dag"]), cells(runs["after"]["dag"])
    assert runs["before"]["dag"]["tasks"] == [TASK_ID]
    partial = before[runs["run_id"]]
    assert partial["state"] == "partial" and 0 < partial["fraction_done"] < 1 and partial["ranges_committed"] == 2
    assert before[runs["done_run_id"]]["state"] == "done" and before[runs["done_run_id"]]["rows_rejected"] == REJECTED
    assert after[runs["run_id"]]["state"] == "done" and after[runs["run_id"]]["fraction_done"] == 1.0
    [line] = runs["before"]["run"]["lines"]
    assert line["state"] == "partial" and line["task"]["map_index"] == -1


def test_no_token_is_401_and_a_user_of_another_team_403_on_every_route(runs):
    api, run_id = runs["api"], runs["run_id"]
    routes = [
        ("GET", ti_path(run_id)),
        ("GET", f"/api/run/{DAG_ID}/{run_id}"),
        ("GET", f"/api/dag/{DAG_ID}"),
        ("GET", f"/ti/{DAG_ID}/{run_id}/{TASK_ID}"),
        ("GET", f"/run/{DAG_ID}/{run_id}"),
        ("GET", f"/dag/{DAG_ID}"),
        ("POST", ti_path(run_id) + "/verify"),
    ]
    for method, path in routes:
        assert api.call(method, path, user=None).status_code == 401, path
        assert api.call(method, path, headers={"Authorization": "Bearer not-a-jwt"}, user=None).status_code in (
            401,
            403,
        )
        assert api.call(method, path, user="bob").status_code == 403, path
    # Cookie auth, as the UI's iframe sends it.
    cookie = api.client.get(ti_path(run_id), cookies={"_token": api.tokens["alice"]})
    assert cookie.status_code == 200 and cookie.json()["found"] is True
    # A viewer of the DAG reads it but may not run the verifier.
    assert api.call("GET", ti_path(run_id), user="vera").status_code == 200
    verify = {"headers": {"X-Raybatch-Action": "verify"}}
    assert api.call("POST", ti_path(run_id) + "/verify", user="vera", **verify).status_code == 403
    assert api.call("POST", ti_path(run_id) + "/verify", user="admin", **verify).status_code == 200
    assert api.call("POST", ti_path(run_id) + "/verify", user="alice").status_code == 400  # no action header


def test_a_request_names_a_task_instance_never_a_path(runs):
    api, run_id = runs["api"], runs["run_id"]
    # A path in the query is not read: the output is the task instance's.
    data = api.call("GET", ti_path(run_id), params={"output_path": "/etc", "path": "/etc"}).json()
    assert data["task"]["path"] == str(runs["root"] / "out" / "2026-11-20")
    assert api.call("GET", f"/api/ti/{DAG_ID}/{run_id}/no_such_task").status_code == 404
    assert api.call("GET", "/api/dag/no_such_dag", user="admin").status_code == 404
    missing = api.call("GET", ti_path("manual__2030-01-01T00:00:00+00:00")).json()
    assert missing["found"] is False and missing["task"]["state"] is None
    # No connection id or other argument than the output's location reaches the browser.
    assert set(data["task"]) == {
        "dag_id",
        "run_id",
        "task_id",
        "map_index",
        "path",
        "format",
        "partition",
        "source",
        "state",
        "try_number",
        "mapped",
    }
    page = api.call("GET", f"/ti/{DAG_ID}/{run_id}/{TASK_ID}", params={"map_index": "{MAP_INDEX}"})
    assert page.status_code == 200 and '"map_index": -1' in page.text and "<script>" in page.text


def writer_of(run_id: str) -> str:
    # dag.test() runs a date again as the same try of its task instance (Airflow's scheduler would number it 2).
    return f"{DAG_ID} / {run_id} / {TASK_ID}, try 1"


def test_a_killed_and_resumed_runs_figures_follow_its_commit_records(runs):
    """Each try's commit rate, the output's average (the gap between the tries not counted) and
    its last writer, against the commit records' times and writers."""
    records = OutputLedger.open(str(runs["root"] / "out" / "2026-11-20")).committed().values()
    killed, resumed = runs["killed"].pid, os.getpid()
    by_try = {pid: [r for r in records if r.writer.pid == pid] for pid in (killed, resumed)}
    assert [len(by_try[killed]), len(by_try[resumed])] == [2, 3]
    spans = {}
    for pid, mine in by_try.items():
        start = mine[0].writer.started_at
        last = max(r.committed_at for r in mine)
        # The stages' start: before the try's first commit.
        assert start < min(r.committed_at for r in mine)
        spans[pid] = (start, last, sum(r.input_rows for r in mine))
    assert spans[resumed][0] > spans[killed][1]  # the resumed try's time starts after the killed one's
    out = runs["after"]["ti"]["outputs"][0]
    tries = {t["writer"]["pid"]: t for t in out["tries"]}
    for pid, (start, last, rows) in spans.items():
        assert (tries[pid]["started_at"], tries[pid]["last_commit_at"], tries[pid]["rows"]) == (start, last, rows)
        assert tries[pid]["commit_rows_per_s"] == pytest.approx(rows / (last - start), abs=0.1)
    average = 400 / sum(last - start for start, last, _ in spans.values())
    assert out["average_commit_rows_per_s"] == pytest.approx(average, abs=0.1)
    assert out["average_commit_rows_per_s"] > 400 / (spans[resumed][1] - spans[killed][0])  # the gap, counted
    assert out["commit_rows_per_s"] is None and "rate_rows_per_s" not in out  # done: no current rate
    assert out["last_writer"]["pid"] == resumed and out["last_writer"]["describe"] == writer_of(runs["run_id"])
    # The resumed try's own story: what it committed, what it skipped and whose it was.
    story = runs["after"]["ti"]["try"]
    assert (story["state"], story["outcome"]) == ("success", "wrote")
    assert (story["ranges_committed"], story["rows_committed"], story["ranges_skipped"]) == (3, spans[resumed][2], 2)
    assert story["skipped_by"] == [{"writer": writer_of(runs["run_id"]), "ranges": 2, "rows": spans[killed][2]}]
    assert story["commit_rows_per_s"] == pytest.approx(tries[resumed]["commit_rows_per_s"], rel=0.05)
    assert story["scoring_rows_per_s"] > 0 and story["wall_s"] >= spans[resumed][1] - spans[resumed][0]
    assert story["commit_rows_per_s"] == runs["resumed"].get_task_instance(TASK_ID).xcom_pull()["commit_rows_per_s"]
    # The killed try, read before the resume (still running for Airflow): its story from the records naming it.
    before = runs["before"]["ti"]["try"]
    assert (before["state"], before["outcome"]) == ("running", "running")
    assert (before["ranges_committed"], before["rows_committed"]) == (2, spans[killed][2])
    assert before["commit_rows_per_s"] == pytest.approx(tries[killed]["commit_rows_per_s"], abs=0.1)


def test_a_no_op_rerun_says_nothing_to_do_and_names_the_run_that_wrote(runs):
    data = runs["after"]["rerun"]
    story, [out] = data["try"], data["outputs"]
    assert (story["outcome"], story["ranges_committed"], story["rows_committed"]) == ("nothing to do", 0, 0)
    wrote = writer_of(runs["done_run_id"])
    assert story["skipped_by"] == [{"writer": wrote, "ranges": 5, "rows": 400}] and story["rows_skipped"] == 400
    assert story["commit_rows_per_s"] is None and story["scoring_rows_per_s"] is None
    # The output's writer stays the run that wrote; the rerun only held the lease, after the last commit.
    assert out["last_writer"]["describe"] == wrote and out["last_writer"]["started_at"] < story["started_at"]
    assert out["lease"]["taken_at"] > out["last_commit_at"]
    assert f"nothing to do: all 5 ranges were committed by {wrote}" in runs["rerun_log"]
    assert runs["rerun"].get_task_instance(TASK_ID).xcom_pull()["skipped_by"] == story["skipped_by"]


def test_a_refused_second_writer_says_why_without_the_secret(runs):
    data = runs["after"]["busy"]
    story = data["try"]
    assert (story["state"], story["outcome"]) == ("failed", "refused")
    assert "is being written by dag other_dag" in story["message"] and "***" in story["message"]
    assert SECRET not in json.dumps(data)
    assert story["ranges_committed"] == 0 and story["skipped_by"] == [] and story["wall_s"] >= 0
