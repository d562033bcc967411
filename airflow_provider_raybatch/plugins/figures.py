"""What the plugin's endpoints answer, from an output's bookkeeping only (no data file but the
committed rejects files a sample is read from): a task instance's output, a DAG run's inference
tasks, a DAG's outputs by logical date, and the verifier's verdict.

Each reading goes through :mod:`airflow_provider_raybatch.pipeline.status`, which imports neither
Ray nor Airflow; the output's location and connections come from :mod:`.outputs`.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import replace
from typing import Any

from airflow_provider_raybatch.pipeline.columns import COUNT_KEYS
from airflow_provider_raybatch.pipeline.errors import RayBatchError
from airflow_provider_raybatch.plugins.outputs import ResolvedOutput, output_ref

#: Rejected rows sent to the page at most.
REJECTS_SAMPLE = 20
#: Seconds a verify may take before the endpoint answers without its verdict.
VERIFY_TIMEOUT_S = 60.0
#: Outputs of a DAG page read side by side (remote stores answer slowly, each output alone is quick).
READ_THREADS = 8

_verifier = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="raybatch-verify")


def output_figures(
    output: ResolvedOutput, *, detail: bool = True, rejects: bool = True, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A task instance's output: what its current try did (``try``), its status (per writer for a
    table), a sample of its rejects, and, for a mapped task instance, its own shard.

    :param output: the resolved output.
    :param detail: with the input plan per file and the committed ranges' picture.
    :param rejects: with a sample of rejected rows (read from committed rejects files).
    :param options: the store's fsspec options (default: resolved from the task's connections).
    """
    from airflow_provider_raybatch.pipeline.status import OutputNotFoundError, read_output

    started = time.perf_counter()
    document: dict[str, Any] = {"task": output.public(), "found": False, "outputs": [], "try": try_figures(output, [])}
    if output.path is None:
        document["message"] = (
            "the output's path is not known for this task instance: it has not run, or Airflow no longer "
            "keeps its rendered fields and the DAG's output_path is a template"
        )
        return document
    try:
        ref = output_ref(output)
        if options is not None:
            ref = replace(ref, storage_options=options)
        statuses = read_output(ref, detail=detail)
    except OutputNotFoundError as e:
        document["message"] = f"no output there yet: {e}"
        return document
    except RayBatchError as e:  # a connection that does not resolve
        document["message"] = str(e)
        return document
    document["found"] = True
    document["try"] = try_figures(output, statuses)
    for status in statuses:
        entry = status.to_dict()
        entry.pop("rejects_files", None)
        if rejects and status.rows_rejected:
            entry["rejects"] = _rejects(status, ref.storage_options)
        if output.ref.map_index >= 0:
            entry["shard"] = _own_shard(entry, output)
        document["outputs"].append(entry)
    document["read_s"] = round(time.perf_counter() - started, 4)
    return document


#: Airflow's states of a try that has not started, and of one under way.
_WAITING = {"scheduled", "queued", "up_for_reschedule"}
_UNDER_WAY = {"running", "deferred", "restarting"}


