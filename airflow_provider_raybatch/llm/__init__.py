"""LLM and VLM stages that run where Ray runs (no Airflow import; torch, transformers, vLLM and
Ray are imported only inside what runs on Ray).

- :mod:`.config`: ``ChatTask`` (what to ask), ``EngineConfig`` (which engine), ``build_stages``.
- :mod:`.images`: the image stage (decode, check, resize; rejects invalid images).
- :mod:`.prompts`: chat messages from rows.
- :mod:`.transformers_engine`: the Hugging Face ``generate`` engine (a batch predictor).
- :mod:`.processors`: the vLLM and OpenAI-compatible engines (``ray.data.llm`` processors).
"""
