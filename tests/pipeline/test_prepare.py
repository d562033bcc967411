"""How a writer starts (:func:`.prepare.prepare`): what it reads of its output's bookkeeping."""

from __future__ import annotations

import dataclasses

import pytest

import airflow_provider_raybatch.pipeline.prepare as prepare_module
from airflow_provider_raybatch.pipeline.prepare import prepare
from tests.support.data import OpenRecordingFileSystem, write_input
from tests.support.tables import table_config


@pytest.mark.parametrize(
    ("again", "generation"),
    [
        pytest.param({}, 0, id="resume"),
        pytest.param({"mode": "overwrite"}, 0, id="overwrite-by-the-same-run"),
        pytest.param({"mode": "overwrite", "run_key": "dag/2/t/-1"}, 1, id="overwrite-by-another-run"),
        pytest.param({"mode": "overwrite", "rows_per_range": 50}, 1, id="overwrite-with-other-settings"),
    ],
)
def test_a_table_writer_reads_the_plan_of_its_generation_once(tmp_path, monkeypatch, again, generation):
    """Whether it continues its generation or starts the next one, the plan it acts on is read once."""
    pytest.importorskip("deltalake")
    write_input(tmp_path / "in", [300])
    cfg = table_config(tmp_path, "delta", run_key="dag/1/t/-1")
    prepare(cfg).release()  # records the plan of generation 0

    fs = OpenRecordingFileSystem(str(tmp_path / "opens.log"))
    resolve = prepare_module.resolve
    monkeypatch.setattr(prepare_module, "resolve", lambda url, options: (fs, resolve(url, options)[1]))
    run = prepare(dataclasses.replace(cfg, **again))
    run.release()
    plans = [path for _, path in fs.opened() if path.endswith("/_raybatch/plan.json")]
    assert len(plans) == 1, plans
    assert run.generation is not None and run.generation.number == generation
