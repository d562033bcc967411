"""The ``ray`` connection: where a pipeline runs."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException


class RayHook(BaseHook):
    """Resolves a ``ray`` connection to the Ray a pipeline should use.

    With no connection of that id (or ``ray_conn_id=None``), pipelines run on an embedded local
    Ray started inside the task process and shut down when the task ends: everything works on a
    laptop with no cluster. A connection whose host is set points at a Ray cluster address
    (``ray://host:10001`` for Ray Client, or ``host:6379`` for a node of the cluster).

    :param ray_conn_id: the ``ray`` connection to use; None for the embedded local Ray.
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = "ray"
    hook_name = "Ray"

    def __init__(self, ray_conn_id: str | None = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id

    @property
    def ray_address(self) -> str | None:
        """The cluster address, or None for the embedded local Ray."""
        if self.ray_conn_id is None:
            return None
        try:
            conn = self.get_connection(self.ray_conn_id)
        except AirflowNotFoundException:
            self.log.info("No connection %r: using an embedded local Ray", self.ray_conn_id)
            return None
        if not conn.host:
            return None
        return f"{conn.host}:{conn.port}" if conn.port and ":" not in conn.host.split("//")[-1] else conn.host

    def get_conn(self) -> str | None:
        return self.ray_address
