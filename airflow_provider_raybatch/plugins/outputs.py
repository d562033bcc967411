"""A task instance to its output: where the server reads, and with which connections.

A request names a task instance (``dag_id``, ``run_id``, ``task_id``, ``map_index``), never a
path. The output's arguments are read from the rendered-template-fields record Airflow stored when
the task instance ran; where that record is gone (Airflow keeps
``[core] max_num_rendered_ti_fields_per_task`` per task) or absent, from the serialized DAG's
values, if they hold no template (a template is not rendered here: that needs the DAG's code).
The connection ids name Airflow connections that the server resolves itself
(:mod:`~airflow_provider_raybatch.hooks.object_stores`); their credentials never leave it.

Which tasks are inference tasks is read from the serialized DAG (the operator's class and module,
its template fields and its Ray job link), without importing the DAG's code.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_provider_raybatch.pipeline.errors import OutputNotFoundError
from airflow_provider_raybatch.pipeline.output_ref import OutputRef

#: This provider's operators (their serialized ``task_type``) that write an output.
OPERATOR_CLASSES = frozenset(
    {
        "RayPipelineOperator",
        "RayBatchInferenceOperator",
        "ChatOperator",
        "LLMBatchInferenceOperator",
        "VLMCaptionOperator",
        "EmbeddingOperator",
    }
)
OPERATORS_MODULE = "airflow_provider_raybatch.operators."
#: The operator-link name every operator of this provider carries (a subclass's too).
RAY_JOB_LINK = "Ray job"
#: The arguments that locate an output and name its connections.
OUTPUT_FIELDS = (
    "output_path",
    "output_format",
    "table_partition",
    "table",
    "aws_conn_id",
    "gcp_conn_id",
    "azure_conn_id",
    "iceberg_conn_id",
)
#: The connections that hold the stores' credentials (the Iceberg catalog's is apart).
STORE_CONN_FIELDS = ("aws_conn_id", "gcp_conn_id", "azure_conn_id")


@dataclass(frozen=True)
class TaskRef:
    """A task instance, as a request names it (``map_index`` -1: not mapped)."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1


@dataclass(frozen=True)
class ResolvedOutput:
    """Where a task instance's output is, and how to read it.

    :param path: the output folder, or a table output's root (shown to the user: a location, no secret).
    :param output_format: ``parquet``, ``delta`` or ``iceberg``.
    :param partition: a table output's partition (column -> value); None for a Parquet folder.
    :param table: an Iceberg output's table, ``namespace.table``.
    :param source: ``rendered`` (the task instance's rendered fields) or ``dag`` (the serialized DAG).
    :param conn_ids: the store and Iceberg catalog connections (server side only: never answered).
    :param state: the task instance's state (None: never run); ``try_number`` its try.
    :param mapped: the task is mapped (its instances write shards of one output).
    :param started_at: when its try started (Unix time; None: not yet).
    :param story: what its try recorded it did (:mod:`..operators.try_story`; None: nothing recorded,
        or not read). Read for a single task instance's page only.
    """

    ref: TaskRef
    path: str | None
    output_format: str
    partition: dict[str, str] | None
    table: str | None
    source: str
    state: str | None
    try_number: int | None
    mapped: bool
    conn_ids: dict[str, str | None] = field(default_factory=dict, repr=False)
    started_at: float | None = None
    story: dict[str, Any] | None = None

    def public(self) -> dict[str, Any]:
        """What the browser may see (no connection id: they name credentials)."""
        return {
            "dag_id": self.ref.dag_id,
            "run_id": self.ref.run_id,
            "task_id": self.ref.task_id,
            "map_index": self.ref.map_index,
            "path": self.path,
            "format": self.output_format,
            "partition": self.partition,
            "source": self.source,
            "state": self.state,
            "try_number": self.try_number,
            "mapped": self.mapped,
        }


