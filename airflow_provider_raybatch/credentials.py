"""Storage credentials from Airflow connections, as fsspec ``storage_options``.

Used by the task only: a Ray Job on a cluster never receives them (it uses the cluster's
environment), and they are never logged or written with the output.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook


def storage_options(aws_conn_id: str | None) -> dict[str, Any]:
    """fsspec (s3fs) options from an Airflow AWS connection; empty: s3fs reads the environment."""
    if aws_conn_id is None:
        return {}
    conn = BaseHook.get_connection(aws_conn_id)
    extra = conn.extra_dejson
    options: dict[str, Any] = {}
    client_kwargs = {k: extra[k] for k in ("endpoint_url", "region_name") if extra.get(k)}
    if client_kwargs:
        options["client_kwargs"] = client_kwargs
    if conn.login:
        options.update(key=conn.login, secret=conn.password)
    if extra.get("aws_session_token"):
        options["token"] = extra["aws_session_token"]
    return options
