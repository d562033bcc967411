"""What an LLM / VLM stage asks (:class:`ChatTask`), what an embedding stage embeds
(:class:`EmbeddingTask`), and of which engine (:class:`EngineConfig`).

Plain dataclasses, no heavy import: the operators build them at execute time, and the stages
built from them (:mod:`~airflow_provider_raybatch.llm.build`) travel as JSON (``Stage.to_spec``)
to wherever the pipeline runs. Nothing secret goes in them: an endpoint engine names the
environment variable holding its key instead.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass, field
from typing import Any

#: The column the image stage writes (a PNG, resized) and the engines read.
PREPARED_IMAGE_COLUMN = "raybatch_image_png"
#: The output columns of a task's ``token_columns``: each row's prompt and generated tokens
#: (the names of ``ray.data.llm``'s own output columns).
TOKEN_OUTPUT_COLUMNS = ("num_input_tokens", "num_generated_tokens")
DEFAULT_API_KEY_ENV = "RAYBATCH_OPENAI_API_KEY"


@dataclass
class ChatTask:
    """What to ask the model, the same for every engine.

    :param prompt: the user message; ``{column}`` fields are filled from each row.
    :param system_prompt: an optional system message (fields filled the same way).
    :param output_column: where the answer is written.
    :param sampling_params: vLLM-style sampling parameters (``temperature``, ``max_tokens``...).
    :param choices: constrain each answer to exactly one of these strings.
    :param image_column: for a VLM: the column holding the image (bytes, a ``{"bytes", "path"}``
        struct, or a path / URL string).
    :param image_size: ``(width, height)`` the image is resized to before the model; None keeps it.
    :param token_columns: also write each row's prompt and generated tokens
        (:data:`TOKEN_OUTPUT_COLUMNS`); the output's totals are counted either way.
    """

    prompt: str
    system_prompt: str | None = None
    output_column: str = "generated_text"
    sampling_params: dict[str, Any] = field(default_factory=dict)
    choices: list[str] | None = None
    image_column: str | None = None
    image_size: tuple[int, int] | None = None
    token_columns: bool = False

    def prompt_fields(self) -> list[str]:
        """Row columns the prompts refer to, in order of first use."""
        names: list[str] = []
        for template in (self.system_prompt or "", self.prompt):
            for _, name, _, _ in string.Formatter().parse(template):
                if name is not None and name not in names:
                    names.append(name)
        return names

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["image_size"] = list(self.image_size) if self.image_size else None
        if not self.token_columns:
            # What outputs planned before the option recorded in their job signature: they resume.
            del data["token_columns"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatTask:
        task = cls(**data)
        if task.image_size is not None:
            task.image_size = (int(task.image_size[0]), int(task.image_size[1]))
        return task


#: How an embedding is stored: float32, or float16 (half the size, about 3 significant digits).
EMBEDDING_DTYPES = ("float32", "float16")


@dataclass
class EmbeddingTask:
    """What to embed, the same for every embedding engine.

    :param text_column: the column holding each row's text (or give ``image_column``).
    :param image_column: the column holding each row's image (encoded bytes, a path or URL, or a
        ``{"bytes", "path"}`` struct), for a model that embeds images (such as CLIP); instead of
        ``text_column``. An image is neither truncated nor counted in tokens.
    :param prefix: put before every text, as models trained with an instruction want it (E5's
        ``"query: "`` or ``"passage: "``); part of the text the model sees and counts.
    :param output_column: where each row's vector is written, a ``FixedSizeList`` of the model's dimension.
    :param normalize: scale each vector to unit L2 norm (cosine similarity becomes a dot product).
    :param dtype: how the vectors are stored: ``"float32"`` or ``"float16"``.
    :param truncated_column: a boolean column saying whether the row's text was cut to the model's
        maximum length (None: not written).
    :param token_columns: also write each row's input tokens as the column ``num_input_tokens``;
        the output's totals are counted either way.
    """

    text_column: str | None = None
    prefix: str = ""
    output_column: str = "embedding"
    normalize: bool = False
    dtype: str = "float32"
    truncated_column: str | None = "truncated"
    token_columns: bool = False
    image_column: str | None = None

    @property
    def input_column(self) -> str:
        """The column the model reads: the images' or the texts'."""
        return self.image_column or self.text_column or ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmbeddingTask:
        return cls(**data)


@dataclass
class EngineConfig:
    """Which engine answers: what decides the answers, recorded in the stage's ``predictor_kwargs``.

    The engine replicas' resources are not here: they are the engine stage's own
    :class:`~airflow_provider_raybatch.pipeline.resources.ReplicaResources`, so that scaling them
    does not make a resumed output refuse the new settings.

    :param engine: a registered engine's name (:func:`~airflow_provider_raybatch.llm.engines.get_engine`):
        ``"vllm"`` (``ray.data.llm`` with vLLM, GPUs), ``"transformers"`` (Hugging Face
        ``generate`` in a Ray Data actor, CPU or GPU) or ``"openai"`` (any OpenAI-compatible endpoint).
    :param model: a model id or a local folder; for ``"openai"``, the model name the endpoint serves.
    :param engine_kwargs: passed to the engine: vLLM engine args (``max_model_len``,
        ``tensor_parallel_size``...); for transformers ``max_model_len``, ``device``, ``dtype``,
        ``num_threads``, ``trust_remote_code``; for openai ``max_retries``, ``qps``, ``retry_wait_s``.
    :param base_url: an endpoint engine's base URL (``.../v1``).
    :param api_key_env: an endpoint engine's API key: the environment variable holding it where
        the pipeline's driver runs (never the key itself).
    """

    engine: str
    model: str
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    base_url: str | None = None
    api_key_env: str | None = DEFAULT_API_KEY_ENV

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
