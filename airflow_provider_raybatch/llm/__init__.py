"""LLM and VLM stages that run where Ray runs (no Airflow import; torch, transformers, vLLM and
Ray are imported only inside what runs on Ray).

- :mod:`.config`: ``ChatTask`` (what to ask) and ``EngineConfig`` (which engine, which model).
- :mod:`.build`: ``build_stages``: the checks every engine shares, then the engine's stage.
- :mod:`.engines`: one module per engine (``vllm``, ``transformers``: its engine and its ``generate`` actor, ``openai``), found by name.
- :mod:`.images`: the image stage (decode, check, resize; rejects invalid images).
- :mod:`.prompts`: chat messages from rows.
- :mod:`.processors`: what the ``ray.data.llm`` engines share (requests, answers, rejects).
"""
