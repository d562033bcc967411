"""The plugin's FastAPI app, mounted by Airflow's api-server at :data:`URL_PREFIX`.

Pages (HTML, framed by Airflow's task instance, DAG run and DAG pages) and the JSON they read::

    GET  /ti/{dag_id}/{run_id}/{task_id}?map_index=N        a task instance's output
    GET  /run/{dag_id}/{run_id}                             a DAG run's inference tasks (a line per map index)
    GET  /dag/{dag_id}                                      a DAG's outputs by logical date
    GET  /api/ti/{dag_id}/{run_id}/{task_id}?map_index=N    the figures of the first
    POST /api/ti/{dag_id}/{run_id}/{task_id}/verify?map_index=N   run the verifier on it
    GET  /api/run/{dag_id}/{run_id}
    GET  /api/dag/{dag_id}?limit=N

Every route depends on :mod:`.access` (Airflow's authentication and the caller's permission on
the DAG); a request names a task instance, never a path (:mod:`.outputs`). Handlers are plain
functions: FastAPI runs them in its thread pool, as they read the metadata DB and the store.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select

from airflow_provider_raybatch.pipeline.errors import OutputNotFoundError
from airflow_provider_raybatch.plugins import figures
from airflow_provider_raybatch.plugins.access import can_read, can_verify
from airflow_provider_raybatch.plugins.outputs import TaskRef, inference_tasks, resolve, resolve_runs

#: Where the api-server mounts the app.
URL_PREFIX = "/raybatch"
#: Seconds between a page's refreshes while its task runs.
REFRESH_S = 3
#: DAG runs a DAG page shows at most (the newest by logical date).
DAG_PAGE_RUNS = 60
#: The header the verify button sends: a cross-site form cannot (a CSRF guard beside the cookie's SameSite).
ACTION_HEADER = "X-Raybatch-Action"

app = FastAPI(
    title="Ray batch outputs",
    description="Progress, rejects and verification of airflow-provider-raybatch outputs.",
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)


def _map_index(value: str) -> int:
    """A map index from the query (the UI leaves ``{MAP_INDEX}`` as is for a task that is not mapped)."""
    return int(value) if value.lstrip("-").isdigit() else -1


def _session():
    from airflow.utils.session import create_session

    return create_session()


def _resolve(ref: TaskRef) -> Any:
    with _session() as session:
        try:
            return resolve(ref, session)
        except OutputNotFoundError as e:
            raise HTTPException(404, str(e)) from None


# --- JSON ------------------------------------------------------------------------------------


@app.get("/api/ti/{dag_id}/{run_id}/{task_id}", dependencies=[can_read])
def ti_figures(dag_id: str, run_id: str, task_id: str, map_index: str = Query("-1")) -> dict[str, Any]:
    """A task instance's output: status (with the input plan), rejects sample, lease holders."""
    return figures.output_figures(_resolve(TaskRef(dag_id, run_id, task_id, _map_index(map_index))))


@app.post("/api/ti/{dag_id}/{run_id}/{task_id}/verify", dependencies=[can_verify])
def ti_verify(
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: str = Query("-1"),
    action: str | None = Header(None, alias=ACTION_HEADER),
) -> dict[str, Any]:
    """Run the verifier on a task instance's output, in a worker thread with a time limit."""
    if action != "verify":
        raise HTTPException(400, f"send the header {ACTION_HEADER}: verify")
    return figures.verify(_resolve(TaskRef(dag_id, run_id, task_id, _map_index(map_index))))


@app.get("/api/run/{dag_id}/{run_id}", dependencies=[can_read])
def run_figures(dag_id: str, run_id: str) -> dict[str, Any]:
    """A DAG run's inference task instances, a line each (a mapped task: a line per map index)."""
    with _session() as session:
        try:
            outputs = resolve_runs(dag_id, [run_id], session)
        except OutputNotFoundError as e:
            raise HTTPException(404, str(e)) from None
    return {"dag_id": dag_id, "run_id": run_id, "lines": figures.summary_lines(outputs)}


