"""The ``openai`` embedding engine: any OpenAI-compatible ``/embeddings`` endpoint (OpenAI, vLLM's
and most inference servers' OpenAI API), called from a Ray Data actor with a batch of texts per request.

- **The API key** is read on the driver when the stage is built, from the environment variable
  ``api_key_env`` (as the chat ``openai`` engine reads it), and given to the actors as a constructor
  argument: never part of the stage's settings, the output's bookkeeping or a log line.
- **Rate limits and outages** (429, 5xx, a dropped connection or a timeout) are retried with a
  growing wait (``Retry-After`` when the endpoint sends one), up to ``max_retries``; past that the
  try fails, retryably: the texts are not at fault and a retry resumes from the committed ranges.
- **A text the endpoint refuses** (another 4xx, e.g. longer than the model takes): the request is
  split until the refused texts stand alone; each is rejected with the endpoint's message and the
  others are embedded. A refusal that is not a text's (401, 403, 404: the key or the model) fails
  the try at once, naming the status and the endpoint's message.
- **Tokens** are not counted per row: an ``/embeddings`` response reports one count per request
  (``usage.prompt_tokens``), which cannot be split among its rows exactly. Truncation is the
  endpoint's: a row's ``truncated`` is null.

``engine_kwargs``: ``max_retries`` (3), ``retry_wait_s`` (1.0: then 2, 4...), ``qps`` (requests per
second per replica; None: no limit), ``timeout_s`` (60), ``dimensions`` (sent to models that can
shorten their vectors, such as OpenAI's ``text-embedding-3-*``).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.llm.config import EmbeddingTask, EngineConfig
from airflow_provider_raybatch.llm.engines.base import EmbeddingEngine, register
from airflow_provider_raybatch.llm.vectors import embedding_output
from airflow_provider_raybatch.pipeline.columns import ENGINE_ERROR, INTERNAL_PREFIX, REJECT_COLUMN, REJECT_KIND_COLUMN
from airflow_provider_raybatch.pipeline.config import TransformStage
from airflow_provider_raybatch.pipeline.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_provider_raybatch.pipeline.config import Stage
    from airflow_provider_raybatch.pipeline.resources import ReplicaResources

#: Statuses worth asking again: the endpoint is busy or failing, not the texts.
RETRIED = frozenset({408, 409, 429, 500, 502, 503, 504})
#: Statuses that say the key, the account or the model is wrong: no text of the run would fare better.
FATAL = frozenset({401, 402, 403, 404})
KWARGS = ("max_retries", "retry_wait_s", "qps", "timeout_s", "dimensions")


@register
class OpenAIEmbeddingEngine(EmbeddingEngine):
    """An OpenAI-compatible ``/embeddings`` endpoint, a batch of texts per request."""

    name = "openai"
    predictor = "airflow_provider_raybatch.llm.engines.openai_embedding:build_transform"
    needs_endpoint = True
    stage_type = TransformStage

    def validate(self, task: EmbeddingTask, config: EngineConfig, resources: ReplicaResources) -> None:  # type: ignore[override]
        super().validate(task, config, resources)  # type: ignore[arg-type]
        unknown = sorted(set(config.engine_kwargs) - set(KWARGS))
        if unknown:
            raise ConfigError(
                f"engine_kwargs {unknown} are not taken by the openai embedding engine (it takes {KWARGS})"
            )
        if resources.num_gpus:
            raise ConfigError(
                "the openai embedding engine calls an endpoint: give num_gpus=0 (its replicas use no GPU)"
            )


def build_transform(stage: Stage) -> Any:
    """The stage's transform, built on the driver: the key read here, the actors given it."""
    config = EngineConfig(**stage.predictor_kwargs["engine"])
    api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
    constructor = {
        "task": stage.predictor_kwargs["task"],
        "engine": stage.predictor_kwargs["engine"],
        "api_key": api_key,
    }
    reserve = {"memory": stage.memory, "resources": stage.resources, "accelerator_type": stage.accelerator_type}

    def transform(ds: Any) -> Any:
        return ds.map_batches(
            OpenAIEmbedder,
            fn_constructor_kwargs=constructor,
            batch_format="pyarrow",
            batch_size=stage.batch_size,
            concurrency=stage.concurrency,
            num_cpus=stage.num_cpus,
            **{k: v for k, v in reserve.items() if v},
        )

    return transform


class EndpointError(RuntimeError):
    """The endpoint refused a request for a reason that is not one text's."""


