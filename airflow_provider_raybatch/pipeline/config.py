"""Typed configuration of a batch inference run (plain dataclasses: no Ray, no Airflow)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

from airflow_provider_raybatch.pipeline.described import described, param_docs
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.resources import ReplicaResources, is_int, is_number

#: Name of the row key written when ``id_column`` is None: ``file_index * 2**40 + row_in_file``,
#: where ``file_index`` is the file's position in the plan's sorted file list.
ROW_ID_COLUMN = "_row_id"

#: Seconds without a heartbeat after which a writer's lease may be taken over: long enough that a
#: loaded host or a slow object store never loses a live writer's lease, short enough that a retry
#: on another host after a lost worker waits only about as long as Airflow's default retry delay.
DEFAULT_LEASE_TIMEOUT_S = 120.0
#: The shortest lease_timeout accepted. A writer renews its lease every lease_timeout/4 and stops
#: by itself once it could not for lease_timeout/2: at 30 s, a heartbeat every 7.5 s and 15 s for a
#: late one, as long as one stalled request takes to time out in s3fs (its read timeout). Shorter,
#: a single slow request on a busy object store would stop a healthy writer, and a second writer
#: could take over a holder that is merely waiting on the store.
MIN_LEASE_TIMEOUT_S = 30.0
#: Seconds without a committed range or a batch reaching the driver after which a run fails as
#: stalled (:mod:`~airflow_provider_raybatch.pipeline.execution.watchdog`): far beyond any sane batch, but
#: a hung predictor no longer holds a task until ``execution_timeout`` (or forever without one).
DEFAULT_PROGRESS_TIMEOUT_S = 3600.0
BATCH_FORMATS = ("numpy", "pandas", "pyarrow")
MODES = ("resume", "overwrite")
#: What an output can be: a folder of Parquet files, or a table of one of the lakehouse formats.
OUTPUT_FORMATS = ("parquet", "delta", "iceberg")


def check_output_format(value: str, allowed: tuple[str, ...] = OUTPUT_FORMATS) -> None:
    """Refuse an output format other than ``allowed``, naming the argument and every format."""
    if value not in allowed:
        raise ConfigError(f"output_format must be one of {OUTPUT_FORMATS}, got {value!r}")


#: Seconds between a table output's commits while a run appends (see :class:`TableOutput`).
DEFAULT_TABLE_COMMIT_INTERVAL_S = 60.0


@dataclass
class Stage(ReplicaResources):
    """One model (or preprocessing step) applied with Ray Data ``map_batches``.

    Its replicas' resources are the keyword arguments of
    :class:`~airflow_provider_raybatch.pipeline.resources.ReplicaResources`, described there (and last below).

    :param predictor: a class (constructed once per replica with ``predictor_kwargs``) or a
        function (called with each batch and ``predictor_kwargs``), or its import path
        ``"package.module:Name"``. It takes a batch (``dict`` of numpy arrays by default) and
        returns a batch with the same number of rows.
    :param predictor_kwargs: constructor kwargs for a class, extra kwargs for a function.
    :param name: shown in logs and errors; defaults to the predictor's name.
    :param batch_format: what the predictor receives: ``"numpy"``, ``"pandas"`` or ``"pyarrow"``.
    :param input_columns: input columns this stage reads; for the first stage they are checked
        against the input before Ray starts, so a typo fails at once with the columns that exist.
    """

    predictor: str | Callable[..., Any] | type
    predictor_kwargs: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    batch_format: Literal["numpy", "pandas", "pyarrow"] = "numpy"
    input_columns: list[str] | None = None

    #: How :meth:`to_spec` records the stage's type; :meth:`from_spec` builds it back.
    kind: ClassVar[str] = "batch"
    # Airflow renders templates inside objects that declare template_fields.
    template_fields = ("predictor_kwargs",)

    @property
    def display_name(self) -> str:
        if self.name:
            return self.name
        if isinstance(self.predictor, str):
            return self.predictor.replace(":", ".").rsplit(".", 1)[-1]
        return getattr(self.predictor, "__name__", type(self.predictor).__name__)

    def validate(self) -> None:
        where = f"stage {self.display_name!r}"
        super().validate(where)
        if self.batch_format not in BATCH_FORMATS:
            raise ConfigError(f"{where}: batch_format must be one of {BATCH_FORMATS}, got {self.batch_format!r}")
        if self.max_concurrent_batches is not None and self.kind == Stage.kind:
            raise ConfigError(
                f"{where}: max_concurrent_batches is for engines that overlap batches (engine='vllm'); "
                "a predictor's replica scores one batch at a time"
            )
        if not isinstance(self.predictor_kwargs, dict):
            raise ConfigError(f"{where}: predictor_kwargs must be a dict, got {type(self.predictor_kwargs).__name__}")

    def signature(self) -> dict[str, Any]:
        """What decides this stage's output: recorded with the plan to refuse mixing results."""
        predictor = self.predictor
        if not isinstance(predictor, str):
            predictor = f"{getattr(predictor, '__module__', '?')}:{getattr(predictor, '__qualname__', repr(predictor))}"
        return {
            "predictor": predictor,
            "predictor_kwargs": _jsonable(self.predictor_kwargs),
            "batch_format": self.batch_format,
        }

    def to_spec(self) -> dict[str, Any]:
        """A JSON-serialisable form, for running on a cluster: the predictor by import path."""
        spec = {"kind": self.kind, **{f.name: getattr(self, f.name) for f in fields(self)}}
        spec["predictor"] = import_path(self.predictor, f"stage {self.display_name!r}")
        spec["concurrency"] = list(self.concurrency) if isinstance(self.concurrency, tuple) else self.concurrency
        _check_json(spec["predictor_kwargs"], f"stage {self.display_name!r}: predictor_kwargs")
        return spec

    @staticmethod
    def from_spec(spec: dict[str, Any]) -> Stage:
        """The stage (a :class:`Stage` or a :class:`TransformStage`) that :meth:`to_spec` described."""
        spec = dict(spec)
        kind = spec.pop("kind", Stage.kind)
        kinds = {cls.kind: cls for cls in (Stage, TransformStage)}
        if kind not in kinds:
            raise ConfigError(f"unknown stage kind {kind!r} in a spec; known: {sorted(kinds)}")
        stage = kinds[kind](**spec)
        if isinstance(stage.concurrency, list):
            stage.concurrency = (stage.concurrency[0], stage.concurrency[1])
        return stage


