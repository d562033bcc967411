"""The chat-model operators with every common argument (docs: operators/vlm.md, operators/llm.md)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

# [START import]
from airflow_provider_raybatch.operators.llm_batch_inference import LLMBatchInferenceOperator
from airflow_provider_raybatch.operators.vlm_caption import VLMCaptionOperator

with DAG(
    dag_id="docs_llm_operators",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    default_args={"retries": 2},
    tags=["raybatch", "docs", "llm"],
):
    # [START vlm]
    VLMCaptionOperator(  # as in Ray's multimodal batch inference guide
        task_id="caption",
        input_path="s3://bucket/images/{{ ds }}/",
        output_path="s3://bucket/captions/{{ ds }}/",
        image_column="jpg",  # bytes, a {"bytes", "path"} struct (Hugging Face datasets), or a path/URL
        model="Qwen/Qwen2.5-VL-3B-Instruct",  # a model id or a local folder
        engine="vllm",  # "vllm" | "transformers" | "openai"
        system_prompt="You are a helpful assistant that generates accurate and descriptive captions for images.",
        prompt="Describe this image in detail. Focus on the main subjects, actions, and setting.",
        image_size=(225, 225),  # resized before the model; None keeps the size
        sampling_params={"temperature": 0.3, "max_tokens": 256},
        engine_kwargs={"max_model_len": 8192},  # vLLM engine args: tensor/pipeline parallel, quantization...
        batch_size=16,
        concurrency=4,
        accelerator_type=None,  # also num_cpus=, num_gpus= (default: the engine's), memory=, ray_resources=
        output_column="generated_caption",
        id_column="id",
        keep_columns=["id"],  # default: none besides the row key; image bytes are not copied
        max_error_fraction=0.01,
        ray_conn_id="ray_default",  # vLLM needs GPUs: a Ray cluster that has them
    )
    # [END vlm]

    # [START llm]
    LLMBatchInferenceOperator(  # as in Ray's text LLM batch inference guide
        task_id="classify",
        input_path="s3://bucket/companies/{{ ds }}/",
        output_path="s3://bucket/industries/{{ ds }}/",
        system_prompt="You are a business analyst.",
        prompt="What industry is this company in: {Company}",  # {column} fields filled from each row
        choices=["Technology", "Finance", "Healthcare", "Retail", "Energy"],  # optional: answers are exactly one
        model="Qwen/Qwen2.5-0.5B-Instruct",
        engine="vllm",
        sampling_params={"temperature": 0, "max_tokens": 16},
        output_column="industry",
        id_column="id",
        keep_columns=["id", "Company"],
        ray_conn_id="ray_default",
    )
    # [END llm]

    # [START openai]
    LLMBatchInferenceOperator(
        task_id="summarise",
        input_path="s3://bucket/reviews/{{ ds }}/",
        output_path="s3://bucket/summaries/{{ ds }}/",
        prompt="Summarise this review in one sentence: {review}",
        model="gpt-4o-mini",  # the served model's name
        engine="openai",  # any OpenAI-compatible /chat/completions endpoint
        openai_conn_id="openai_default",  # host: the base URL; password: the API key
        api_key_env="RAYBATCH_OPENAI_API_KEY",  # how the key reaches the pipeline's driver
        engine_kwargs={"max_retries": 3, "qps": 5},
        sampling_params={"temperature": 0.2, "max_tokens": 64},
        output_column="summary",
        id_column="id",
        concurrency=2,  # requests in flight come from the replicas: no GPU needed
    )
    # [END openai]
