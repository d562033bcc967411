"""A mapped run seen by the UI plugin: the DAG run's page has a line per shard (map index),
each with the rows its own shard committed (its lease holder is that task instance), and the
planning task's line; a mapped task instance's view names its shard."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.conftest import run_dag
from tests.support.data import write_input
from tests.support.ui_outputs import Api, auth_environment, environment, give_dag_to_team

pytestmark = pytest.mark.usefixtures("airflow_db", "ray_local")

DAY = datetime(2026, 11, 23, tzinfo=UTC)


def test_a_mapped_runs_page_has_a_line_per_shard(tmp_path, tmp_path_factory):
    from airflow.sdk import DAG

    from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

    write_input(tmp_path / "in", [200, 200])
    common = {
        "predictor": "tests.support.ui_outputs:reject_some",
        "input_path": str(tmp_path / "in"),
        "output_path": str(tmp_path / "out") + "/{{ ds }}",
        "id_column": "id",
        "rows_per_range": 100,
        "max_error_fraction": 1,
    }
    with DAG("ui_mapped", schedule=None, start_date=DAY) as dag:
        plan = RayBatchInferenceOperator(task_id="plan", plan_shards=2, **common)
        RayBatchInferenceOperator.partial(task_id="score", **common).expand(shard=plan.output)
    run = run_dag(dag, DAY)
    with environment(auth_environment(tmp_path_factory.mktemp("ui-mapped-home"))):
        give_dag_to_team("ui_mapped", "team_a")  # the auth manager's teams must exist
        api = Api()
        lines = api.call("GET", f"/api/run/ui_mapped/{run.run_id}", user="admin").json()["lines"]
        mapped = [line for line in lines if line["task"]["task_id"] == "score"]
        assert [line["task"]["map_index"] for line in mapped] == [0, 1]
        assert all(line["state"] == "done" and line["fraction_done"] == 1.0 for line in lines), lines
        # Each map index's own shard: its lease holder is that task instance; together, every row.
        shards = [line["shard"] for line in mapped]
        assert all(p is not None and p["lease"]["map_index"] == i for i, p in enumerate(shards)), shards
        assert [(p["index"], p["rows_planned"]) for p in shards] == [(0, 200), (1, 200)]
        assert sum(p["rows_committed"] for p in shards) == 400 and all(p["ranges_committed"] == 2 for p in shards)
        view = api.call("GET", f"/api/ti/ui_mapped/{run.run_id}/score", params={"map_index": 1}, user="admin").json()
        assert view["task"]["map_index"] == 1 and view["outputs"][0]["shard"]["key"] == shards[1]["key"]
        cell = api.call("GET", "/api/dag/ui_mapped", user="admin").json()["runs"][0]["cells"]["score"]
        assert cell["state"] == "done" and cell["task"]["map_index"] == 0
