"""The ``vllm`` embedding engine: ``ray.data.llm``'s embedding task on vLLM
(``vLLMEngineProcessorConfig(task_type="embed")``), on GPUs or on vLLM's CPU build.

Its replicas, their resources and the checks before a run are the chat ``vllm`` engine's
(:class:`~airflow_provider_raybatch.llm.engines.vllm.VLLMEngine`); the processor is applied by
:func:`~airflow_provider_raybatch.llm.processors.embedding_transform`. It embeds as the
``transformers`` embedding engine does with the same model folder:

- **Truncation.** vLLM refuses a prompt longer than ``max_model_len`` (the row would be an
  engine error), where the transformers engine cuts it. So the texts are tokenized before vLLM,
  with the model's tokenizer (special tokens added), and a text longer than the limit is cut to
  it, as ``truncation=True`` cuts it (the ending special token kept); vLLM gets the token ids
  and never tokenizes. (vLLM's own ``truncate_prompt_tokens`` would keep the first tokens, dropping
  the closing special token, and say nothing of which rows it cut.) The limit is ``engine_kwargs`` ``max_model_len``, else the transformers
  engine's (the folder's ``sentence_bert_config.json`` ``max_seq_length``, else the tokenizer's,
  else the model's positions), and vLLM is started with it as its ``max_model_len``. The row's
  ``truncated`` says whether its text was cut.
- **Tokens**: each row's are those vLLM embedded (its ``num_input_tokens``, after truncation).
- **Pooling**: vLLM's pooler, which reads a sentence-transformers folder's ``1_Pooling``
  config; for a local folder without one, mean (the transformers engine's default) unless
  ``engine_kwargs`` give vLLM a ``pooler_config``. vLLM's own normalisation (``use_activation``) is off: the
  task's ``normalize`` decides, as for every engine.
- A row without text (null) is rejected as invalid input and never reaches vLLM.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.llm.engines.base import EmbeddingEngine, register
from airflow_provider_raybatch.llm.engines.transformers_embedding import model_max_length, model_pooling
from airflow_provider_raybatch.llm.engines.vllm import VLLMEngine
from airflow_provider_raybatch.pipeline.errors import ConfigError

if TYPE_CHECKING:
    from airflow_provider_raybatch.llm.config import EmbeddingTask, EngineConfig
    from airflow_provider_raybatch.pipeline.resources import ReplicaResources

#: The request's key carrying whether the text was cut, read back from the engine's output row.
CUT_KEY = "raybatch_text_cut"
#: vLLM's pooling types of the transformers engine's poolings.
POOLING_TYPES = {"mean": "MEAN", "cls": "CLS"}


@register
class VLLMEmbeddingEngine(EmbeddingEngine, VLLMEngine):
    """vLLM's embedding task through ``ray.data.llm``: the texts tokenized (and cut) before vLLM,
    pooled by vLLM, the vectors written by
    :func:`~airflow_provider_raybatch.llm.vectors.embedding_output`."""

    name = "vllm"
    predictor = "airflow_provider_raybatch.llm.processors:build_vllm_embedding_transform"
    # No chat template, tokenize or detokenize stage: the preprocess tokenizes, vLLM pools.
    processor_cpu_stages = 0

    def settled(self, config: EngineConfig) -> tuple[EngineConfig, int]:
        """``config`` with the length texts are cut to as ``max_model_len`` and, for a local model
        folder, its pooling (mean without a sentence-transformers one); and the vectors' dimension
        (the model's hidden size, as the transformers engine's). Run on the driver, where the
        processor is built: it reads the model's tokenizer and config."""
        import transformers

        kwargs = dict(config.engine_kwargs)
        trust = bool(kwargs.get("trust_remote_code", False))
        folder = Path(config.model) if os.path.isdir(config.model) else None
        model_config = transformers.AutoConfig.from_pretrained(config.model, trust_remote_code=trust)
        if not kwargs.get("max_model_len"):
            kwargs["max_model_len"] = model_max_length(
                folder, load_tokenizer(config.model, trust), getattr(model_config, "max_position_embeddings", None)
            )
        if folder is not None and "pooler_config" not in kwargs:
            # A hub model's sentence-transformers config is vLLM's to read.
            try:
                kwargs["pooler_config"] = {"pooling_type": POOLING_TYPES[model_pooling(folder)]}
            except ConfigError as e:
                raise ConfigError(
                    f"{e} (for engine='vllm': engine_kwargs={{'pooler_config': {{'pooling_type': ...}}}}, vLLM's)"
                ) from None
        settled = type(config)(**{**config.to_dict(), "engine_kwargs": kwargs})
        return settled, int(model_config.hidden_size)

    def processor_config(self, task: EmbeddingTask, config: EngineConfig, resources: ReplicaResources) -> Any:  # type: ignore[override]
        off = {"enabled": False}
        return self.vllm_config(
            config,
            resources,
            task_type="embed",
            prepare_multimodal_stage=off,
            chat_template_stage=off,
            tokenize_stage=off,
            detokenize_stage=off,
        )

    def embedding_request(self, config: EngineConfig, text: str) -> dict[str, Any]:
        """The processor's input for one text: its token ids, cut to ``max_model_len``."""
        limit = int(config.engine_kwargs["max_model_len"])
        tokenizer = load_tokenizer(config.model, bool(config.engine_kwargs.get("trust_remote_code", False)))
        ids = tokenizer(text, verbose=False)["input_ids"]
        truncated = len(ids) > limit
        if truncated:
            ids = tokenizer(text, truncation=True, max_length=limit, verbose=False)["input_ids"]
        # vLLM's pooling, less its normalisation (use_activation, for embeddings): the task's normalize decides.
        return {
            "prompt": text,
            "tokenized_prompt": ids,
            "pooling_params": {"use_activation": False},
            CUT_KEY: truncated,
        }

    def embedding_answer(self, row: dict[str, Any]) -> tuple[Any, int | None, bool | None]:
        """``(vector, input tokens, truncated)`` from one row of the processor's output."""
        return row["embeddings"], row.get("num_input_tokens"), row.get(CUT_KEY)


@functools.lru_cache(maxsize=4)
def load_tokenizer(model: str, trust_remote_code: bool) -> Any:
    """The model's tokenizer, loaded once per process (the preprocess runs in Ray's workers, row by row)."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(
        model, trust_remote_code=trust_remote_code, local_files_only=os.path.isdir(model)
    )
