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
    "outage_timeout": {
        "label": "Jobs API outage timeout (s)",
        "description": "How long a task keeps retrying while the Jobs API is unreachable or answers 502/503/504 "
        "(a dashboard restart, an ingress rollout) before its try fails; default 600, 0: no retry",
        "schema": {"type": ["number", "null"], "minimum": 0},
    },
}


def ray_field_behaviour(*, named_extras: bool) -> dict[str, Any]:
    """The ``ray`` connection form's standard fields: which are hidden, relabelled, hinted.

    :param named_extras: whether the form shows :data:`RAY_CONN_FIELDS` as fields of their own
        (Airflow 3.2+); otherwise the extras stay the JSON "Extra" field.
    """
    return {
        "hidden-fields": ["schema", "login", "port", *(["extra"] if named_extras else [])],
        "relabeling": {"host": "Ray dashboard address", "password": "Ray auth token"},
        "placeholders": {"host": "http://ray-head:8265 (empty: embedded local Ray)"},
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
                    "airflow_provider_raybatch.operators.embedding",
                    "airflow_provider_raybatch.operators.llm_batch_inference",
                    "airflow_provider_raybatch.operators.vlm_caption",
                ],
            }
        ],
        "plugins": [
            {"name": "raybatch", "plugin-class": "airflow_provider_raybatch.plugins.plugin.RayBatchPlugin"},
        ],
        "connection-types": [
            {
                "connection-type": "ray",
                "hook-class-name": "airflow_provider_raybatch.hooks.ray.RayHook",
                "conn-fields": RAY_CONN_FIELDS,
                "ui-field-behaviour": ray_field_behaviour(named_extras=True),
            }
        ],
    }