def serialized_tasks(dag_id: str, session: Session) -> dict[str, dict[str, Any]]:
    """The DAG's tasks as its newest serialization holds them (task id -> fields)."""
    from airflow.models.serialized_dag import SerializedDagModel

    model = session.scalar(
        select(SerializedDagModel)
        .where(SerializedDagModel.dag_id == dag_id)
        .order_by(SerializedDagModel.created_at.desc())
        .limit(1)
    )
    if model is None or model.data is None:
        raise OutputNotFoundError(f"no DAG {dag_id!r}")
    tasks = model.data.get("dag", {}).get("tasks", [])
    fields = [t.get("__var", t) for t in tasks]
    return {f["task_id"]: f for f in fields if "task_id" in f}


def is_inference_task(task: dict[str, Any]) -> bool:
    """An operator of this provider, or a subclass (one carries its Ray job link and output fields)."""
    if task.get("_task_module", "").startswith(OPERATORS_MODULE) and task.get("task_type") in OPERATOR_CLASSES:
        return True
    links = task.get("_operator_extra_links") or {}
    return RAY_JOB_LINK in links and {"input_path", "output_path"} <= set(task.get("template_fields", ()))


def inference_tasks(dag_id: str, session: Session) -> dict[str, dict[str, Any]]:
    """The DAG's inference tasks, in the serialization's order."""
    return {task_id: task for task_id, task in serialized_tasks(dag_id, session).items() if is_inference_task(task)}


def resolve(ref: TaskRef, session: Session) -> ResolvedOutput:
    """The output of the task instance ``ref``.

    :param ref: the task instance.
    :param session: a metadata DB session.
    :raises OutputNotFoundError: no such DAG or task, or a task that is not an inference task.
    """
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF
    from airflow.models.taskinstance import TaskInstance as TI

    task = inference_tasks(ref.dag_id, session).get(ref.task_id)
    if task is None:
        raise OutputNotFoundError(f"{ref.dag_id}.{ref.task_id} is no inference task of this provider")
    ti = session.execute(
        select(TI.state, TI.try_number, TI.start_date).where(
            TI.dag_id == ref.dag_id, TI.run_id == ref.run_id, TI.task_id == ref.task_id, TI.map_index == ref.map_index
        )
    ).first()
    rendered = session.scalar(
        select(RTIF.rendered_fields).where(
            RTIF.dag_id == ref.dag_id,
            RTIF.run_id == ref.run_id,
            RTIF.task_id == ref.task_id,
            RTIF.map_index == ref.map_index,
        )
    )
    output = _output(ref, task, rendered, ti)
    if ti is None:
        return output
    return replace(
        output,
        started_at=ti.start_date.timestamp() if ti.start_date else None,
        story=try_story(ref, session),
    )


def try_story(ref: TaskRef, session: Session) -> dict[str, Any] | None:
    """The record the task instance's current try pushed at its end (Airflow clears a task
    instance's XComs when its next try starts); None without one."""
    from airflow.models.xcom import XComModel

    from airflow_provider_raybatch.operators.try_story import TRY_XCOM_KEY

    row = session.scalar(
        select(XComModel).where(
            XComModel.dag_id == ref.dag_id,
            XComModel.run_id == ref.run_id,
            XComModel.task_id == ref.task_id,
            XComModel.map_index == ref.map_index,
            XComModel.key == TRY_XCOM_KEY,
        )
    )
    value = None if row is None else XComModel.deserialize_value(row)
    return value if isinstance(value, dict) else None


