"""A run whose settings differ from those its output was started with is refused before it writes
anything, and the refusal names each differing setting with its recorded and its new value,
secrets masked, so that the user can set it back or choose ``mode="overwrite"``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline import Stage
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.shards import plan_shards
from tests.support.data import write_input
from tests.support.pipeline_runs import config

pytestmark = pytest.mark.usefixtures("ray_local")

PREDICTOR = "tests.support.predictors:ScoreWithSettings"
SECRET, NEW_SECRET = "s3cr3t-never-shown", "n3w-s3cr3t-never-shown"
SETTINGS = {
    "model_path": "/models/a.pt",
    "engine": {
        "model": "tiny-1",
        "base_url": f"https://user:{SECRET}@llm.example/v1",
        "engine_kwargs": {"headers": {"Authorization": f"Bearer {SECRET}"}, "max_tokens": 8},
        "api_key_env": "RAYBATCH_OPENAI_API_KEY",
    },
}


def changed(**settings) -> dict:
    """SETTINGS with ``engine``'s and the top level's keys replaced."""
    engine = {**SETTINGS["engine"], **settings.pop("engine", {})}
    return {**SETTINGS, **settings, "engine": engine}


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> Path:
    """An output written by a real run with SETTINGS (and rows_per_range 100)."""
    tmp_path = tmp_path_factory.mktemp("settings")
    write_input(tmp_path / "in", [200])
    summary = run_batch_inference(config(tmp_path, PREDICTOR, predictor_kwargs=SETTINGS))
    assert summary.ranges_done == 2
    return tmp_path


def snapshot(folder: Path) -> dict[str, bytes]:
    """The output's files but its leases (a refused writer took and released one: the check is made under it)."""
    files = (p for p in sorted(folder.rglob("*")) if p.is_file() and "lease" not in p.relative_to(folder).parts)
    return {str(p.relative_to(folder)): p.read_bytes() for p in files}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        pytest.param(
            {"predictor_kwargs": changed(model_path="/models/b.pt")},
            ["stages[0].predictor_kwargs.model_path: '/models/a.pt' -> '/models/b.pt'"],
            id="model-path",
        ),
        pytest.param(
            {"rows_per_range": 50, "max_rows": 150},
            ["rows_per_range: 100 -> 50", "max_rows: None -> 150"],
            id="batching",
        ),
        pytest.param(
            {"predictor_kwargs": changed(engine={"model": "tiny-2", "engine_kwargs": {"max_tokens": 16}})},
            [
                "stages[0].predictor_kwargs.engine.engine_kwargs.headers: *** -> (absent)",
                "stages[0].predictor_kwargs.engine.engine_kwargs.max_tokens: 8 -> 16",
                "stages[0].predictor_kwargs.engine.model: 'tiny-1' -> 'tiny-2'",
            ],
            id="nested-engine-setting",
        ),
        pytest.param(
            {
                "predictor_kwargs": changed(
                    engine={
                        "base_url": f"https://user:{NEW_SECRET}@llm.example/v1",
                        "engine_kwargs": {"headers": {"Authorization": f"Bearer {NEW_SECRET}"}, "max_tokens": 8},
                        "api_key_env": "OTHER_KEY",
                    }
                )
            },
            [
                "stages[0].predictor_kwargs.engine.api_key_env: 'RAYBATCH_OPENAI_API_KEY' -> 'OTHER_KEY'",
                "stages[0].predictor_kwargs.engine.base_url: 'https://***@llm.example/v1' -> "
                "'https://***@llm.example/v1' (a secret changed)",
                "stages[0].predictor_kwargs.engine.engine_kwargs.headers: *** -> *** (a secret changed)",
            ],
            id="secrets",
        ),
        pytest.param(
            {"stages": [Stage(PREDICTOR, SETTINGS), Stage("tests.support.predictors:Scale", {"factor": 2.0})]},
            [
                "stages[1]: (absent) -> {'predictor': 'tests.support.predictors:Scale', 'predictor_kwargs': {'factor': 2.0}"
            ],
            id="stage-added",
        ),
    ],
)
def test_a_changed_setting_is_refused_naming_its_recorded_and_new_value(started, change, named):
    before = snapshot(started / "out")
    kwargs = {"predictor_kwargs": SETTINGS, **change}
    with pytest.raises(ConfigError) as refused:
        run_batch_inference(config(started, PREDICTOR, **kwargs))
    message = str(refused.value)
    assert message.startswith(f"output {str(started / 'out')!r} was started with different settings")
    for text in named:
        assert text in message
    assert message.count(" -> ") == len(named) + 1  # nothing that did not change (one in the heading)
    assert SECRET not in message and NEW_SECRET not in message
    assert "mode='overwrite'" in message and "another output path" in message
    assert snapshot(started / "out") == before  # refused before it wrote anything


def test_a_shard_with_other_settings_than_its_plan_is_refused_naming_them(tmp_path):
    write_input(tmp_path / "in", [200])
    cfg = config(tmp_path, PREDICTOR, predictor_kwargs=SETTINGS)
    (shard,) = plan_shards(cfg, 1)
    other = config(tmp_path, PREDICTOR, predictor_kwargs=changed(model_path="/models/b.pt"))
    with pytest.raises(ConfigError) as refused:
        run_batch_inference(dataclasses.replace(other, range_ids=shard.range_ids))
    assert "planned with different settings" in str(refused.value)
    assert "stages[0].predictor_kwargs.model_path: '/models/a.pt' -> '/models/b.pt'" in str(refused.value)
