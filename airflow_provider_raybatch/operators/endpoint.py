"""What the operators whose engine may be an OpenAI-compatible endpoint share: its connection, and
its API key's way to the pipeline's driver."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING

from airflow_provider_raybatch.hooks.openai_endpoint import OpenAIEndpointHook

if TYPE_CHECKING:
    from airflow_provider_raybatch.llm.engines import Engine


class EndpointConnection:
    """Mixin of a :class:`~airflow_provider_raybatch.operators.ray_pipeline.RayPipelineOperator`
    whose engine may call an endpoint (``needs_endpoint``): the operator sets ``openai_conn_id``
    (a connection whose host is the endpoint's base URL and whose password is the API key) and
    ``api_key_env`` (the environment variable through which the key reaches the pipeline's driver)."""

    openai_conn_id: str
    api_key_env: str

    @cached_property
    def endpoint(self) -> OpenAIEndpointHook:
        """The ``openai_conn_id`` connection."""
        return OpenAIEndpointHook(self.openai_conn_id)

    def endpoint_url(self, engine: Engine) -> str | None:
        """The endpoint's base URL for an endpoint engine, else None (no connection is read)."""
        return self.endpoint.base_url() if engine.needs_endpoint else None

    @contextmanager
    def api_key_in_environment(self, engine: Engine | None) -> Iterator[None]:
        """For an endpoint engine on an embedded Ray: the key reaches the pipeline's driver (this
        process) through ``api_key_env`` only, for the duration of the run. On a cluster it must be
        in the cluster's environment: the key never travels with the job.

        :param engine: the operator's engine; None (an unknown name, refused later naming the known ones): nothing to do.
        """
        if engine is None or not engine.needs_endpoint:
            yield
            return
        if self.hook.cluster is not None:  # type: ignore[attr-defined]
            self.log.info("Ray cluster: the API key is read from $%s in the cluster's environment", self.api_key_env)  # type: ignore[attr-defined]
            yield
            return
        key = self.endpoint.api_key()
        previous = os.environ.get(self.api_key_env)
        if key:
            os.environ[self.api_key_env] = key
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(self.api_key_env, None)
            else:
                os.environ[self.api_key_env] = previous
