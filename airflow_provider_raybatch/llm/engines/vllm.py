"""The ``vllm`` engine: ``ray.data.llm`` with vLLM, on GPUs.

It cannot run on a machine without a GPU and vllm: :meth:`VLLMEngine.preflight` refuses that
with a clear error instead of Ray's silent 30-minute wait for a GPU.
"""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.llm.engines.base import ProcessorEngine, register
from airflow_provider_raybatch.pipeline.errors import ConfigError

if TYPE_CHECKING:
    from airflow_provider_raybatch.llm.config import ChatTask, EngineConfig
    from airflow_provider_raybatch.pipeline.resources import ReplicaResources


@register
class VLLMEngine(ProcessorEngine):
    """vLLM through ``vLLMEngineProcessorConfig``: chat template, tokenize, vLLM, detokenize (and
    the multimodal stage for images). GPUs per replica are tensor x pipeline parallel size."""

    name = "vllm"
    # The factory stays where outputs planned before engine classes recorded it (their job signature).
    predictor = "airflow_provider_raybatch.llm.processors:build_vllm_transform"
    engine_stage = "vLLMEngineStage"

    def default_gpus(self, config: EngineConfig) -> float:
        kwargs = config.engine_kwargs
        return float(kwargs.get("tensor_parallel_size", 1) * kwargs.get("pipeline_parallel_size", 1))

    def validate(self, task: ChatTask, config: EngineConfig, resources: ReplicaResources) -> None:
        super().validate(task, config, resources)
        parallel = self.default_gpus(config)
        if resources.num_gpus != parallel:
            raise ConfigError(
                f"engine='vllm' uses tensor_parallel_size x pipeline_parallel_size = {parallel:g} GPU(s) per replica; "
                f"num_gpus={resources.num_gpus:g} disagrees (leave num_gpus unset, or set engine_kwargs)"
            )
        if parallel > 1 and (resources.memory or resources.resources):
            # Such a replica is a placement group of vLLM workers, not one actor that could reserve them.
            raise ConfigError(
                "engine='vllm' reserves memory and custom resources only for one GPU per replica "
                f"(tensor x pipeline parallel size 1, here {parallel:g})"
            )

    def preflight(
        self,
        config: EngineConfig,
        resources: ReplicaResources,
        find_spec: Callable[[str], Any] = importlib.util.find_spec,
    ) -> None:
        """Refuse what would otherwise wait silently: no vllm where the job runs, or too few GPUs.

        :param find_spec: where vllm is looked up (a test gives one that finds it).
        """
        import ray

        if find_spec("vllm") is None:
            raise ConfigError(
                f"engine='vllm' needs the vllm package where the job runs, and it cannot be imported on "
                f"{socket.gethostname()}: install airflow-provider-raybatch[vllm] there (CUDA only), or use "
                "engine='transformers' (CPU or GPU) or engine='openai'"
            )
        needed = resources.num_gpus * resources.min_replicas
        gpus = ray.cluster_resources().get("GPU", 0)
        if needed > gpus:
            raise ConfigError(
                f"engine='vllm' needs {needed:g} GPU(s) (num_gpus / tensor x pipeline parallel size x concurrency) "
                f"but the Ray cluster has {gpus:g}; vLLM would wait for them silently"
            )

    def processor_config(self, task: ChatTask, config: EngineConfig, resources: ReplicaResources) -> Any:
        from ray.data.llm import vLLMEngineProcessorConfig

        return vLLMEngineProcessorConfig(
            model_source=config.model,
            engine_kwargs=dict(config.engine_kwargs),
            batch_size=resources.batch_size,
            concurrency=resources.concurrency,
            accelerator_type=resources.accelerator_type,
            # Per-row failures become rejects (bounded by max_error_fraction), not a failed job.
            should_continue_on_error=True,
            # Images arrive as OpenAI image_url parts holding a base64 data URL.
            prepare_multimodal_stage={"enabled": task.image_column is not None},
            chat_template_stage=True,
            tokenize_stage=True,
            detokenize_stage=True,
        )

    def request(self, task: ChatTask, config: EngineConfig, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {"messages": messages, "sampling_params": sampling_params(task)}

    def answer(self, task: ChatTask, row: dict[str, Any]) -> tuple[str | None, str | None]:
        return row.get("generated_text"), None


def sampling_params(task: ChatTask) -> dict[str, Any]:
    """vLLM sampling parameters; ``choices`` become structured outputs (vLLM only emits one of them)."""
    params = dict(task.sampling_params)
    if task.choices:
        params["structured_outputs"] = {"choice": list(task.choices)}
    return params
