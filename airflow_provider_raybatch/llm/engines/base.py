"""What an engine is, and the registry that finds one by name.

An engine answers a :class:`~airflow_provider_raybatch.llm.config.ChatTask` (an
:class:`EmbeddingEngine` embeds texts instead, registered apart: see its class). Its class says
everything that differs between engines: which settings it accepts, what its replicas need by
default, how its pipeline stage is built and, for an engine run as a ``ray.data.llm`` processor,
the processor's config and the shapes of a request and an answer. Nothing else compares engine
names. Adding an engine is one module, say ``my_pkg/sglang_engine.py``::

    @register
    class SGLangEngine(ProcessorEngine):
        name = "sglang"
        predictor = "my_pkg.sglang_engine:build_transform"
        engine_stage = "SGLangEngineStage"

        def processor_config(self, task, config, resources): ...  # ray.data.llm's config
        def request(self, task, config, messages): ...  # the processor's input for one row
        def answer(self, task, config, row): ...  # (answer, None) or (None, error) from its output
        def tokens(self, row): ...  # (prompt tokens, generated tokens) of its output, if it counts them


    def build_transform(stage):
        from airflow_provider_raybatch.llm.processors import processor_transform

        return processor_transform(SGLangEngine(), stage)

The DAG file imports the module (registering the engine for the operator); where the pipeline
runs, the stage's predictor path imports it. Engine modules import neither Airflow nor Ray,
torch or vLLM at import time: heavy imports go inside the methods that run on Ray.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_raybatch.pipeline.config import Stage, TransformStage
from airflow_provider_raybatch.pipeline.errors import ConfigError

if TYPE_CHECKING:
    from airflow_provider_raybatch.llm.config import ChatTask, EngineConfig
    from airflow_provider_raybatch.pipeline.resources import ReplicaResources

#: The registered engines by (task, name): an embedding engine may share a chat engine's name.
_ENGINES: dict[tuple[str, str], Engine] = {}
#: The task of the chat engines, which the registry's functions look up unless told another.
CHAT = "chat"
#: The task of the embedding engines (:class:`EmbeddingEngine`).
EMBEDDING = "embedding"


class Engine:
    """One way of answering chat tasks; subclasses are registered with :func:`register`.

    The base builds a batch stage whose predictor, ``predictor``, is constructed once per
    replica with the task and the engine config (``ChatTask.to_dict()``, ``EngineConfig.to_dict()``).
    """

    #: The name users give (``engine="..."``); unique among the engines of its task.
    name: ClassVar[str]
    #: What the engine does: answers chat tasks (:data:`CHAT`) or embeds texts (``"embedding"``).
    task: ClassVar[str] = CHAT
    #: Import path of the stage's predictor. Recorded in the output's job signature: changing it
    #: makes existing outputs refuse to resume.
    predictor: ClassVar[str]
    #: The engine calls an HTTP endpoint: it needs ``base_url`` and reads its API key from the
    #: environment variable ``api_key_env``. The operators take both from an Airflow connection.
    needs_endpoint: ClassVar[bool] = False
    #: The ``sampling_params`` keys the engine understands; None: passed on to the engine as they are.
    sampling_params: ClassVar[tuple[str, ...] | None] = None
    #: The stage's type: a batch predictor here, a transform for a processor engine.
    stage_type: ClassVar[type[Stage]] = Stage
    #: The engine's replicas overlap batches (``max_concurrent_batches`` of the replicas' resources).
    overlaps_batches: ClassVar[bool] = False

    def default_gpus(self, config: EngineConfig) -> float:
        """GPUs per replica when the user gives none."""
        return 0.0

    def validate(self, task: ChatTask, config: EngineConfig, resources: ReplicaResources) -> None:
        """Refuse settings this engine cannot run, without importing anything heavy.

        :param resources: the replicas' resources, from :meth:`replica_resources`.
        """
        if self.sampling_params is not None:
            unknown = sorted(set(task.sampling_params) - set(self.sampling_params))
            if unknown:
                raise ConfigError(
                    f"sampling_params {unknown} are not supported by engine={self.name!r} "
                    f"(supported: {list(self.sampling_params)})"
                )
        if resources.max_concurrent_batches is not None and not self.overlaps_batches:
            raise ConfigError(
                f"max_concurrent_batches is not taken by engine={self.name!r}: its replicas work on one batch at a time"
            )
        if self.needs_endpoint and not config.base_url:
            raise ConfigError(
                f"engine={self.name!r} needs base_url (the connection's host, e.g. https://api.openai.com/v1)"
            )

    def replica_resources(self, config: EngineConfig, resources: ReplicaResources) -> ReplicaResources:
        """The resources the engine's stage reserves: ``num_gpus`` None becomes the engine's default."""
        if resources.num_gpus is None:
            return dataclasses.replace(resources, num_gpus=self.default_gpus(config))
        return resources

    def build_stage(
        self, task: ChatTask, config: EngineConfig, resources: ReplicaResources, input_columns: list[str] | None
    ) -> Stage:
        """The pipeline stage that runs this engine (settings already checked)."""
        return self.stage_type(
            self.predictor,
            {"task": task.to_dict(), "engine": config.to_dict()},
            name=self.name,
            input_columns=input_columns,
            **resources.resource_kwargs(),
        )


class ProcessorEngine(Engine):
    """An engine run as a ``ray.data.llm`` processor, applied to the dataset as a transform stage.

    Its ``predictor`` is a factory ``fn(stage)`` that returns
    :func:`~airflow_provider_raybatch.llm.processors.processor_transform` for the engine. Around
    the processor, that builds the same chat messages for every engine, skips rows rejected
    earlier and turns failed answers into rejects; the engine gives the processor's config and
    the shapes of its requests and answers.
    """

    stage_type = TransformStage
    #: Name of the processor's stage that runs the engine (``Processor.get_stage_by_name``):
    #: the replicas' ``memory`` and custom ``resources`` are reserved there.
    engine_stage: ClassVar[str]

    def preflight(self, config: EngineConfig, resources: ReplicaResources) -> None:
        """Checks on the driver, Ray up, before the processor is built (e.g. the engine is installed)."""

    def processor_config(self, task: ChatTask, config: EngineConfig, resources: ReplicaResources) -> Any:
        """The ``ray.data.llm`` processor config for the task (Ray imported here)."""
        raise NotImplementedError

    def map_kwargs(self, resources: ReplicaResources) -> dict[str, Any]:
        """Ray Data ``map`` arguments of the row mappings around the processor (its preprocess and
        postprocess, and the provider's own): ``{}``, Ray's defaults."""
        return {}

    def request(self, task: ChatTask, config: EngineConfig, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The processor's input fields for one row, given its chat messages."""
        raise NotImplementedError

    def answer(self, task: ChatTask, config: EngineConfig, row: dict[str, Any]) -> tuple[str | None, str | None]:
        """``(answer, None)`` or ``(None, error)`` from one row of the processor's output."""
        raise NotImplementedError

    def tokens(self, row: dict[str, Any]) -> tuple[int | None, int | None]:
        """The prompt and generated tokens one row of the processor's output cost (None: not counted)."""
        return None, None


class EmbeddingEngine(Engine):
    """An engine that embeds texts (an :class:`~airflow_provider_raybatch.llm.config.EmbeddingTask`),
    registered apart from the chat engines: ``transformers`` names one of each.

    Its stage reads the task's ``text_column`` (or ``image_column``, if it ``embeds_images``) and
    returns what :func:`~airflow_provider_raybatch.llm.vectors.embedding_output` makes of its
    vectors, so that every engine (a local model, ``ray.data.llm``'s embedding task, an
    ``/embeddings`` endpoint) writes the same columns, normalised, stored and counted the same way.
    """

    task = EMBEDDING
    #: The engine embeds images too (the task's ``image_column``), with a model that has an image tower.
    embeds_images: ClassVar[bool] = False


def register(cls: type[Engine]) -> type[Engine]:
    """Class decorator: make the engine available by its ``name`` among the engines of its ``task``."""
    known = _ENGINES.get((cls.task, cls.name))
    # The same class imported again (a module loaded twice) replaces itself; another class may not.
    if known is not None and _path(type(known)) != _path(cls):
        raise ValueError(f"an engine named {cls.name!r} is already registered: {_path(type(known))}")
    _ENGINES[(cls.task, cls.name)] = cls()
    return cls


def engine_names(task: str = CHAT) -> tuple[str, ...]:
    """The names of the registered engines of ``task``, sorted."""
    return tuple(sorted(name for kind, name in _ENGINES if kind == task))


def find_engine(name: str, task: str = CHAT) -> Engine | None:
    """The engine of ``task`` registered as ``name``, or None."""
    return _ENGINES.get((task, name)) if isinstance(name, str) else None


def get_engine(name: str, task: str = CHAT) -> Engine:
    """The engine of ``task`` registered as ``name``; an unknown name is a :class:`ConfigError`
    listing the known ones."""
    engine = find_engine(name, task)
    if engine is None:
        among = "" if task == CHAT else f"the {task} engines "
        raise ConfigError(f"engine must be one of {among}{engine_names(task)}, got {name!r}")
    return engine


def _path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"
