"""Downstream of daily_batch_inference: runs when its predictions Asset is updated.

Each asset event carries the producing task's summary in its ``extra`` (rows, ranges, timing
and the rendered ``output_path``), so this DAG knows which folder to read without templating
the producer's paths again.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import Asset, dag, get_current_context, task

# The same Asset as in daily_batch_inference.py (an Asset is identified by its name and URI).
PREDICTIONS = Asset(name="daily_digits_predictions", uri="x-raybatch://daily_batch_inference/predictions")


@dag(
    dag_id="digits_accuracy_report",
    description="Accuracy of each new day of digit predictions",
    doc_md=__doc__,
    schedule=[PREDICTIONS],
    start_date=datetime(2026, 11, 1),
    catchup=False,
    default_args={
        "retries": 2,
        # Tests shorten the delay (read when the DAG is parsed).
        "retry_delay": timedelta(seconds=float(os.environ.get("RAYBATCH_RETRY_DELAY_S", "30"))),
    },
    tags=["raybatch", "example"],
)
def digits_accuracy_report():
    @task(inlets=[PREDICTIONS])
    def report() -> dict:
        context = get_current_context()
        events = [e for events in context["triggering_asset_events"].values() for e in events]
        if not events:  # triggered by hand: report on the latest predictions
            events = list(context["inlet_events"][PREDICTIONS])[-1:]
        if not events:
            raise ValueError("no predictions yet: run daily_batch_inference first")
        summary = dict(events[-1].extra)
        from airflow_provider_raybatch.examples.digits import accuracy

        rows, correct = accuracy(summary["output_path"])
        print(f"{summary['output_path']}: {rows} rows, accuracy {correct:.3f}; producer summary: {summary}")
        return {"output_path": summary["output_path"], "rows": rows, "accuracy": correct, "producer": summary}

    report()


report_dag = digits_accuracy_report()
