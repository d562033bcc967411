"""An engine added in one file, as a user would add one: a text-generation server's ``/generate``
API (as Hugging Face TGI serves it), through Ray's HTTP processor. The registry tests use it."""

from __future__ import annotations

from typing import Any

from airflow_provider_raybatch.llm.engines import ProcessorEngine, register
from airflow_provider_raybatch.pipeline import ConfigError


@register
class GenerateEngine(ProcessorEngine):
    """``POST {base_url}/generate`` with ``{"inputs", "parameters"}``, answered ``{"generated_text"}``."""

    name = "tgi"
    predictor = "tests.support.tgi_engine:build_transform"
    engine_stage = "HttpRequestStage"
    needs_endpoint = True
    sampling_params = ("max_tokens", "temperature")

    def validate(self, task, config, resources) -> None:
        super().validate(task, config, resources)
        if task.choices or task.image_column:
            raise ConfigError("engine='tgi' answers text prompts without choices")

    def processor_config(self, task, config, resources) -> Any:
        from ray.data.llm import HttpRequestProcessorConfig

        return HttpRequestProcessorConfig(
            url=config.base_url.rstrip("/") + "/generate",
            batch_size=resources.batch_size,
            concurrency=resources.concurrency,
            max_retries=0,
            http_request_stage={"num_cpus": resources.num_cpus},
        )

    def request(self, task, config, messages) -> dict[str, Any]:
        inputs = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        parameters = {"max_new_tokens": task.sampling_params.get("max_tokens", 16)}
        if "temperature" in task.sampling_params:
            parameters["temperature"] = task.sampling_params["temperature"]
        return {"payload": {"inputs": inputs, "parameters": parameters}}

    def answer(self, task, config, row) -> tuple[str | None, str | None]:
        response = row.get("http_response") or {}
        if response.get("error"):
            return None, f"the server said: {response['error']}"
        return response.get("generated_text"), None


def build_transform(stage):
    from airflow_provider_raybatch.llm.processors import processor_transform

    return processor_transform(GenerateEngine(), stage)