def try_figures(output: ResolvedOutput, statuses: list[Any], now: float | None = None) -> dict[str, Any] | None:
    """What the task instance's current try did (None: it never ran): the record it pushed at its
    end (:mod:`..operators.try_story`), else, for a try under way or killed, what the commit
    records that name it say. Its figures are the summary's (:mod:`..pipeline.summary`).

    :param statuses: the output's statuses (their ``tries``: who committed what).
    """
    ref = output.ref
    if output.state is None or not output.try_number:
        return None
    now = time.time() if now is None else now
    mine = [
        t
        for s in statuses
        for t in s.tries
        if t.is_task_try(ref.dag_id, ref.run_id, ref.task_id, ref.map_index, output.try_number)
    ]
    started = output.started_at
    # Ranges committed before this try began, by whom (a mapped run's other shards commit meanwhile: not counted).
    earlier = [t for s in statuses for t in s.tries if t not in mine and started and (t.last_commit_at or 0) < started]
    rows = sum(t.rows for t in mine)
    spans = [t.span for t in mine if t.span is not None]
    span = sum(e - s for s, e in spans)
    figures: dict[str, Any] = {
        "try_number": output.try_number,
        "state": output.state,
        "outcome": _outcome(output.state, bool(mine)),
        "message": None,
        "ranges_committed": sum(t.ranges for t in mine),
        "rows_committed": rows,
        "rows_rejected": sum(t.rows_rejected for t in mine),
        "ranges_skipped": sum(t.ranges for t in earlier),
        "rows_skipped": sum(t.rows for t in earlier),
        "skipped_by": [
            {"writer": t.writer["describe"] if t.writer else "unknown", "ranges": t.ranges, "rows": t.rows}
            for t in earlier
        ],
        "started_at": started,
        "ended_at": None,
        "wall_s": round(now - started, 3) if started and output.state in _UNDER_WAY else None,
        "commit_rows_per_s": round(rows / span, 1) if span else None,
        "scoring_rows_per_s": None,
    }
    story = output.story
    if story and story.get("try_number") == output.try_number:
        # Its own figures where it recorded them (a failed try's counts are the records').
        figures.update({k: v for k, v in story.items() if k in figures and k != "state"})
    elif figures["outcome"] == "failed":
        figures["message"] = "the try ended without recording its outcome (killed, or timed out)"
    if figures["outcome"] == "refused":  # it never got to read what was committed
        figures.update(ranges_skipped=0, rows_skipped=0, skipped_by=[])
    return figures


def _outcome(state: str, committed: bool) -> str:
    """A try's outcome as its task instance's state tells it, where the try recorded none."""
    if state in _WAITING:
        return "queued"
    if state in _UNDER_WAY:
        return "running"
    if state == "success":
        return "wrote" if committed else "nothing to do"
    return "failed"


def _rejects(status: Any, options: dict[str, Any] | None) -> dict[str, Any]:
    """Counts from the status, and the first rows of the committed rejects files it found (the
    commit records are not read again)."""
    from airflow_provider_raybatch.pipeline.status import RejectsSample, sample_rejects

    files = status.rejects_files or []
    rows = sample_rejects(status.path, files, options, REJECTS_SAMPLE)
    sample = RejectsSample(status.path, status.rows_rejected, status.engine_errors, rows, files).to_dict()
    sample["rows"] = [{k: _short(v) for k, v in row.items()} for row in sample["rows"]]
    return sample


def _short(value: Any, width: int = 200) -> Any:
    if isinstance(value, str | list | dict) and len(str(value)) > width:
        return str(value)[: width - 3] + "..."
    return value


def _own_shard(entry: dict[str, Any], output: ResolvedOutput) -> dict[str, Any] | None:
    """This task instance's shard: the one planned at its map index (listed before its task
    starts), else the one whose lease it took (a plan recorded by an earlier release)."""
    ref = output.ref
    for shard in entry["shards"]:
        if shard.get("index") == ref.map_index:
            return shard
    for shard in entry["shards"]:
        lease = shard.get("lease") or {}
        if (lease.get("dag_id"), lease.get("run_id"), lease.get("task_id"), lease.get("map_index")) == (
            ref.dag_id,
            ref.run_id,
            ref.task_id,
            ref.map_index,
        ):
            return shard
    return None


