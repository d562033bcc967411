"""A seeded soak of the commit protocol under random store faults: `make soak` (or `python -m benchmarks.store_fault_soak`).

Many tasks, each a sequence of tries of ``run_batch_inference`` (as Airflow's retries make them),
on a moto S3 server behind the fault-injecting proxy of the tests (``tests/support/fault_proxy.py``):
a share ``--rate`` of all requests (input reads, the workers' data files, the bookkeeping) gets
a fault drawn at random: applied then answered 500, applied with the reply dropped, refused
with 500, throttled (503 SlowDown), reset before the store saw it. Every try that succeeds is
checked: the verifier passes, every input row is there exactly once, and the summary counts
what is there. The outcome that must never happen is a success over a wrong output; a task
that ran out of tries failed retryably, which is allowed (the next DAG run resumes it).

The CI runs a few tasks (``tests/pipeline/test_store_faults.py``); the counts of a larger run
are in RESULTS.md.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUCKET = "raybatch-soak"


@dataclass
class SoakCounts:
    """What the tasks of a soak ended in."""

    tasks: int = 0
    tries: int = 0
    #: tasks whose last try succeeded over a sound output
    sound: int = 0
    #: tasks that ran out of tries, each failing retryably
    out_of_tries: int = 0
    #: tasks failed for good by a store fault (must be 0)
    permanent: list[str] = field(default_factory=list)
    #: successes over a wrong output: what, in which task (must be 0)
    wrong: list[str] = field(default_factory=list)
    faults: int = 0
    requests: int = 0


def soak(tasks: int, rate: float, seed: int, tries: int = 4, retry_s: float = 5.0) -> SoakCounts:
    """Run ``tasks`` tasks of up to ``tries`` tries each, with faults on ``rate`` of all requests."""
    import s3fs

    from airflow_provider_raybatch.pipeline import BatchInferenceConfig, Stage
    from airflow_provider_raybatch.pipeline.commit.verify import verify_output
    from airflow_provider_raybatch.pipeline.errors import NotRetryableError
    from airflow_provider_raybatch.pipeline.runner import run_batch_inference
    from airflow_provider_raybatch.pipeline.store.retries import STORE_RETRY_ENV
    from benchmarks.support.data import moto_s3
    from tests.support.data import put_input
    from tests.support.fault_proxy import FaultProxy

    saved = {name: os.environ.get(name) for name in (STORE_RETRY_ENV, "RAYBATCH_RECORD_INTERVAL_S")}
    os.environ[STORE_RETRY_ENV] = str(retry_s)
    os.environ["RAYBATCH_RECORD_INTERVAL_S"] = "0"  # a record per range: more commits to hit
    counts = SoakCounts()
    options, server = moto_s3(BUCKET)
    direct = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    try:
        with FaultProxy(options["client_kwargs"]["endpoint_url"], seed=seed) as proxy:
            through = {
                **options,
                "client_kwargs": {**options["client_kwargs"], "endpoint_url": proxy.url},
                "config_kwargs": {"retries": {"max_attempts": 2, "mode": "standard"}},
                "skip_instance_cache": True,
            }
            for task in range(tasks):
                prefix = f"task-{task}-{uuid.uuid4().hex[:6]}"
                sizes = [40 + (seed * 7 + task * 13) % 80, 30 + (seed * 11 + task * 5) % 90]
                put_input(direct, f"{BUCKET}/{prefix}/in", sizes, row_group_size=25)
                config = BatchInferenceConfig(
                    input_path=f"s3://{BUCKET}/{prefix}/in",
                    output_path=f"s3://{BUCKET}/{prefix}/out",
                    stages=[Stage("tests.support.predictors:score")],
                    id_column="id",
                    rows_per_range=25,
                    storage_options=through,
                    run_key=f"soak/{prefix}/task/-1",
                )
                counts.tasks += 1
                proxy.clear()
                proxy.random_faults(rate)
                for attempt in range(tries):
                    counts.tries += 1
                    try:
                        summary = run_batch_inference(config)
                    except NotRetryableError as e:
                        counts.permanent.append(f"{prefix}: {type(e).__name__}: {e}")
                        break
                    except Exception as e:  # noqa: BLE001 - a failed try: Airflow retries it
                        print(f"  {prefix} try {attempt + 1}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                        continue
                    problems = _check(direct, options, prefix, sum(sizes), summary, verify_output)
                    counts.wrong += [f"{prefix}: {p}" for p in problems]
                    counts.sound += not problems
                    break
                else:
                    counts.out_of_tries += 1
            counts.faults = len(proxy.applied)
            counts.requests = len(proxy.requests)
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return counts


def _check(direct: Any, options: dict[str, Any], prefix: str, rows: int, summary: Any, verify: Any) -> list[str]:
    """What is wrong with a succeeded task's output (nothing, it must be)."""
    import pyarrow.parquet as pq

    # Checked without the proxy: the faults are the tasks', not the checker's.
    problems = list(verify(f"s3://{BUCKET}/{prefix}/out", options))
    direct.invalidate_cache()
    ids: list[int] = []
    for path in direct.glob(f"{BUCKET}/{prefix}/out/part-*.parquet"):
        ids += pq.read_table(io.BytesIO(direct.cat_file(path)), columns=["id"])["id"].to_pylist()
    if sorted(ids) != list(range(rows)):
        problems.append(f"{len(ids)} rows ({len(set(ids))} distinct) where the input has {rows}")
    if not summary.rows_out == len(ids) == summary.rows_in:
        problems.append(f"summary rows_out={summary.rows_out} rows_in={summary.rows_in}, output {len(ids)}")
    return problems


def main() -> None:
    from benchmarks.support.paths import DEFAULT_RESULTS_DIR
    from benchmarks.support.results import Results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--rate", type=float, default=0.03, help="share of requests that get a fault")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tries", type=int, default=4, help="tries per task (Airflow's retries + 1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR)
    args = parser.parse_args()
    results = Results("store_fault_soak", "Store-fault soak: random faults on a share of all requests", args)
    started = time.monotonic()
    counts = soak(args.tasks, args.rate, args.seed, args.tries)
    results.add(
        tasks=counts.tasks,
        tries=counts.tries,
        requests=counts.requests,
        faults=counts.faults,
        sound_successes=counts.sound,
        out_of_tries=counts.out_of_tries,
        failed_for_good=len(counts.permanent),
        wrong_successes=len(counts.wrong),
        minutes=round((time.monotonic() - started) / 60, 1),
    )
    for line in counts.permanent + counts.wrong:
        results.note(line)
    results.write()
    sys.exit(1 if counts.permanent or counts.wrong else 0)


if __name__ == "__main__":
    main()