@app.get("/api/dag/{dag_id}", dependencies=[can_read])
def dag_figures(dag_id: str, limit: int = Query(DAG_PAGE_RUNS, ge=1, le=500)) -> dict[str, Any]:
    """A DAG's inference tasks' outputs by logical date (newest first): a cell per run and task."""
    from airflow.models.dagrun import DagRun

    with _session() as session:
        try:
            tasks = list(inference_tasks(dag_id, session))
        except OutputNotFoundError as e:
            raise HTTPException(404, str(e)) from None
        runs = session.execute(
            select(DagRun.run_id, DagRun.logical_date, DagRun.state)
            .where(DagRun.dag_id == dag_id)
            .order_by(DagRun.logical_date.desc(), DagRun.run_after.desc())
            .limit(limit)
        ).all()
        outputs = resolve_runs(dag_id, [r.run_id for r in runs], session)
    lines = figures.summary_lines(_one_per_task(outputs))
    cells: dict[str, dict[str, Any]] = {}
    for line in lines:
        cells.setdefault(line["task"]["run_id"], {})[line["task"]["task_id"]] = line
    return {
        "dag_id": dag_id,
        "tasks": tasks,
        "runs": [
            {
                "run_id": r.run_id,
                "logical_date": r.logical_date.isoformat() if r.logical_date else None,
                "state": str(r.state) if r.state else None,
                "cells": cells.get(r.run_id, {}),
            }
            for r in runs
        ],
    }


def _one_per_task(outputs: list[Any]) -> list[Any]:
    """A mapped task's instances share one output: its first map index stands for it on a DAG page
    (the figures are the whole output's)."""
    first: dict[tuple[str, str], Any] = {}
    for output in outputs:
        first.setdefault((output.ref.run_id, output.ref.task_id), output)
    return list(first.values())


# --- pages -----------------------------------------------------------------------------------


@cache
def _asset(name: str) -> str:
    return resources.files("airflow_provider_raybatch.plugins").joinpath("static", name).read_text()


def _page(request: Request, title: str, config: dict[str, Any]) -> HTMLResponse:
    """A self-contained page: its CSS and script inline, its configuration as JSON (``<`` escaped)."""
    config = {**config, "base": request.scope.get("root_path", "").rstrip("/"), "refresh_s": REFRESH_S}
    payload = json.dumps(config).replace("<", "\\u003c")
    html = (
        '<!doctype html><html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">'
        f"<title>{_escape(title)}</title><style>{_asset('view.css')}</style></head><body>"
        '<div id="root"><p class="muted">Loading…</p></div>'
        f'<script type="application/json" id="raybatch-config">{payload}</script>'
        f"<script>{_asset('view.js')}</script></body></html>"
    )
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@app.get("/ti/{dag_id}/{run_id}/{task_id}", response_class=HTMLResponse, dependencies=[can_read])
def ti_page(request: Request, dag_id: str, run_id: str, task_id: str, map_index: str = Query("-1")) -> HTMLResponse:
    """The task instance page's view."""
    task = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "map_index": _map_index(map_index)}
    return _page(request, f"{task_id} · Ray batch output", {"kind": "ti", "task": task})


@app.get("/run/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=[can_read])
def run_page(request: Request, dag_id: str, run_id: str) -> HTMLResponse:
    """The DAG run page's view."""
    return _page(request, f"{run_id} · Ray batch outputs", {"kind": "run", "dag_id": dag_id, "run_id": run_id})


@app.get("/dag/{dag_id}", response_class=HTMLResponse, dependencies=[can_read])
def dag_page(request: Request, dag_id: str) -> HTMLResponse:
    """The DAG page's view."""
    return _page(request, f"{dag_id} · Ray batch outputs", {"kind": "dag", "dag_id": dag_id})