def summary_line(output: ResolvedOutput) -> dict[str, Any]:
    """One line of a DAG run's or a DAG's page: the task instance's state and its output's progress
    (no plan detail, no rejects sample)."""
    from airflow_provider_raybatch.pipeline.status import read_output

    line: dict[str, Any] = {"task": output.public(), "found": False}
    if output.path is None:
        return line
    try:
        statuses = read_output(output_ref(output))
    except RayBatchError as e:
        line["message"] = str(e)
        return line
    rows_planned = sum(s.rows_planned for s in statuses)
    rows_done = sum(s.rows_done for s in statuses)
    state = combined_state(statuses)
    line.update(
        found=True,
        state=state,
        rows_planned=rows_planned,
        rows_done=rows_done,
        fraction_done=round(rows_done / rows_planned, 6) if rows_planned else float(bool(statuses) and state == "done"),
        rows_rejected=sum(s.rows_rejected for s in statuses),
        **count_sums(statuses),
        ranges_planned=sum(s.ranges_planned for s in statuses),
        ranges_committed=sum(s.ranges_committed for s in statuses),
        commit_rows_per_s=sum(s.commit_rows_per_s or 0 for s in statuses) or None,
        eta_s=max((s.eta_s for s in statuses if s.eta_s is not None), default=None),
    )
    if output.ref.map_index >= 0 and statuses:
        line["shard"] = _own_shard(statuses[0].to_dict(), output)
    return line


def combined_state(statuses: list[Any]) -> str:
    """One state for an output's statuses (a table's writers): the first of running, partial, not
    started found, else done."""
    states = {s.state for s in statuses}
    return next((s for s in ("running", "partial", "not started") if s in states), "done")


def count_sums(statuses: list[Any]) -> dict[str, int]:
    """What a model counted in the statuses (tokens, truncated rows), added up by key; a key only
    where some status counted it."""
    sums = {}
    for key in COUNT_KEYS:
        counted = [getattr(s, key) for s in statuses if getattr(s, key) is not None]
        if counted:
            sums[key] = sum(counted)
    return sums


def summary_lines(outputs: list[ResolvedOutput]) -> list[dict[str, Any]]:
    """:func:`summary_line` of each output, read side by side, in the order given."""
    if len(outputs) <= 1:
        return [summary_line(o) for o in outputs]
    with concurrent.futures.ThreadPoolExecutor(min(READ_THREADS, len(outputs))) as pool:
        return list(pool.map(summary_line, outputs))


def verify(output: ResolvedOutput, timeout_s: float = VERIFY_TIMEOUT_S) -> dict[str, Any]:
    """Run the verifier on ``output`` in a worker thread; its faults, that the output is not
    finished yet (``unfinished``: no verdict, what is done so far in ``message``), or that it ran
    out of time.

    :param output: the resolved output (a Parquet folder, or a table's partition).
    :param timeout_s: seconds to wait for the verdict (the check goes on in its thread, its result unused).
    """
    if output.path is None:
        return {"ok": False, "faults": [], "message": "the output's path is not known for this task instance"}
    started = time.perf_counter()
    future = _verifier.submit(_verify, output)
    try:
        answer = future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        return {"ok": None, "faults": [], "message": f"the verifier did not finish within {timeout_s:g} s"}
    except RayBatchError as e:
        return {"ok": False, "faults": [], "message": str(e)}
    return {**answer, "seconds": round(time.perf_counter() - started, 3)}


def _verify(output: ResolvedOutput) -> dict[str, Any]:
    """The verifier's verdict on a finished output; on an unfinished one, no verdict (its missing
    ranges are no fault yet) and none of the verifier's reading of every file."""
    from airflow_provider_raybatch.pipeline.status import read_output, verify

    not_done = {"running": "running", "partial": "stopped part-way, no writer running", "not started": "not started"}
    ref = output_ref(output)
    statuses = read_output(ref)
    state = combined_state(statuses)
    if state != "done":
        committed = sum(s.ranges_committed for s in statuses)
        planned = sum(s.ranges_planned for s in statuses)
        return {
            "ok": None,
            "unfinished": True,
            "faults": [],
            "message": f"not done yet ({not_done[state]}): {committed:,} of {planned:,} planned ranges "
            "committed; the verifier checks a finished output",
        }
    faults = verify(ref)
    return {"ok": not faults, "faults": faults}