def _output(ref: TaskRef, task: dict[str, Any], rendered: dict[str, Any] | None, ti: Any) -> ResolvedOutput:
    values = {name: _value(task.get(name)) for name in OUTPUT_FIELDS}
    source = "dag"
    if rendered:
        source = "rendered"
        values.update({name: _value(rendered[name]) for name in OUTPUT_FIELDS if name in rendered})
    output_format = values["output_format"] or "parquet"
    path = values["output_path"]
    if not isinstance(path, str) or (source == "dag" and _templated(path)):
        path = None  # a template not rendered for this task instance: not guessed
    partition = values["table_partition"] if output_format != "parquet" else None
    if isinstance(partition, dict):
        partition = {str(k): str(v) for k, v in partition.items()}
        if source == "dag" and any(_templated(v) for v in partition.values()):
            path = None
    elif output_format != "parquet":
        partition = {}
    conn_ids = {
        name: values[name] if isinstance(values[name], str) else None
        for name in (*STORE_CONN_FIELDS, "iceberg_conn_id")
    }
    return ResolvedOutput(
        ref=ref,
        path=path,
        output_format=str(output_format),
        partition=partition,
        table=values["table"] if isinstance(values["table"], str) else None,
        source=source,
        state=None if ti is None or ti.state is None else str(ti.state),
        try_number=None if ti is None else ti.try_number,
        mapped=bool(task.get("_is_mapped") or task.get("_needs_expansion") or task.get("expand_input")),
        conn_ids=conn_ids,
    )


def _value(value: Any) -> Any:
    """A rendered or serialized value: a dict stored as its text is read back; ``"None"`` is None."""
    if isinstance(value, dict) and "__var" in value:
        value = value["__var"]
    if isinstance(value, str):
        text = value.strip()
        if text in ("", "None"):
            return None
        if text.startswith("{"):
            for parse in (json.loads, ast.literal_eval):
                try:
                    return parse(text)
                except (ValueError, SyntaxError):
                    continue
    return value


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def output_ref(output: ResolvedOutput) -> OutputRef:
    """The output ``output`` locates, with its connections' credentials (none: the server's
    environment's) and an Iceberg output's catalog.

    Resolved here, on the server; never answered to a browser.

    :raises ConfigError: a connection that does not resolve.
    """
    from airflow_provider_raybatch.hooks.output_refs import resolve_output

    assert output.path is not None
    return resolve_output(output.path, output.output_format, output.partition, output.table, **output.conn_ids)


def resolve_runs(dag_id: str, run_ids: list[str], session: Session) -> list[ResolvedOutput]:
    """Every inference task instance of the DAG runs ``run_ids`` (three queries, whatever their number).

    A task without a task instance in a run (not created yet) is one line of state None; a mapped
    task is a line per map index.

    :param dag_id: the DAG.
    :param run_ids: its runs.
    :param session: a metadata DB session.
    :raises OutputNotFoundError: no such DAG.
    """
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF
    from airflow.models.taskinstance import TaskInstance as TI

    tasks = inference_tasks(dag_id, session)
    if not tasks or not run_ids:
        return []
    tis = session.execute(
        select(TI.run_id, TI.task_id, TI.map_index, TI.state, TI.try_number).where(
            TI.dag_id == dag_id, TI.run_id.in_(run_ids), TI.task_id.in_(list(tasks))
        )
    ).all()
    rendered = {
        (r.run_id, r.task_id, r.map_index): r.rendered_fields
        for r in session.execute(
            select(RTIF.run_id, RTIF.task_id, RTIF.map_index, RTIF.rendered_fields).where(
                RTIF.dag_id == dag_id, RTIF.run_id.in_(run_ids), RTIF.task_id.in_(list(tasks))
            )
        )
    }
    by_key = {(ti.run_id, ti.task_id): [] for ti in tis}
    for ti in tis:
        by_key[(ti.run_id, ti.task_id)].append(ti)
    outputs = []
    for run_id in run_ids:
        for task_id, task in tasks.items():
            instances = sorted(by_key.get((run_id, task_id), []), key=lambda ti: ti.map_index)
            if not instances:
                outputs.append(_output(TaskRef(dag_id, run_id, task_id), task, None, None))
            for ti in instances:
                ref = TaskRef(dag_id, run_id, task_id, ti.map_index)
                outputs.append(_output(ref, task, rendered.get((run_id, task_id, ti.map_index)), ti))
    return outputs
