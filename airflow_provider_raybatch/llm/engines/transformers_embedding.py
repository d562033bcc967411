"""The ``transformers`` embedding engine: a Hugging Face encoder (``AutoModel``) pooled into one
vector per row, in a Ray Data actor, on CPU or GPU.

It embeds as sentence-transformers would with the same model folder: the pooling its
``modules.json`` names (its ``Pooling`` module's config: the mean of the tokens, or the CLS
token; mean for a folder without one), and texts cut to its ``sentence_bert_config.json``'s
``max_seq_length`` (else the tokenizer's, else the model's position count). ``engine_kwargs``
``pooling`` and ``max_model_len`` override them.

A text longer than that is cut, not refused: the row says so (the task's ``truncated_column``),
and its input tokens are those the model saw. A row without text (null) is rejected as invalid
input.

:class:`TransformersEmbeddingEngine` is the registration (it imports nothing heavy);
:class:`TransformersEmbedder` is the actor, which imports torch and transformers when a replica starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.llm.config import EmbeddingTask, EngineConfig
from airflow_provider_raybatch.llm.engines.base import EmbeddingEngine, register
from airflow_provider_raybatch.llm.vectors import embedding_output
from airflow_provider_raybatch.pipeline.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from airflow_provider_raybatch.pipeline.resources import ReplicaResources

POOLINGS = ("mean", "cls")
#: A tokenizer's ``model_max_length`` when its config sets none (transformers' "very large integer").
_UNSET_LENGTH = 10**6


@register
class TransformersEmbeddingEngine(EmbeddingEngine):
    """A Hugging Face encoder in a Ray Data actor, mean or CLS pooling as the model's folder says."""

    name = "transformers"
    predictor = "airflow_provider_raybatch.llm.engines.transformers_embedding:TransformersEmbedder"

    def validate(self, task: EmbeddingTask, config: EngineConfig, resources: ReplicaResources) -> None:  # type: ignore[override]
        super().validate(task, config, resources)  # type: ignore[arg-type]
        pooling = config.engine_kwargs.get("pooling")
        if pooling is not None and pooling not in POOLINGS:
            raise ConfigError(f"engine_kwargs pooling must be one of {POOLINGS} or absent, got {pooling!r}")


class TransformersEmbedder:
    """Stage predictor embedding an :class:`EmbeddingTask`'s texts with a local Hugging Face encoder.

    :param task: the task, as ``EmbeddingTask.to_dict()``.
    :param engine: the engine settings, as ``EngineConfig.to_dict()``; ``engine_kwargs`` may hold
        ``device``, ``dtype`` (the model's, e.g. ``"bfloat16"``), ``max_model_len``, ``pooling``,
        ``num_threads``, ``trust_remote_code``, ``local_files_only`` (default: True for a local folder).
    """

    def __init__(self, task: dict[str, Any], engine: dict[str, Any]):
        import torch
        import transformers

        self.task = EmbeddingTask.from_dict(task)
        config = EngineConfig(**engine)
        kwargs = config.engine_kwargs
        if kwargs.get("num_threads"):
            torch.set_num_threads(int(kwargs["num_threads"]))
        self.device = torch.device(kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
        load: dict[str, Any] = {
            "local_files_only": kwargs.get("local_files_only", os.path.isdir(config.model)),
            "trust_remote_code": kwargs.get("trust_remote_code", False),
        }
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(config.model, **load)
        if kwargs.get("dtype"):
            load["dtype"] = getattr(torch, kwargs["dtype"])
        self.model = transformers.AutoModel.from_pretrained(config.model, **load).to(self.device).eval()
        folder = Path(config.model) if os.path.isdir(config.model) else None
        self.pooling = kwargs.get("pooling") or model_pooling(folder)
        self.max_length = int(
            kwargs.get("max_model_len")
            or model_max_length(folder, self.tokenizer, getattr(self.model.config, "max_position_embeddings", None))
        )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        import numpy as np

        texts = [None if t is None else self.task.prefix + str(t) for t in batch[self.task.text_column]]
        reasons = [f"{self.task.text_column} is null" if t is None else None for t in texts]
        given = [t for t in texts if t is not None]
        lengths = iter(len(ids) for ids in self.tokenizer(given, verbose=False)["input_ids"]) if given else iter(())
        full = [None if t is None else next(lengths) for t in texts]
        vectors = self._embed(given)
        dimension = vectors.shape[1]
        rows = iter(vectors)
        # A rejected row's vector is never written (the row goes to the rejects): zeros keep the shape.
        out = np.stack([np.zeros(dimension, np.float32) if t is None else next(rows) for t in texts])
        tokens = [None if n is None else min(n, self.max_length) for n in full]
        truncated = [None if n is None else n > self.max_length for n in full]
        return embedding_output(self.task, out, tokens, truncated, reasons)

    def _embed(self, texts: list[str]) -> np.ndarray:
        import torch

        if not texts:
            return torch.zeros((0, self.model.config.hidden_size)).numpy()
        inputs = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        inputs = inputs.to(self.device)
        with torch.inference_mode():
            hidden = self.model(**inputs).last_hidden_state.float()
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return pooled.cpu().numpy()


def model_max_length(folder: Path | None, tokenizer: Any, positions: int | None) -> int:
    """The length texts are cut to: sentence-transformers' ``max_seq_length`` (the folder's
    ``sentence_bert_config.json``), else the tokenizer's limit, else the model's position count."""
    settings = _json(folder / "sentence_bert_config.json") if folder else {}
    if settings.get("max_seq_length"):
        return int(settings["max_seq_length"])
    return min(int(tokenizer.model_max_length or _UNSET_LENGTH), int(positions or _UNSET_LENGTH))


def model_pooling(folder: Path | None) -> str:
    """The pooling a sentence-transformers folder's ``modules.json`` names: ``"cls"`` or ``"mean"``
    (also for a folder without one).

    :raises ConfigError: its pooling is another (max, last token...): give ``engine_kwargs`` ``pooling``.
    """
    modules = _json(folder / "modules.json") if folder else []
    for module in modules:
        if str(module.get("type", "")).endswith(".Pooling"):
            settings = _json(folder / module.get("path", "") / "config.json")
            if settings.get("pooling_mode_cls_token"):
                return "cls"
            if settings.get("pooling_mode_mean_tokens", True):
                return "mean"
            raise ConfigError(
                f"the model's pooling ({folder / module.get('path', '')}/config.json) is neither mean nor CLS: "
                f"give engine_kwargs={{'pooling': 'mean'}} or 'cls' to embed with it"
            )
    return "mean"


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