@dataclass
class TransformStage(Stage):
    """A stage applied to the whole dataset, such as a ``ray.data.llm`` processor.

    Its ``predictor`` is not a batch UDF but a factory ``fn(stage)`` (a function, or its import
    path) called once on the driver; it returns a dataset transform ``ds -> ds``, applied as it
    is. The transform must carry the columns whose names start with ``__raybatch_`` through to
    its output unchanged and must leave rows whose ``__raybatch_reject`` is set unprocessed. The
    stage's resources are those its main step reserves (what the resource check counts); the
    factory reads them from the stage it is given.
    """

    kind: ClassVar[str] = "transform"

    def validate(self) -> None:
        super().validate()
        if self.concurrency is None:
            raise ConfigError(
                f"stage {self.display_name!r}: a transform stage needs its concurrency (an int or (min, max)); "
                "None (as many replicas as the CPUs hold) is for batch stages"
            )
        if isinstance(self.predictor, type):
            raise ConfigError(
                f"stage {self.display_name!r}: a transform stage takes a factory function fn(stage), not a class"
            )

    def signature(self) -> dict[str, Any]:
        # The key that outputs planned when this was a flag of Stage recorded: they stay resumable.
        return {**super().signature(), "transform": True}


@dataclass
class TableOutput:
    """An output that is a Delta Lake or Apache Iceberg table (see :mod:`~airflow_provider_raybatch.pipeline.tables`).

    The run's rows are staged as a Parquet output of their own under the table's location, then
    join the table in table commits that each add whole ranges, exactly once.
    """

    format: Literal["delta", "iceberg"] = described('``"delta"`` or ``"iceberg"``.')
    partition: dict[str, str] = described(
        'the table\'s partition this run writes, column -> value (``{"ds": "2026-11-24"}``): every row written '
        'gets the column; ``mode="overwrite"`` replaces exactly this partition.'
    )
    writer: str = described(
        'names the task writing (e.g. ``"<dag id>.<task id>"``): with ``partition`` it identifies the writer\'s '
        "commits in the table, across tries and runs."
    )
    identifier: str | None = described("the Iceberg table (``namespace.table``).", default=None)
    catalog: dict[str, Any] = described(
        "the Iceberg catalog's pyiceberg properties (``type``, ``uri``, ``warehouse``...); never logged or sent "
        "in a job spec (it may hold a password).",
        default_factory=dict,
        repr=False,
    )
    commit_interval: float = described(
        'seconds between a table\'s commits while a run appends (``mode="resume"``); each adds every range '
        "committed since the last. An overwrite makes one commit at its end.",
        default=DEFAULT_TABLE_COMMIT_INTERVAL_S,
    )
    add_columns: bool = described(
        "when the output has columns the existing table lacks, and only that (every column of the table still "
        "written, with its type), add them to the table (nullable: its earlier rows read null in them) before "
        "the run's rows join it. False: a run whose columns differ from the table's in any way fails with "
        "``OutputSchemaError`` naming them. Once added, a column is part of the table: every later run must "
        "write it.",
        default=False,
    )
    generation: int | None = described(
        "set on the tasks of a mapped run (from their planned shard): the generation that its planning "
        "task chose, which they write together (None: the run chooses).",
        default=None,
    )

    def validate(self) -> None:
        check_output_format(self.format, OUTPUT_FORMATS[1:])
        if not isinstance(self.partition, dict) or not self.partition:
            raise ConfigError(
                f"a {self.format} output needs its partition (e.g. {{'ds': '2026-11-24'}}), got {self.partition!r}"
            )
        for column, value in self.partition.items():
            if not _is_column_list([column]) or not isinstance(value, str) or not value or "/" in value:
                raise ConfigError(
                    f"partition {column!r}={value!r}: the partition column must be a name and its value a "
                    "non-empty string without '/' (e.g. '{{ ds }}')"
                )
        if not self.writer:
            raise ConfigError("a table output needs the name of its writer")
        if self.format == "iceberg" and (not self.identifier or "." not in self.identifier):
            raise ConfigError(f"an iceberg output needs table='namespace.table', got {self.identifier!r}")
        if not _is_seconds(self.commit_interval):
            raise ConfigError(f"commit_interval must be a number of seconds > 0, got {self.commit_interval!r}")
        if not isinstance(self.add_columns, bool):
            raise ConfigError(f"add_columns must be True or False, got {self.add_columns!r}")

    def to_spec(self) -> dict[str, Any]:
        """As :meth:`BatchInferenceConfig.to_spec`: without the catalog's properties."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "catalog"}


@dataclass
class BatchInferenceConfig:
    """A batch inference run: Parquet in, one or more stages, Parquet out, checkpointed by range.

    The operators take the same arguments, described once here (see :mod:`~airflow_provider_raybatch.pipeline.described`).
    """

    input_path: str = described(
        "a Parquet file, folder or glob: local, ``s3://``, ``gs://``, ``abfs://`` / ``az://`` or any fsspec URL."
    )
    output_path: str = described(
        "the output folder; bookkeeping lives in ``<output_path>/_raybatch/``. It must not overlap the input "
        "(compared after resolving ``..`` and symlinks, in both directions) and must not be an existing file. "
        "For a Delta table, the table's root; for an Iceberg table, its location (where its files go)."
    )
    stages: list[Stage] = described("the stages, applied in order; each sees the previous one's output.")
    columns: list[str] | None = described("input columns to read (None: all).", default=None)
    keep_columns: list[str] | None = described(
        "input columns written to the output (None: every column read).", default=None
    )
    id_column: str | None = described(
        "a unique row key of the input, always written; None writes ``_row_id`` derived from (file, row).",
        default=None,
    )
    rows_per_range: int = described("rows per checkpointed range (cut at row-group boundaries).", default=100_000)
    mode: Literal["resume", "overwrite"] = described(
        '``"resume"`` (default) skips committed ranges; ``"overwrite"`` starts the output afresh once per run '
        "(``run_key``; for a task, once per DAG run): a retry of the same run resumes what that run committed.",
        default="resume",
    )
    run_key: str | None = described("identifies the run that asked (e.g. Airflow dag/run/task ids).", default=None)
    max_rows: int | None = described(
        "a smoke run: process only the input's first ``max_rows`` rows. Recorded with the output (part of the "
        "job signature), so a limited output is never resumed or completed by a full run: give smoke runs "
        "their own output path.",
        default=None,
    )
    range_ids: list[str] | None = described(
        "process only these ranges of an output already planned by "
        ":func:`~airflow_provider_raybatch.pipeline.shards.plan_shards` (one shard of a mapped "
        "run); None: every range.",
        default=None,
    )
    storage_options: dict[str, Any] = described(
        "fsspec options for both paths (credentials); never logged or saved.", default_factory=dict, repr=False
    )
    max_error_fraction: float = described(
        "the largest share of the rows reaching a model that may fail (rows a stage rejects with "
        "``engine_error``, which go to the rejects, over those rows plus the rows written) before the run "
        "fails with ``TooManyErrorsError``, which is not retried: a retry would count the same committed "
        "errors. Rows rejected as invalid input never reached a model and do not count.",
        default=0.01,
    )
    try_number: int | None = described("the Airflow try running it, named in the output's writer lease.", default=None)
    lease_timeout: float = described(
        "seconds without a heartbeat after which another writer may take over the output's writer lease from "
        "a silent one (a frozen or lost worker). While a writer's lease is live, a second writer on the same "
        "output fails at once (retryably) naming it. At least 30 s; recorded with the lease: each writer is "
        "judged by its own (see :mod:`~airflow_provider_raybatch.pipeline.commit.lease`).",
        default=DEFAULT_LEASE_TIMEOUT_S,
    )
    progress_timeout: float | None = described(
        "seconds in which the pipeline must commit a range or deliver a batch. Past it (a predictor hung on a "
        "batch) the try fails with a retryable ``NoProgressError`` naming the stage that holds the unfinished "
        "batches and the last commit, and Ray's processes of the try are stopped; a retry resumes after the "
        "committed ranges (see :mod:`~airflow_provider_raybatch.pipeline.execution.watchdog`). Default one "
        "hour; None: no limit (Ray Data's own no-progress guard is off then too).",
        default=DEFAULT_PROGRESS_TIMEOUT_S,
    )
    table: TableOutput | None = described(
        "the Delta or Iceberg table the output is (``output_path`` is then the table's root, or location); "
        "None: a Parquet folder.",
        default=None,
    )

    def validate(self) -> None:
        if not self.input_path:
            raise ConfigError("input_path is empty")
        if not self.output_path:
            raise ConfigError("output_path is empty")
        if not self.stages:
            raise ConfigError("no stage given: set predictor or stages")
        for stage in self.stages:
            stage.validate()
        if not is_int(self.rows_per_range) or self.rows_per_range < 1:
            raise ConfigError(f"rows_per_range must be an integer >= 1, got {self.rows_per_range!r}")
        if self.max_rows is not None and (not is_int(self.max_rows) or self.max_rows < 1):
            raise ConfigError(f"max_rows must be an integer >= 1 or None, got {self.max_rows!r}")
        if self.range_ids is not None and (isinstance(self.range_ids, str) or not self.range_ids):
            raise ConfigError(f"range_ids must be a non-empty list of range ids or None, got {self.range_ids!r}")
        if not _is_seconds(self.lease_timeout) or self.lease_timeout < MIN_LEASE_TIMEOUT_S:
            raise ConfigError(
                f"lease_timeout must be a number of seconds >= {MIN_LEASE_TIMEOUT_S:g}, got {self.lease_timeout!r} "
                "(a writer renews its lease every lease_timeout/4 and stops after lease_timeout/2 without "
                "renewing it: shorter, one slow request to an object store would stop a healthy writer)"
            )
        if self.progress_timeout is not None and not _is_seconds(self.progress_timeout):
            raise ConfigError(
                f"progress_timeout must be a number of seconds > 0 or None, got {self.progress_timeout!r}"
            )
        # Also refuses NaN, which every comparison would let through.
        if not is_number(self.max_error_fraction) or not 0 <= self.max_error_fraction <= 1:
            raise ConfigError(f"max_error_fraction must be a number between 0 and 1, got {self.max_error_fraction!r}")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("columns", "keep_columns"):
            value = getattr(self, name)
            if value is not None and not _is_column_list(value):
                raise ConfigError(f"{name} must be a list of distinct column names, got {value!r}")
        if self.columns is not None and self.keep_columns is not None:
            missing = [c for c in self.keep_columns if c not in self.columns]
            if missing:
                raise ConfigError(f"keep_columns {missing} are not among columns {self.columns}")
        if self.table is not None:
            self.table.validate()
            if (self.range_ids is None) != (self.table.generation is None):
                raise ConfigError(
                    f"a mapped shard of a {self.table.format} output needs both its range_ids and the "
                    "generation its planning task chose: pass the shard plan_shards returned"
                )

    def to_spec(self) -> dict[str, Any]:
        """A JSON-serialisable form without ``storage_options``: credentials never travel with it."""
        spec = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "storage_options"}
        spec["stages"] = [stage.to_spec() for stage in self.stages]
        spec["table"] = None if self.table is None else self.table.to_spec()
        return spec

    @classmethod
    def from_spec(cls, spec: dict[str, Any], storage_options: dict[str, Any] | None = None) -> BatchInferenceConfig:
        spec = dict(spec)
        spec["stages"] = [Stage.from_spec(stage) for stage in spec["stages"]]
        if spec.get("table") is not None:
            spec["table"] = TableOutput(**spec["table"])
        return cls(**spec, storage_options=storage_options or {})

    def job_signature(self) -> dict[str, Any]:
        """The settings whose change would mix incompatible results in one output."""
        return {
            "stages": [stage.signature() for stage in self.stages],
            "columns": self.columns,
            "keep_columns": self.keep_columns,
            "id_column": self.id_column,
            "rows_per_range": self.rows_per_range,
            # Absent (None) in outputs planned before max_rows existed: they compare equal.
            "max_rows": self.max_rows,
        }


Stage.__doc__ = Stage.__doc__.rstrip() + param_docs(ReplicaResources)
TableOutput.__doc__ += param_docs(TableOutput)
BatchInferenceConfig.__doc__ += param_docs(BatchInferenceConfig)


def _is_seconds(value: Any) -> bool:
    """A finite number > 0: infinity is no limit, which None says; NaN compares false with everything."""
    return is_number(value) and math.isfinite(value) and value > 0


def _is_column_list(value: Any) -> bool:
    """A list (or tuple) of distinct, non-empty column names: a string is not one (it is a name's letters)."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(name, str) and name for name in value):
        return False
    return len(set(value)) == len(value)


def import_path(obj: Any, where: str) -> str:
    """``"module:QualName"`` of a module-level class or function (how a cluster imports it)."""
    if isinstance(obj, str):
        return obj
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<locals>" in qualname:
        raise ConfigError(
            f"{where}: {obj!r} cannot be imported by name on a Ray cluster; define it at module level "
            "in a package the cluster can import, or pass its import path 'package.module:Name'"
        )
    return f"{module}:{qualname}"


def _check_json(value: Any, where: str) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where} must be JSON-serialisable to run on a Ray cluster: {e}") from e


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=repr))
