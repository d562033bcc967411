"""The connection of an OpenAI-compatible endpoint (the ``openai`` engine): its base URL and API key."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from airflow.sdk import BaseHook

from airflow_provider_raybatch.pipeline.errors import ConfigError

if TYPE_CHECKING:
    from airflow.sdk import Connection


class OpenAIEndpointHook(BaseHook):
    """An OpenAI-compatible endpoint's connection (any connection type, e.g. the OpenAI provider's).

    :param openai_conn_id: a connection whose host is the endpoint's base URL (a bare host gets the
        connection's schema as its scheme, ``https`` by default, and its port), and whose password
        is the API key.
    """

    conn_name_attr = "openai_conn_id"
    default_conn_name = "openai_default"
    hook_name = "OpenAI-compatible endpoint"

    def __init__(self, openai_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.openai_conn_id = openai_conn_id

    @cached_property
    def connection(self) -> Connection:
        return self.get_connection(self.openai_conn_id)

    def base_url(self) -> str:
        """The endpoint's base URL, e.g. ``https://api.example.com/v1``."""
        conn = self.connection
        if not conn.host:
            raise ConfigError(f"connection {self.openai_conn_id!r} has no host: set it to the endpoint's base URL")
        host = conn.host.rstrip("/")
        if "://" not in host:
            host = f"{conn.schema or 'https'}://{host}"
        if conn.port and ":" not in host.split("://", 1)[1].split("/", 1)[0]:
            scheme, rest = host.split("://", 1)
            netloc, _, path = rest.partition("/")
            host = f"{scheme}://{netloc}:{conn.port}" + (f"/{path}" if path else "")
        return host

    def api_key(self) -> str | None:
        """The API key (the connection's password), if any."""
        return self.connection.password or None
