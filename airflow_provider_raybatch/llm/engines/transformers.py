"""The ``transformers`` engine: a Hugging Face chat model run by ``generate`` in a Ray Data actor.

A batch stage like any other; its predictor is
:class:`~airflow_provider_raybatch.llm.transformers_engine.TransformersChat` (which imports
torch and transformers when a replica starts).
"""

from __future__ import annotations

from airflow_provider_raybatch.llm.engines.base import Engine, register


@register
class TransformersEngine(Engine):
    """Hugging Face ``generate`` on CPU or GPU; ``choices`` by log-likelihood scoring of each choice."""

    name = "transformers"
    predictor = "airflow_provider_raybatch.llm.transformers_engine:TransformersChat"
    #: What the actor maps onto ``generate`` (vLLM-style names).
    sampling_params = ("max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty")
