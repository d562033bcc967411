"""What a try of an inference task did, for the UI plugin: pushed to XCom at the end of every try
(:data:`TRY_XCOM_KEY`), success or failure. Airflow clears a task instance's XComs when its next
try starts, so the record always describes the current try; one whose try was killed never gets
one, and the plugin tells its story from the commit records that name it.

Outcomes: ``wrote`` (it committed ranges), ``nothing to do`` (every range was committed before
it), ``refused`` (the output was refused to it: another writer holds it, or its settings do not
match the output's), ``failed`` (anything else; retried where a retry can help).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.pipeline.errors import ConfigError, OutputBusyError, provider_error_in
from airflow_provider_raybatch.version_compat import redact

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_raybatch.pipeline.summary import RunSummary

log = logging.getLogger(__name__)

#: The XCom key of a try's record.
TRY_XCOM_KEY = "raybatch_try"
#: Errors that refuse the output to the try rather than fail it part-way.
REFUSALS = (OutputBusyError, ConfigError)


def succeeded(try_number: int, summary: RunSummary, ended_at: float) -> dict[str, Any]:
    """The record of a try that returned ``summary`` (its figures: see :mod:`..pipeline.summary`)."""
    return {
        "try_number": try_number,
        "outcome": "wrote" if summary.ranges_done else "nothing to do",
        "message": None,
        "ranges_committed": summary.ranges_done,
        "rows_committed": summary.rows_processed,
        "rows_rejected": summary.rows_rejected_processed,
        "ranges_skipped": summary.ranges_skipped,
        "rows_skipped": summary.rows_skipped,
        "skipped_by": summary.skipped_by or [],
        "started_at": round(ended_at - summary.seconds, 3),
        "ended_at": round(ended_at, 3),
        "wall_s": round(summary.seconds, 3),
        "commit_rows_per_s": summary.commit_rows_per_s,
        "scoring_rows_per_s": summary.scoring_rows_per_s,
    }


def ended_with(try_number: int, error: Exception, started_at: float | None, ended_at: float) -> dict[str, Any]:
    """The record of a try that raised ``error``: refused or failed, and why (secrets masked). What it
    committed before is in the commit records that name it."""
    cause = provider_error_in(error)
    return {
        "try_number": try_number,
        "outcome": "refused" if isinstance(cause, REFUSALS) else "failed",
        "message": redact(str(cause if cause is not None else error) or type(error).__name__),
        "started_at": None if started_at is None else round(started_at, 3),
        "ended_at": round(ended_at, 3),
        "wall_s": None if started_at is None else round(ended_at - started_at, 3),
    }


@contextmanager
def told(context: Context) -> Iterator[dict[str, Any]]:
    """Push the try's record when the block ends: put the run's summary in the yielded dict's
    ``summary``; an error is recorded, then raised on. A deferral (not an ``Exception``) records nothing.
    """
    ti = context["ti"]
    result: dict[str, Any] = {}
    try:
        yield result
    except Exception as e:
        start = getattr(ti, "start_date", None)
        _push(ti, ended_with(ti.try_number, e, start.timestamp() if start else None, time.time()))
        raise
    if (summary := result.get("summary")) is not None:
        _push(ti, succeeded(ti.try_number, summary, time.time()))


def _push(ti: Any, record: dict[str, Any]) -> None:
    try:
        ti.xcom_push(key=TRY_XCOM_KEY, value=record)
    except Exception as e:  # noqa: BLE001 - the UI's record must not change the try's own outcome
        log.warning("Could not record the try's outcome for the UI: %s", e)
