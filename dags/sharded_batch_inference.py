"""The daily digits job as mapped tasks: one task instance per shard of the day's ranges.

``plan_ranges`` checks the settings and input, records the output's plan and returns up to
``shards`` groups of ranges; ``predict_shard`` is mapped over them, so each group is
its own task instance with its own retries and its own square in the grid; ``publish``
updates the Asset once, with the shards' summaries added up. Together the mapped tasks
write exactly what one ``predict_digits`` task of daily_batch_inference writes.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Asset, Param, task

from airflow_provider_raybatch.examples.demo_input import require_demo_input
from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator

DEFAULT_ROOT = os.environ.get("RAYBATCH_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo"))
#: Published once per run by ``publish``, after every shard; its extra is the combined summary.
PREDICTIONS = Asset(name="sharded_digits_predictions", uri="x-raybatch://sharded_batch_inference/predictions")
#: An absolute local path or an s3:// prefix: a relative path would depend on the worker's folder.
PATH_PATTERN = r"^(/|s3://[^/{}]+)[^{}]*$"

with DAG(
    dag_id="sharded_batch_inference",
    description="Score each day's digits with one mapped task per shard of the input",
    doc_md=__doc__,
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args={
        "retries": 2,
        # Tests shorten the delay (read when the DAG is parsed).
        "retry_delay": timedelta(seconds=float(os.environ.get("RAYBATCH_RETRY_DELAY_S", "30"))),
    },
    params={
        "data_root": Param(
            DEFAULT_ROOT,
            type="string",
            pattern=PATH_PATTERN,
            description="Absolute folder or s3:// prefix holding model/, input/<ds>/ and output-sharded/<ds>/",
        ),
        "mode": Param(
            "resume",
            type="string",
            enum=["resume", "overwrite"],
            description="resume: keep what the date's output already holds and score only the rest (a rerun of a "
            "finished date does nothing); overwrite: delete the date's output and score it all again (after changing "
            "the model or another setting, which resume refuses)",
        ),
    },
    tags=["raybatch", "example"],
) as dag:
    # The planning task and the mapped tasks take the same arguments: the plan records them.
    common = {
        "input_path": "{{ params.data_root }}/input/{{ ds }}/",
        "output_path": "{{ params.data_root }}/output-sharded/{{ ds }}/",
        "predictor": "airflow_provider_raybatch.predictors.torch:TorchPredictor",
        "predictor_kwargs": {
            "model_class": "airflow_provider_raybatch.examples.digits:DigitsMLP",
            "weights_path": "{{ params.data_root }}/model/digits.safetensors",
            "input_column": "features",
            "output_column": "predicted_label",
            "argmax": True,
        },
        "keep_columns": ["id", "label"],
        "id_column": "id",
        "rows_per_range": 100,
    }
    # The planning task applies the mode (the shards' tasks only check the plan it recorded).
    plan = RayBatchInferenceOperator(
        task_id="plan_ranges",
        plan_shards=3,
        mode="{{ params.mode }}",
        pre_execute=require_demo_input("digits", "demo"),
        **common,
    )
    predict = RayBatchInferenceOperator.partial(
        task_id="predict_shard",
        pool=os.environ.get("RAYBATCH_POOL", "raybatch_gpu"),
        max_active_tis_per_dag=2,
        map_index_template="shard {{ task.shard['index'] }}",
        **common,
    ).expand(shard=plan.output)

    @task(outlets=[PREDICTIONS])
    def publish(summaries, outlet_events=None) -> dict:
        from airflow_provider_raybatch.pipeline.summary import RunSummary

        combined = RunSummary.combine(summaries).to_dict()
        outlet_events[PREDICTIONS].extra.update(combined)
        return combined

    publish(predict.output)
