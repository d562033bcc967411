"""Cold first task: seconds from the task's start to its first committed range with no local Ray
running, and where they go (issue 30, item 4).

The quick start's task (``dags/daily_batch_inference.py``'s arguments, the digits model and the
597 rows `make demo` prepares) run by the operator in a fresh process, on a shared local Ray
folder of its own with no head in it: the task starts the head, as the first task on a host does.
Each run's steps, in seconds from the task's start (``execute()``):

- from the task's log: ``planned`` (input listed, footers read, the plan recorded), ``head start
  asked``, ``connected`` (the head up and this driver joined it);
- ``head up``: the head's own start, as its monitor measured it (``ray start --head`` until it
  said it runs);
- from the replica (``benchmarks/timed_predictor.py``): its process's start, the end of its
  imports (Ray's worker, Ray Data, the stage worker), of torch's import, of the model's load, and
  of its first batch;
- ``first commit``: the first range's commit record.

    python -m benchmarks.cold_start --repeats 3
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.support.commits import commit_timeline
from benchmarks.support.paths import DEFAULT_RESULTS_DIR, DEFAULT_WORK_DIR
from benchmarks.support.processes import shared_ray_env
from benchmarks.support.results import Results
from benchmarks.support.runs import run_variant
from benchmarks.support.stats import median
from benchmarks.support.timings import TIMINGS_ENV, read_timings

TARGET_S = 6.0  # issue 30: task start to the first committed range, the quick start's data, no Ray running
REPLICA_STEPS = ("worker start to its imports", "import torch", "model load", "first batch")


def quickstart_data(work_dir: Path) -> tuple[Path, Path]:
    """The quick start's model and one date's input, made once under ``work_dir`` as `make demo` makes them."""
    from airflow_provider_raybatch.examples.digits import prepare

    return prepare(work_dir / "quickstart", "2026-11-26")


def head_up_s(base: str) -> float | None:
    """The head's start as its monitor logged it ("head up in X s"), under the shared folder ``base``."""
    for log in Path(base).glob("**/monitor.log"):
        for line in log.read_text().splitlines():
            if "head up in" in line:
                return float(line.split("head up in ", 1)[1].split(" s", 1)[0])
    return None


def steps(result: dict[str, Any], timings: list[dict[str, Any]]) -> dict[str, float]:
    """The run's steps in seconds from its start; the replica's are its model's process's."""
    start = result["started_at"]
    row = {mark: round(at - start, 2) for mark, at in result["marks"].items()}
    replica = next((t["pid"] for t in timings if t["stage"] == "model load"), None)
    for t in timings:
        if t["pid"] == replica and t["stage"] in REPLICA_STEPS:
            if t["stage"] == REPLICA_STEPS[0]:
                row["replica process started"] = round(t["start"] - start, 2)
            row[f"{t['stage']} done"] = round(t["end"] - start, 2)
    return row


def main(argv: list[str] | None = None) -> Results:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="cold runs (median kept)")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR, help="folder for the results (JSON, Markdown)")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="folder for the data and outputs")
    args = parser.parse_args(argv)
    results = Results("cold_start", "Cold first task: the quick start's task, no local Ray running", args)
    weights, input_path = quickstart_data(args.work_dir)
    output = args.work_dir / "out-cold-start"
    firsts = []
    for run in range(1, args.repeats + 1):
        timings_path = args.work_dir / "cold-start-timings.jsonl"
        timings_path.unlink(missing_ok=True)
        with shared_ray_env() as env:  # a folder of its own: no head there yet
            params = {"input": str(input_path), "output": str(output), "weights": str(weights)}
            result = run_variant("quickstart", params, {**env, TIMINGS_ENV: str(timings_path)})
            head = head_up_s(env["RAYBATCH_LOCAL_RAY_DIR"])
        timeline = commit_timeline(output, result["started_at"])
        firsts.append(timeline["first_commit_s"])
        results.add(
            run=run,
            rows=result["summary"]["rows_in"],
            head_up_s=head,
            **steps(result, read_timings(timings_path)),
            first_commit_s=timeline["first_commit_s"],
            wall_s=result["wall_s"],
        )
    first = median(firsts)
    results.check(
        "cold first task: task start to first commit (s, median)", first, f"<= {TARGET_S:g}", first <= TARGET_S
    )
    results.note(
        "Seconds from the operator's execute(). head_up_s is a duration (the monitor's `ray start --head` "
        "until Ray said it runs), the other columns are times since the task's start."
    )
    results.write()
    return results


if __name__ == "__main__":
    main()
