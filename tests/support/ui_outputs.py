"""What the UI plugin's tests look at: a DAG of one inference task writing ``<root>/out/<ds>``, run
for real (killed part-way in a process of its own, then resumed), users of the simple auth manager
with per-team DAG access, and a writer that commits an output's ranges one by one while a browser
watches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from tests.support.pipeline_runs import RECORD_EACH_RANGE, REPO, kill_leftovers, own_ray_env

DAG_ID = "ui_outputs"
TASK_ID = "score"
#: 400 input rows in 5 ranges of 100, 100, 50, 100, 50 rows.
ROWS_PER_FILE = [250, 150]
INVALID_EVERY = 9
ENGINE_ERROR_IDS = (5, 130)
REJECTED = len([i for i in range(sum(ROWS_PER_FILE)) if i % INVALID_EVERY == 0]) + len(ENGINE_ERROR_IDS)


#: The tokens ``reject_some`` reports for each row that reaches its "model" (not the invalid ones).
TOKENS_PER_ROW = (10, 1)


def tokens_of(ids) -> tuple[int, int]:
    """The output's token totals once ``ids`` are committed."""
    reached = len([i for i in ids if i % INVALID_EVERY])
    return reached * TOKENS_PER_ROW[0], reached * TOKENS_PER_ROW[1]


