"""docker/compose.yaml for real: the project's images, the whole stack, the example DAG through
the Airflow API, its output exactly once on the S3 store; then the same DAG deferred.

Needs a Docker engine (installed with apt-get and started when missing and root, see
engine.py); skipped, saying why, where there is none. Cold (no image yet) the session's first
test also builds the stand-in bases and the images (see images.py and the README for timings).
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support.docker.stack import DEMO_DATE, ComposeStack

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(5400)]

DAG_ID = "daily_batch_inference"
ROOT = "raybatch/demo"


def ids_in(stack: ComposeStack, folder: str) -> list[int]:
    """Every id in the Parquet files directly under folder (bookkeeping under _raybatch/ excluded)."""
    s3 = stack.s3()
    files = sorted(p for p in s3.ls(folder, refresh=True) if p.endswith(".parquet"))
    assert files, f"no Parquet under s3://{folder}"
    ids: list[int] = []
    for path in files:
        with s3.open(path, "rb") as f:
            ids += pq.read_table(io.BytesIO(f.read()), columns=["id"]).column("id").to_pylist()
    return ids


def run_and_check(stack: ComposeStack, date: str, run_id: str) -> set[str]:
    state, seen = stack.run_dag(DAG_ID, run_id, f"{date}T00:00:00+00:00")
    assert state == "success", f"{run_id}: {state} (task states {seen})\n{stack.logs('airflow-scheduler')}"
    expected = ids_in(stack, f"{ROOT}/input/{date}")
    written = ids_in(stack, f"{ROOT}/output/{date}")
    assert len(written) == len(set(written)), "a row was written twice"
    assert sorted(written) == sorted(expected), "rows missing or foreign rows in the output"
    return seen


def test_the_example_dag_runs_on_the_stack(compose_stack):
    stack = compose_stack
    dag = stack.wait_for_dag(DAG_ID)
    assert dag["is_paused"], "DAGs start paused (AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION)"
    stack.api("PATCH", f"/dags/{DAG_ID}", {"is_paused": False})
    pools = {p["name"]: p["slots"] for p in stack.api("GET", "/pools")["pools"]}
    assert pools.get("raybatch_gpu") == 2, pools
    seen = run_and_check(stack, DEMO_DATE, "compose-blocking")
    assert "deferred" not in seen


def test_the_same_run_deferred_in_the_triggerer(compose_stack):
    stack = compose_stack
    from airflow_provider_raybatch.examples import digits

    # Before the demo's date: unpausing the @daily DAG makes the scheduler start a run for "now"
    # (which fails for lack of input and is left alone), never for these dates.
    date = "2026-11-20"
    with tempfile.TemporaryDirectory() as tmp:
        digits.write_input(Path(tmp))
        s3 = stack.s3()
        for path in sorted(Path(tmp).glob("*")):
            s3.put_file(str(path), f"{ROOT}/input/{date}/{path.name}")
    # Operators that can defer do so: the scheduler (LocalExecutor: the task runs there) is
    # recreated with the setting.
    stack.set(AIRFLOW_DEFAULT_DEFERRABLE="true")
    stack.compose("up", "--detach", "--no-build", "--no-deps", "airflow-scheduler", "airflow-dag-processor")
    stack.wait_healthy(["airflow-scheduler", "airflow-dag-processor"])
    stack.api("PATCH", f"/dags/{DAG_ID}", {"is_paused": False})
    seen = run_and_check(stack, date, "compose-deferred")
    assert "deferred" in seen, f"the task never deferred (states {seen})"
