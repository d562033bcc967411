"""The example DAGs' check that a run's demo data exists, before its task starts Ray.

A DAG unpaused from the trigger form (Airflow ticks "Unpause on trigger" by default) also runs
its own scheduled dates, whose data the demo may not have prepared: such a run fails at once,
naming the missing path and the command that prepares it, instead of after Ray has started.
Imports only Airflow, as the DAG files do (no data library at parse time).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_provider_raybatch.version_compat import AirflowFailException


def require_demo_input(script: str, make_target: str) -> Callable[[Any], None]:
    """A ``pre_execute`` hook for an example's writing task: fail the try, without retries, when its
    rendered ``input_path`` is a local folder that does not exist in a ``data_root`` that does.

    Other inputs are left to the pipeline's own check: an object store's (the demo's scripts write
    local folders), and one under a ``data_root`` this machine lacks (a Ray cluster's own disk).

    :param script: the module under ``airflow_provider_raybatch.examples`` that prepares the data
        (``python -m ... prepare --root ROOT --date DS``).
    :param make_target: the ``make`` target that prepares yesterday's and today's data.
    """

    def check(context: Any) -> None:
        input_path, root, ds = context["task"].input_path, context["params"]["data_root"], context["ds"]
        if "://" in input_path or not Path(root).is_dir() or Path(input_path).exists():
            return
        raise AirflowFailException(
            f"input path {input_path!r} does not exist: this example's data for {ds} was not prepared "
            f"(`make {make_target}` prepares yesterday's and today's). Prepare it with:\n"
            f"  python -m airflow_provider_raybatch.examples.{script} prepare --root {root} --date {ds}\n"
            "then clear this task to run it again."
        )

    return check
