"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_provider_raybatch import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-raybatch",
        "name": "Ray Batch Inference",
        "description": "Checkpointed offline batch inference on Ray Data, on an embedded local Ray or a Ray cluster.",
        "versions": [__version__],
        "hooks": [
            {
                "integration-name": "Ray",
                "python-modules": ["airflow_provider_raybatch.hooks.ray"],
            }
        ],
        "operators": [
            {
                "integration-name": "Ray",
                "python-modules": [
                    "airflow_provider_raybatch.operators.batch_inference",
                    "airflow_provider_raybatch.operators.llm_batch_inference",
                    "airflow_provider_raybatch.operators.vlm_caption",
                ],
            }
        ],
        "connection-types": [
            {
                "connection-type": "ray",
                "hook-class-name": "airflow_provider_raybatch.hooks.ray.RayHook",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "extra"],
                    "relabeling": {"host": "Ray address"},
                    "placeholders": {"host": "ray://ray-head:10001 (empty: embedded local Ray)"},
                },
            }
        ],
    }
