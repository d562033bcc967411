"""Daily predictions into one Delta Lake table: a partition per logical date, then a DuckDB query of it.

The same digits model as ``daily_batch_inference``, but its predictions land in a **table**
(``<data_root>/tables/digits_predictions``) that analysts query, not in a folder per date. Each
run adds its date's rows (partition ``ds``) exactly once, in table commits readers see whole;
a rerun of a finished date commits nothing, and a run with ``mode="overwrite"`` replaces only its
date in one commit. The second task reads the date back with DuckDB, as an analyst would.

`make demo` prepares the model and data under ``.demo/``; for another date:
``python -m airflow_provider_raybatch.examples.digits prepare --root <data_root> --date <ds>``.
Needs the ``delta`` extra (and ``duckdb`` for the query task).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Asset, Param, task

from airflow_provider_raybatch.examples.demo_input import require_demo_input
from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

DEFAULT_ROOT = os.environ.get("RAYBATCH_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo"))
#: Every run's event on this asset carries its summary (rows, table version).
TABLE = Asset(name="digits_predictions_table", uri="x-raybatch://daily_table/digits_predictions")

with DAG(
    dag_id="daily_table",
    description="Score each day's digits into one Delta table, partitioned by date",
    doc_md=__doc__,
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    default_args={
        "retries": 2,
        "retry_delay": timedelta(seconds=float(os.environ.get("RAYBATCH_RETRY_DELAY_S", "30"))),
    },
    params={
        "data_root": Param(
            DEFAULT_ROOT,
            type="string",
            pattern=r"^(/|s3://[^/{}]+)[^{}]*$",
            description="Absolute folder or s3:// prefix holding model/, input/<ds>/ and tables/",
        ),
        "mode": Param(
            "resume",
            type="string",
            enum=["resume", "overwrite"],
            description="resume: add only the rows the date's partition lacks (a rerun of a finished date commits "
            "nothing); overwrite: replace the date's rows in one commit (after changing the model or another setting, "
            "which resume refuses); other dates are never touched",
        ),
    },
    tags=["raybatch", "example"],
) as dag:
    # [START table_operator]
    predict = RayBatchInferenceOperator(
        task_id="predict_digits",
        input_path="{{ params.data_root }}/input/{{ ds }}/",
        output_path="{{ params.data_root }}/tables/digits_predictions",
        output_format="delta",
        # The default: one partition per logical date, a string column ds on every row.
        table_partition={"ds": "{{ ds }}"},
        mode="{{ params.mode }}",
        predictor="airflow_provider_raybatch.predictors.torch:TorchPredictor",
        predictor_kwargs={
            "model_class": "airflow_provider_raybatch.examples.digits:DigitsMLP",
            "weights_path": "{{ params.data_root }}/model/digits.safetensors",
            "input_column": "features",
            "output_column": "predicted_label",
            "argmax": True,
        },
        keep_columns=["id", "label"],
        id_column="id",
        rows_per_range=200,
        asset=TABLE,
        pre_execute=require_demo_input("digits", "demo"),
    )
    # [END table_operator]

    # [START duckdb_query]
    @task
    def daily_accuracy(data_root: str, ds: str | None = None) -> dict:
        """The date's rows as DuckDB reads them from the table's current version."""
        import duckdb
        from deltalake import DeltaTable

        table = DeltaTable(f"{data_root}/tables/digits_predictions")
        with duckdb.connect() as db:
            # The files of the table's current version, scanned by DuckDB where they are.
            db.register("predictions", table.to_pyarrow_dataset())
            rows, ids, accuracy = db.execute(
                "SELECT count(*), count(DISTINCT id), avg((predicted_label = label)::DOUBLE) "
                "FROM predictions WHERE ds = ?",
                [ds],
            ).fetchone()
        return {"ds": ds, "rows": rows, "distinct_ids": ids, "accuracy": accuracy, "version": table.version()}

    # [END duckdb_query]
    predict >> daily_accuracy("{{ params.data_root }}")