class OpenAIEmbedder:
    """Ray Data actor: a batch of rows in, their vectors (or rejects) out, the internal columns carried through.

    :param task: ``EmbeddingTask.to_dict()``.
    :param engine: ``EngineConfig.to_dict()``.
    :param api_key: sent as ``Authorization: Bearer``; None: no header.
    """

    def __init__(self, task: dict[str, Any], engine: dict[str, Any], api_key: str | None):
        self.task = EmbeddingTask.from_dict(task)
        self.config = EngineConfig(**engine)
        kwargs = self.config.engine_kwargs
        self.url = self.config.base_url.rstrip("/") + "/embeddings"
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.max_retries = int(kwargs.get("max_retries", 3))
        self.retry_wait_s = float(kwargs.get("retry_wait_s", 1.0))
        self.interval_s = 1.0 / float(kwargs["qps"]) if kwargs.get("qps") else 0.0
        self.timeout_s = float(kwargs.get("timeout_s", 60))
        self.dimensions = kwargs.get("dimensions")
        self.last_request = 0.0
        self.dimension: int | None = None

    def __call__(self, batch: pa.Table) -> pa.Table:
        import numpy as np
        import pyarrow as pa

        from airflow_provider_raybatch.pipeline.execution.tensors import output_to_table

        rejected = batch.column(REJECT_COLUMN).to_pylist() if REJECT_COLUMN in batch.column_names else None
        texts = batch.column(self.task.text_column).to_pylist()
        reasons: list[str | None] = []
        for i, text in enumerate(texts):
            earlier = rejected[i] if rejected else None
            reasons.append(earlier or (f"{self.task.text_column} is null" if text is None else None))
        todo = [i for i, reason in enumerate(reasons) if reason is None]
        vectors: dict[int, list[float]] = {}
        refused: dict[int, str] = {}
        self._embed(todo, [self.task.prefix + str(texts[i]) for i in todo], vectors, refused)
        rows = np.zeros((len(texts), self._dimension(vectors)), np.float32)
        for i, vector in vectors.items():
            rows[i] = vector
        for i, message in refused.items():
            reasons[i] = message
        out = embedding_output(self.task, rows, [None] * len(texts), [None] * len(texts), reasons)
        # A row the endpoint refused is the engine's reject; a null text, or an earlier stage's reject, keeps its kind.
        kinds = out[REJECT_KIND_COLUMN]
        earlier_kinds = (
            batch.column(REJECT_KIND_COLUMN).to_pylist() if REJECT_KIND_COLUMN in batch.column_names else None
        )
        for i in range(len(texts)):
            if i in refused:
                kinds[i] = ENGINE_ERROR
            elif rejected and rejected[i]:
                kinds[i] = earlier_kinds[i] if earlier_kinds else None
        table = output_to_table(out, "openai", batch.num_rows)
        carried = [n for n in batch.column_names if n.startswith(INTERNAL_PREFIX) and n not in table.column_names]
        return pa.table({**{n: batch.column(n) for n in carried}, **{n: table.column(n) for n in table.column_names}})

    def _dimension(self, vectors: dict[int, list[float]]) -> int:
        """The model's dimension, the same for every vector; learnt with a one-word request when a
        batch has no text the endpoint embedded (its rows' zero vectors still need the column's type)."""
        if self.dimension is None and not vectors:
            probe: dict[int, list[float]] = {}
            self._embed([0], ["dimension"], probe, {})
            vectors = probe
        for vector in vectors.values():
            if self.dimension is None:
                self.dimension = len(vector)
            if len(vector) != self.dimension:
                raise EndpointError(f"{self.url} answered vectors of {len(vector)} and {self.dimension} dimensions")
        return self.dimension or 0

    def _embed(
        self, rows: list[int], texts: list[str], vectors: dict[int, list[float]], refused: dict[int, str]
    ) -> None:
        """Embed ``texts`` (of ``rows``) in one request; a refused request is split until the refused texts stand alone."""
        if not rows:
            return
        status, answer = self._post(texts)
        if status == 200:
            data = sorted(answer.get("data") or [], key=lambda d: d.get("index", 0))
            if len(data) != len(texts):
                raise EndpointError(f"{self.url} answered {len(data)} embeddings for {len(texts)} texts")
            for row, item in zip(rows, data, strict=True):
                vectors[row] = item["embedding"]
            return
        if len(rows) == 1:
            refused[rows[0]] = f"the endpoint refused the text ({status}): {_message(answer)}"
            return
        half = len(rows) // 2
        self._embed(rows[:half], texts[:half], vectors, refused)
        self._embed(rows[half:], texts[half:], vectors, refused)

    def _post(self, texts: list[str]) -> tuple[int, dict[str, Any]]:
        """One request, retried while the endpoint is busy or failing: (200, body) or (a 4xx of the texts, body)."""
        body: dict[str, Any] = {"model": self.config.model, "input": texts, "encoding_format": "float"}
        if self.dimensions:
            body["dimensions"] = int(self.dimensions)
        data = json.dumps(body).encode()
        for attempt in range(self.max_retries + 1):
            wait = max(0.0, self.last_request + self.interval_s - time.monotonic())
            time.sleep(wait)
            self.last_request = time.monotonic()
            retry_after = None
            try:
                request = urllib.request.Request(self.url, data=data, headers=self.headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return 200, json.loads(response.read())
            except urllib.error.HTTPError as e:
                status, answer = e.code, _json_body(e)
                if status in FATAL:
                    raise EndpointError(f"{self.url} refused the request ({status}): {_message(answer)}") from None
                if status not in RETRIED:
                    return status, answer
                retry_after = _seconds(e.headers.get("Retry-After"))
                problem = f"{status}: {_message(answer)}"
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                problem = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            if attempt < self.max_retries:
                time.sleep(retry_after if retry_after is not None else self.retry_wait_s * 2**attempt)
        raise EndpointError(f"{self.url} failed {self.max_retries + 1} times, the last with {problem}")


def _json_body(error: urllib.error.HTTPError) -> dict[str, Any]:
    try:
        body = json.loads(error.read() or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _message(answer: dict[str, Any]) -> str:
    error = answer.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    return str(message or answer.get("message") or "no message")[:300]


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the growing wait instead
