"""The ``transformers`` embedding engine: a Hugging Face encoder (``AutoModel``) pooled into one
vector per row, in a Ray Data actor, on CPU or GPU; or a model of texts and images (CLIP, SigLIP:
a model with ``get_text_features`` and ``get_image_features``), whose own projections embed both
into one space, so that texts find images.

It embeds as sentence-transformers would with the same model folder: the pooling its
``modules.json`` names (its ``Pooling`` module's config: the mean of the tokens, or the CLS
token; mean for a folder without one), and texts cut to its ``sentence_bert_config.json``'s
``max_seq_length`` (else the tokenizer's, else the model's position count). ``engine_kwargs``
``pooling`` and ``max_model_len`` override them.

A text longer than that is cut, not refused: the row says so (the task's ``truncated_column``),
and its input tokens are those the model saw. A row without text (null) is rejected as invalid
input, as is an image that is missing, unreadable or not an image (the reason names it); images go
through the model folder's image processor (``AutoImageProcessor``).

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
    embeds_images = True

    def validate(self, task: EmbeddingTask, config: EngineConfig, resources: ReplicaResources) -> None:  # type: ignore[override]
        super().validate(task, config, resources)  # type: ignore[arg-type]
        pooling = config.engine_kwargs.get("pooling")
        if pooling is not None and pooling not in POOLINGS:
            raise ConfigError(f"engine_kwargs pooling must be one of {POOLINGS} or absent, got {pooling!r}")
        if task.image_column is not None and os.path.isdir(config.model):
            # A model id is checked where its replicas load it; a local folder before any work.
            settings = _json(Path(config.model) / "config.json")
            if "vision_config" not in settings:
                raise ConfigError(
                    f"image_column={task.image_column!r}: model {config.model!r} (model_type "
                    f"{settings.get('model_type')!r}) has no image tower; give a model of texts and images, such as CLIP"
                )


class TransformersEmbedder:
    """Stage predictor embedding an :class:`EmbeddingTask`'s texts or images with a local Hugging Face model.

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
        if self.task.image_column is None:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(config.model, **load)
        else:
            self.image_processor = transformers.AutoImageProcessor.from_pretrained(config.model, **load)
        model_load = {**load, **({"dtype": getattr(torch, kwargs["dtype"])} if kwargs.get("dtype") else {})}
        self.model = transformers.AutoModel.from_pretrained(config.model, **model_load).to(self.device).eval()
        if self.task.image_column is not None and not hasattr(self.model, "get_image_features"):
            raise ConfigError(
                f"image_column={self.task.image_column!r}: model {config.model!r} ({type(self.model).__name__}) "
                "has no image tower; give a model of texts and images, such as CLIP"
            )
        #: A model of texts and images embeds texts with its own projection (into the images' space), not pooling.
        self.joint = hasattr(self.model, "get_text_features")
        folder = Path(config.model) if os.path.isdir(config.model) else None
        self.pooling = kwargs.get("pooling") or model_pooling(folder)
        if self.task.image_column is None:
            text = getattr(self.model.config, "text_config", None) or self.model.config  # CLIP's is its text tower's
            positions = getattr(text, "max_position_embeddings", None)
            self.max_length = int(kwargs.get("max_model_len") or model_max_length(folder, self.tokenizer, positions))
        self.dimension: int | None = None

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        if self.task.image_column is not None:
            return self._images(batch)
        texts = [None if t is None else self.task.prefix + str(t) for t in batch[self.task.text_column]]
        reasons = [f"{self.task.text_column} is null" if t is None else None for t in texts]
        given = [t for t in texts if t is not None]
        lengths = iter(len(ids) for ids in self.tokenizer(given, verbose=False)["input_ids"]) if given else iter(())
        full = [None if t is None else next(lengths) for t in texts]
        vectors = self._rows(texts, self._embed(given) if given else None)
        tokens = [None if n is None else min(n, self.max_length) for n in full]
        truncated = [None if n is None else n > self.max_length for n in full]
        return embedding_output(self.task, vectors, tokens, truncated, reasons)

    def _images(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        # Here, not at the top: llm.images imports pyarrow, and a DAG file imports this module (its engine's registration).
        from airflow_provider_raybatch.llm.images import decode_image, load_image_bytes

        images: list[Any] = []
        reasons: list[str | None] = []
        for value in batch[self.task.image_column]:
            try:
                images.append(decode_image(load_image_bytes(value)))
                reasons.append(None)
            except ValueError as e:
                images.append(None)
                reasons.append(f"{self.task.image_column}: {e}")
        given = [i for i in images if i is not None]
        vectors = self._rows(images, self._embed_images(given) if given else None)
        return embedding_output(self.task, vectors, [None] * len(images), [None] * len(images), reasons)

    def _rows(self, inputs: list[Any], vectors: np.ndarray | None) -> np.ndarray:
        """A vector per row: the embedded ones in order, zeros for the rejected (never written: they go to the
        rejects), so that the shape holds."""
        import numpy as np

        if vectors is not None:
            self.dimension = vectors.shape[1]
        elif self.dimension is None:  # no row of the first batch could be embedded: learn the dimension once
            blank = self._embed_images([_blank_image()]) if self.task.image_column else self._embed([""])
            self.dimension = blank.shape[1]
        embedded = iter(() if vectors is None else vectors)
        zeros = np.zeros(self.dimension, np.float32)
        return np.stack([zeros if value is None else next(embedded) for value in inputs])

    def _embed(self, texts: list[str]) -> np.ndarray:
        import torch

        inputs = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        inputs = inputs.to(self.device)
        with torch.inference_mode():
            if self.joint:
                features = self.model.get_text_features(
                    input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
                )
                return _pooled(features).float().cpu().numpy()
            hidden = self.model(**inputs).last_hidden_state.float()
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return pooled.cpu().numpy()

    def _embed_images(self, images: list[Any]) -> np.ndarray:
        import torch

        pixels = self.image_processor(images=images, return_tensors="pt")["pixel_values"].to(self.device)
        with torch.inference_mode():
            features = self.model.get_image_features(pixel_values=pixels.to(self.model.dtype))
        return _pooled(features).float().cpu().numpy()


def _pooled(features: Any) -> Any:
    """``get_*_features``' vectors: a tensor in transformers < 5, the output's ``pooler_output`` after."""
    return features if hasattr(features, "cpu") else features.pooler_output


def _blank_image() -> Any:
    from PIL import Image

    return Image.new("RGB", (8, 8))


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
