"""The engines, one class each, found by name: :func:`get_engine` (see :mod:`.base` to add one).

Importing this package registers the built-in engines: ``openai``, ``transformers``, ``vllm`` (chat);
``openai``, ``transformers``, ``vllm`` (embedding).
"""

from airflow_provider_raybatch.llm.engines.base import (
    CHAT,
    EMBEDDING,
    EmbeddingEngine,
    Engine,
    ProcessorEngine,
    engine_names,
    find_engine,
    get_engine,
    register,
)
from airflow_provider_raybatch.llm.engines.openai import OpenAIEngine
from airflow_provider_raybatch.llm.engines.openai_embedding import OpenAIEmbeddingEngine
from airflow_provider_raybatch.llm.engines.transformers import TransformersEngine
from airflow_provider_raybatch.llm.engines.transformers_embedding import TransformersEmbeddingEngine
from airflow_provider_raybatch.llm.engines.vllm import VLLMEngine
from airflow_provider_raybatch.llm.engines.vllm_embedding import VLLMEmbeddingEngine

__all__ = [
    "CHAT",
    "EMBEDDING",
    "EmbeddingEngine",
    "Engine",
    "OpenAIEmbeddingEngine",
    "OpenAIEngine",
    "ProcessorEngine",
    "TransformersEmbeddingEngine",
    "TransformersEngine",
    "VLLMEmbeddingEngine",
    "VLLMEngine",
    "engine_names",
    "find_engine",
    "get_engine",
    "register",
]