def reject_some(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """Scores rows; rejects ids divisible by 9 as invalid input and ids 5 and 130 as engine errors
    (numpy only); the rows that reach the "model" cost :data:`TOKENS_PER_ROW`."""
    reasons, kinds = [], []
    for i in batch["id"].tolist():
        if i % INVALID_EVERY == 0:
            reasons.append(f"id {i} is invalid")
            kinds.append("invalid_input")
        elif i in ENGINE_ERROR_IDS:
            reasons.append(f"model failed on id {i}")
            kinds.append("engine_error")
        else:
            reasons.append(None)
            kinds.append(None)
    reached = [kind != "invalid_input" for kind in kinds]
    return {
        "score": batch["features"].sum(axis=1),
        "__raybatch_reject": reasons,
        "__raybatch_reject_kind": kinds,
        "__raybatch_tokens_in": [TOKENS_PER_ROW[0] if r else None for r in reached],
        "__raybatch_tokens_out": [TOKENS_PER_ROW[1] if r else None for r in reached],
    }


def outputs_dag(
    root: Path, dag_id: str = DAG_ID, predictor: str = "tests.support.ui_outputs:reject_some", **predictor_kwargs: Any
):
    """One inference task over ``root/in`` into ``root/out/{{ ds }}`` (a templated path, as a daily DAG has)."""
    from airflow.sdk import DAG

    from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

    with DAG(dag_id, schedule=None, start_date=datetime(2026, 11, 1, tzinfo=UTC)) as dag:
        RayBatchInferenceOperator(
            task_id=TASK_ID,
            predictor=predictor,
            predictor_kwargs=predictor_kwargs,
            input_path=str(root / "in"),
            output_path=str(root / "out") + "/{{ ds }}",
            id_column="id",
            rows_per_range=100,
            batch_size=100,
            max_error_fraction=1,
            retries=0,
        )
    return dag


def serialize(dag) -> None:
    """Write ``dag`` to the metadata DB, as the DAG processor would (and ``run_dag`` does first)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    from tests.support.airflow_versions import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder=tempfile.mkdtemp())
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)


RUN_DAG = """
import json, sys
from datetime import datetime
from pathlib import Path
from tests.conftest import run_dag
from tests.support.ui_outputs import outputs_dag
date = datetime.fromisoformat(sys.argv[2])
run_dag(outputs_dag(Path(sys.argv[1]), **json.loads(sys.argv[3])), date)
"""


def start_run(
    root: Path, logical_date: datetime, env: dict[str, str] | None = None, **dag_kwargs: Any
) -> subprocess.Popen:
    """Run the DAG's task for ``logical_date`` with ``dag.test()`` in a process of its own, with a
    Ray of its own (``proc.ray_tmp``)."""
    ray_tmp, env = own_ray_env({**RECORD_EACH_RANGE, **(env or {})})
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN_DAG, str(root), logical_date.isoformat(), json.dumps(dag_kwargs)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    proc.ray_tmp = ray_tmp
    return proc


def run_killed(root: Path, logical_date: datetime, commits: int, **dag_kwargs: Any) -> subprocess.Popen:
    """Run the DAG's task for ``logical_date`` in a process of its own, SIGKILLed right after its
    ``commits``-th commit record: a task instance killed part-way."""
    return runs_killed(root, {logical_date: commits}, **dag_kwargs)[logical_date]


def runs_killed(root: Path, commits: dict[datetime, int], **dag_kwargs: Any) -> dict[datetime, subprocess.Popen]:
    """:func:`run_killed` for each logical date of ``commits``, side by side (each waits for its own Ray)."""
    if len(commits) > 1:  # serialized here first: processes serializing a new DAG at once race on its asset
        serialize(outputs_dag(root, **dag_kwargs))
    procs = {
        date: start_run(root, date, {"RAYBATCH_TEST_CRASH": f"committed:{n}"}, **dag_kwargs)
        for date, n in commits.items()
    }
    for proc in procs.values():
        proc.output = proc.communicate(timeout=300)[0]
        kill_leftovers(proc.ray_tmp)
    return procs


#: Users of the simple auth manager: an admin; in team_a (which owns the DAG's bundle) a user and a
#: viewer; in team_b a user who may not see team_a's DAGs.
USERS = {"admin": "admin", "alice": "user:team_a", "vera": "viewer:team_a", "bob": "user:team_b"}


def auth_environment(home: Path) -> dict[str, str]:
    """The simple auth manager with :data:`USERS` in multi-team mode, their passwords in a file."""
    passwords = home / "ui-passwords.json"
    passwords.write_text(json.dumps({name: f"{name}-password" for name in USERS}))
    return {
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in USERS.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__API_AUTH__JWT_SECRET": "raybatch-ui-tests-secret",
    }


def give_dag_to_team(dag_id: str, team: str, other_teams: tuple[str, ...] = ("team_b",)) -> None:
    """Put the DAG's bundle in ``team`` (Airflow's multi-team model: a team owns bundles, and their
    DAGs); ``other_teams`` exist too (the auth manager checks that its users' teams do)."""
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.team import Team
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        model = session.scalar(select(DagModel).where(DagModel.dag_id == dag_id))
        bundle_name = f"{team}-bundle"
        bundle = session.scalar(select(DagBundleModel).where(DagBundleModel.name == bundle_name))
        if bundle is None:
            bundle = DagBundleModel(name=bundle_name)
            session.add(bundle)
        owner = session.scalar(select(Team).where(Team.name == team)) or Team(name=team)
        if owner not in bundle.teams:
            bundle.teams.append(owner)
        session.flush()  # the bundle first: the DAG's bundle_name refers to it
        for name in other_teams:
            if session.scalar(select(Team).where(Team.name == name)) is None:
                session.add(Team(name=name))
        model.bundle_name = bundle_name


def one_file_plan(ranges: int, rows_per_range: int):
    """The plan record of one input file cut into ``ranges`` ranges, and their range ids in plan order."""
    from airflow_provider_raybatch.pipeline.commit.plan_record import PlanRecord
    from airflow_provider_raybatch.pipeline.planning.input_files import InputFile
    from airflow_provider_raybatch.pipeline.planning.planner import Plan, plan_ranges

    file = InputFile(
        "/in/part-0.parquet", "part-0.parquet", 10**8, rows_per_range * ranges, (rows_per_range,) * ranges, "0" * 64
    )
    plan = Plan([file], plan_ranges([file], rows_per_range), None)
    job = {"rows_per_range": rows_per_range}
    return PlanRecord("/in", plan.describe(), job, "ui/run/score/-1"), [r.id for r in plan.ranges]


class RangeByRangeWriter:
    """A writer that commits an output's ranges one by one (the ledger's own code, under a held
    lease naming a task instance), ``interval_s`` apart, in a thread: a running task, seen from
    its bookkeeping. Its input is one file (the page says "1 file")."""

    def __init__(self, output: str, run_key: str, ranges: int, interval_s: float):
        from airflow_provider_raybatch.pipeline.commit.lease import Lease, LeaseHolder
        from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
        from benchmarks.status import ROWS_PER_RANGE

        self.ledger = OutputLedger.open(output)
        record, self.ids = one_file_plan(ranges, ROWS_PER_RANGE)
        self.ledger.write_plan(record)
        holder = LeaseHolder(run_key=run_key, try_number=1)
        self.lease = Lease(self.ledger.fs, self.ledger.lease_folder(), output, holder, timeout_s=600)
        self.lease.acquire()
        self.ledger.fence = self.lease.check
        # Its records name the lease's holder as the runner's do: the try's story counts them as its own.
        self.ledger.writer = holder.writer(time.time())
        self.interval_s = interval_s
        self.stop = threading.Event()
        self.committed = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord
        from benchmarks.status import ROWS_PER_RANGE

        for range_id in self.ids:
            if self.stop.wait(self.interval_s):
                return
            tokens_in, tokens_out = (ROWS_PER_RANGE * n for n in TOKENS_PER_ROW)
            files = (f"part-{range_id}.parquet",)
            self.ledger.record(
                [CommitRecord(range_id, files, ROWS_PER_RANGE, tokens_in=tokens_in, tokens_out=tokens_out)]
            )
            self.committed += 1

    def __enter__(self) -> RangeByRangeWriter:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.lease.release()


def entry_point_installed() -> bool:
    """Whether the installed metadata has the plugin's ``airflow.plugins`` entry point (an install
    made before it existed has not: Airflow then finds the plugin through the provider only)."""
    import importlib.metadata

    return any(ep.name == "raybatch" for ep in importlib.metadata.entry_points(group="airflow.plugins"))


def wait_for(what: str, check, timeout_s: float = 60.0, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


def repo_env(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def environment(values: dict[str, str]):
    """``values`` set in this process's environment while the block runs, then the old one back."""
    return mock.patch.dict(os.environ, values)


class Api:
    """The plugin's app in a TestClient, with a JWT per user from the configured auth manager."""

    def __init__(self):
        from airflow.api_fastapi.app import init_auth_manager
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
        from fastapi.testclient import TestClient

        from airflow_provider_raybatch.plugins.api import app

        self.client = TestClient(app)
        manager = init_auth_manager()
        self.tokens = {
            name: manager.generate_jwt(
                SimpleAuthManagerUser(username=name, role=role.split(":")[0], teams=role.split(":")[1:] or None)
            )
            for name, role in USERS.items()
        }

    def call(self, method: str, path: str, user: str | None = "alice", **kwargs):
        headers = kwargs.pop("headers", {})
        if user is not None:
            headers["Authorization"] = f"Bearer {self.tokens[user]}"
        return self.client.request(method, path, headers=headers, **kwargs)
