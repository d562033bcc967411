"""Token counts (``__raybatch_tokens_in`` / ``_out``, as LLM engines report them) on a real local
Ray: summed per range into the commit records, added up across stages, and counted once per
committed row in the summary, the status and the progress line, across a killed try and its resume."""

from __future__ import annotations

import logging
import signal

import pytest

from airflow_provider_raybatch.pipeline import Stage
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.status import read_status
from tests.support.data import assert_output_sound, write_input
from tests.support.pipeline_runs import RECORD_EACH_RANGE, config, run_spec_in_subprocess

pytestmark = pytest.mark.usefixtures("ray_local")
PREDICTOR = "tests.support.predictors:CountTokens"
ERROR_ID = 13


def expected(ids) -> tuple[int, int]:
    """What the two stages below count for ``ids``: the first counts every row but multiples of 5
    (2 generated each), the second (3 each) never sees the row the first rejected."""
    tokens_in = tokens_out = 0
    for i in ids:
        if i % 5:
            tokens_in, tokens_out = tokens_in + i % 7 + 1, tokens_out + 2
        if i != ERROR_ID:
            tokens_in, tokens_out = tokens_in + i % 7 + 1, tokens_out + 3
    return tokens_in, tokens_out


def test_tokens_are_counted_once_per_committed_row_across_a_kill_and_a_resume(tmp_path, caplog):
    write_input(tmp_path / "in", [300])
    cfg = config(
        tmp_path,
        stages=[
            Stage(PREDICTOR, {"out": 2, "uncounted_every": 5, "error_ids": [ERROR_ID]}, batch_size=50, num_cpus=0.5),
            Stage(PREDICTOR, {"out": 3}, batch_size=50, num_cpus=0.5),
        ],
        max_error_fraction=0.05,
    )
    crashed = run_spec_in_subprocess(cfg, {"RAYBATCH_TEST_CRASH": "committed:1", **RECORD_EACH_RANGE})
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-2000:] + crashed.stderr[-3000:]
    first = OutputLedger.open(str(tmp_path / "out")).committed()
    assert list(first) and all(r.tokens_in > 0 for r in first.values())  # the killed try's range, counted

    with caplog.at_level(logging.INFO, logger="airflow_provider_raybatch"):
        summary = run_batch_inference(cfg)
    assert summary.ranges_skipped == 1 and summary.ranges_done == 2
    # The whole output's tokens: the killed try's committed range and the resumed ones, each once.
    assert (summary.tokens_in, summary.tokens_out) == expected(range(300))
    records = OutputLedger.open(str(tmp_path / "out")).committed()
    for record in records.values():
        start, end = (int(x) for x in record.range_id.rsplit("-", 2)[-2:])
        assert record.tokens == expected(range(start, end))
    resumed = [r for r in records if r not in first]
    assert summary.tokens_out_processed == sum(records[r].tokens_out for r in resumed)
    assert summary.to_dict()["tokens_per_second"] > 0
    status = read_status(str(tmp_path / "out"))
    assert (status.tokens_in, status.tokens_out) == expected(range(300))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Committed 3/3 ranges")]
    assert lines and f"tokens {summary.tokens_in} in, {summary.tokens_out} out" in lines[-1]
    assert_output_sound(tmp_path / "out", [i for i in range(300) if i != ERROR_ID])


def test_an_output_without_token_counts_records_none(tmp_path):
    write_input(tmp_path / "in", [100])
    summary = run_batch_inference(config(tmp_path))
    assert summary.tokens_in is None and "tokens_in" not in summary.to_dict()
    assert all(r.tokens == (None, None) for r in OutputLedger.open(str(tmp_path / "out")).committed().values())
    assert read_status(str(tmp_path / "out")).tokens_in is None
