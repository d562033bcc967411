"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_provider_raybatch import __version__

# Extra fields of a ``ray`` connection: what RayHook reads from the extras (secrets: format password).
RAY_CONN_FIELDS: dict[str, dict[str, Any]] = {
    "verify": {
        "label": "Verify TLS certificate",
        "schema": {"type": ["boolean", "null"], "default": True},
    },
    "headers": {
        "label": "HTTP headers",
        "description": 'JSON object sent with every request, e.g. for an authenticating proxy: {"X-Api-Key": "..."}',
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "cookies": {
        "label": "Cookies",
        "description": "JSON object of cookies sent with every request",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "runtime_env": {
        "label": "Default runtime_env",
        "description": 'JSON: the jobs\' Ray runtime_env, e.g. {"pip": ["torch"], "env_vars": {...}, "working_dir": "s3://..."}',
        "schema": {"type": ["string", "null"]},
    },
    "entrypoint_num_cpus": {
        "label": "Job driver CPUs",
        "schema": {"type": ["number", "null"], "minimum": 0},
    },
    "entrypoint_num_gpus": {
        "label": "Job driver GPUs",
        "schema": {"type": ["number", "null"], "minimum": 0},
    },
    "entrypoint_memory": {
        "label": "Job driver memory (bytes)",
        "schema": {"type": ["integer", "null"], "minimum": 0},
    },
    "namespace": {
        "label": "Ray namespace",
        "schema": {"type": ["string", "null"]},
    },
}


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
        "triggers": [
            {
                "integration-name": "Ray",
                "python-modules": ["airflow_provider_raybatch.triggers.ray_job"],
            }
        ],
        "extra-links": ["airflow_provider_raybatch.links.ray.RayJobLink"],
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
                "conn-fields": RAY_CONN_FIELDS,
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "port", "extra"],
                    "relabeling": {"host": "Ray dashboard address", "password": "Ray auth token"},
                    "placeholders": {"host": "http://ray-head:8265 (empty: embedded local Ray)"},
                },
            }
        ],
    }
