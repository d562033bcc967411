"""The wrapper Ray Data runs around each user predictor (:class:`StageWorker`), and what becomes
of rows a stage rejects. Rows carry internal columns through the stages (:mod:`airflow_provider_raybatch.pipeline.columns`)."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_raybatch.pipeline.columns import (
    COUNTED_COLUMNS,
    ENGINE_ERROR,
    INTERNAL_PREFIX,
    KEEP_PREFIX,
    RANGE_COLUMN,
    REJECT_COLUMN,
    REJECT_COLUMNS,
    REJECT_KIND_COLUMN,
)
from airflow_provider_raybatch.pipeline.config import Stage
from airflow_provider_raybatch.pipeline.errors import ConfigError, StageError
from airflow_provider_raybatch.pipeline.execution.predictors import resolve_predictor
from airflow_provider_raybatch.pipeline.execution.scored_rows import ScoredRowsReporter
from airflow_provider_raybatch.pipeline.execution.tensors import output_to_table, table_to_numpy

#: Environment variable: the bytes of scored rows a replica holds at most before handing them on,
#: even within a range (:data:`DEFAULT_HAND_ON_BYTES`).
HAND_ON_BYTES_ENV = "RAYBATCH_HAND_ON_BYTES"
#: Half of Ray Data's target block size. A range of decoded images (600 kB each as float32) would
#: otherwise be handed to the next stage only once all of it is decoded: the model waited for
#: whole 500-image ranges (benchmarks/images.py), and the replica held them in memory. Tabular
#: rows stay well under it, so their ranges still go on, and are written, whole.
DEFAULT_HAND_ON_BYTES = 64 * 2**20


def hand_on_bytes() -> int:
    """:data:`DEFAULT_HAND_ON_BYTES`, or the value of :data:`HAND_ON_BYTES_ENV`."""
    value = os.environ.get(HAND_ON_BYTES_ENV, "").strip()
    if not value:
        return DEFAULT_HAND_ON_BYTES
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{HAND_ON_BYTES_ENV} must be a number of bytes >= 1, got {value!r}")
    return int(value)


class StageWorker:
    """The callable class Ray Data runs per replica: builds the predictor once, then maps batches."""

    def __init__(self, stage: Stage, scored_prefix: str | None = None):
        """:param stage: the stage this replica runs.
        :param scored_prefix: for the last stage, where it reports the rows it scored
            (:class:`.scored_rows.ScoredRows`); None: it does not report.
        """
        self.name = stage.display_name
        self.scored = None if scored_prefix is None else ScoredRowsReporter(scored_prefix)
        self.batch_format = stage.batch_format
        # Replicas on CPUs get whole blocks from Ray Data (see the runner) and slice them here.
        self.rows_per_call = stage.batch_size if stage.cpus_only else None
        self.hand_on_bytes = hand_on_bytes()
        if _in_ray_actor():
            # Before the predictor is built: one that sets its own thread count keeps it.
            match_threads(replica_threads(stage.num_cpus))
        target = resolve_predictor(stage)
        if inspect.isclass(target):
            self.fn, self.kwargs = target(**stage.predictor_kwargs), {}
        else:
            self.fn, self.kwargs = target, dict(stage.predictor_kwargs)

    def __call__(self, table: pa.Table) -> Iterator[pa.Table]:
        size = self.rows_per_call
        if not size or table.num_rows <= size:
            yield self._score(table)
            return
        # A whole block may hold many ranges (one read task reads a row group's): each run of
        # whole ranges of about a batch goes on as soon as it is scored, so that its ranges are
        # written and committed while the rest of the block is scored. Large rows (decoded
        # images) go on every hand_on_bytes, within a range too: the next stage starts sooner
        # and a replica never holds a whole range of them; a range in several blocks is committed
        # once all of them are written, as the blocks a GPU stage's batches make.
        start = 0
        for end in _cuts_between_ranges(table, size):
            part = table.slice(start, end - start)
            scored: list[pa.Table] = []
            held = 0
            for i in range(0, part.num_rows, size):
                scored.append(self._score(part.slice(i, size)))
                held += scored[-1].nbytes
                if held >= self.hand_on_bytes and i + size < part.num_rows:
                    yield self._join(scored)
                    scored, held = [], 0
            yield self._join(scored)
            start = end

    def _join(self, scored: list[pa.Table]) -> pa.Table:
        try:
            # As Ray Data joins batches into a block: missing columns become nulls, numbers widen.
            return pa.concat_tables(scored, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise StageError(f"stage {self.name!r} returned batches whose columns do not fit together: {e}") from e

    def _score(self, table: pa.Table) -> pa.Table:
        scored = self._score_rows(table)
        if self.scored is not None:
            self.scored.add(table.num_rows)
        return scored

    def _score_rows(self, table: pa.Table) -> pa.Table:
        table, rejected = split_rejected(table)
        if table.num_rows == 0:
            return rejected
        internal = [c for c in table.column_names if c.startswith(INTERNAL_PREFIX)]
        user = table.drop_columns(internal)
        if self.batch_format == "numpy":
            batch: Any = table_to_numpy(user)
        elif self.batch_format == "pandas":
            batch = user.to_pandas()
        else:
            batch = user
        result = output_to_table(self.fn(batch, **self.kwargs), self.name, table.num_rows)
        result, reasons, kinds = self._take_rejects(result)
        result, counts = self._take_counts(result)
        for name in internal:
            if name not in REJECT_COLUMNS:
                column = table.column(name)
                if name in counts:  # an earlier stage counted the rows too: a row's counts add up
                    column = add_counts(column, counts.pop(name))
                result = result.append_column(name, column)
        for name, column in counts.items():
            result = result.append_column(name, column)
        if reasons is not None:
            result = result.append_column(REJECT_COLUMN, reasons).append_column(REJECT_KIND_COLUMN, kinds)
        if rejected.num_rows == 0:
            return result
        # Rows rejected earlier pass by with nulls in this stage's output columns.
        return pa.concat_tables([result, rejected], promote_options="default")

    def _take_counts(self, result: pa.Table) -> tuple[pa.Table, dict[str, pa.ChunkedArray]]:
        """The stage's output without its counted columns, and those (int64; null: not counted)."""
        counts = {}
        for name in COUNTED_COLUMNS:
            if name in result.column_names:
                try:
                    counts[name] = result.column(name).cast(pa.int64())
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                    raise StageError(f"stage {self.name!r}: {name} must hold counts (integers) or None: {e}") from e
        return result.drop_columns(list(counts)), counts

    def _take_rejects(self, result: pa.Table) -> tuple[pa.Table, pa.Array | None, pa.Array | None]:
        bad = [
            c
            for c in result.column_names
            if c.startswith(INTERNAL_PREFIX) and c not in REJECT_COLUMNS and c not in COUNTED_COLUMNS
        ]
        if bad:
            raise StageError(f"stage {self.name!r} returned internal column(s) {bad}; rename them")
        outputs = result.drop_columns([c for c in REJECT_COLUMNS if c in result.column_names])
        if REJECT_COLUMN not in result.column_names:
            return outputs, None, None
        try:
            reasons = result.column(REJECT_COLUMN).cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise StageError(f"stage {self.name!r}: {REJECT_COLUMN} must hold reason strings or None: {e}") from e
        kinds: Any = ENGINE_ERROR
        if REJECT_KIND_COLUMN in result.column_names:
            kinds = pc.coalesce(result.column(REJECT_KIND_COLUMN).cast(pa.string()), ENGINE_ERROR)
        return outputs, reasons, pc.if_else(pc.is_valid(reasons), kinds, pa.scalar(None, pa.string()))


def replica_threads(num_cpus: float) -> int:
    """Threads for a replica's math and Arrow libraries: the CPUs it reserves, as Ray counts them
    for ``OMP_NUM_THREADS`` (whole CPUs, at least one); an ``OMP_NUM_THREADS`` the task's
    environment sets wins."""
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return max(1, int(num_cpus))


def match_threads(threads: int) -> None:
    """Have torch (where a worker imported it already) and Arrow use ``threads`` threads.

    Ray sets ``OMP_NUM_THREADS`` to a replica's CPUs when the replica starts, but a library
    loaded before that, in a warm worker that imported the predictor's modules ahead, sized its
    thread pool for every core of the host: two replicas on two CPUs then ran four busy torch
    threads, and a light model's matrix products took several times as long (benchmarks/RESULTS.md 1g).
    """
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads") and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if pa.cpu_count() > threads:
        pa.set_cpu_count(threads)


def _in_ray_actor() -> bool:
    """Whether this process is a Ray actor's worker (a replica), not a driver or a test calling a stage."""
    ray = sys.modules.get("ray")
    try:
        return ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # noqa: BLE001 - an optimisation only: without Ray's answer, leave the threads alone
        return False


def _cuts_between_ranges(table: pa.Table, rows: int) -> list[int]:
    """Row positions that cut ``table`` (rows in range order) into runs of whole ranges, each of
    at least ``rows`` rows but the last."""
    if RANGE_COLUMN not in table.column_names:
        return [table.num_rows]
    ranges = table.column(RANGE_COLUMN).to_numpy()
    cuts, last = [], 0
    for boundary in [*(np.flatnonzero(ranges[1:] != ranges[:-1]) + 1), table.num_rows]:
        if boundary - last >= rows or boundary == table.num_rows:
            cuts.append(int(boundary))
            last = boundary
    return cuts


def add_counts(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    """Two stages' counts of the same rows, added; null where neither counted."""
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    total = pc.add(pc.fill_null(a.cast(pa.int64()), 0), pc.fill_null(b.cast(pa.int64()), 0))
    return pc.if_else(both_null, pa.scalar(None, pa.int64()), total)


def count_sums(table: pa.Table) -> dict[str, int | None]:
    """The sums of ``table``'s counted columns, by their keys (None: no row of it was counted)."""
    sums: dict[str, int | None] = {}
    for name, key in COUNTED_COLUMNS.items():
        column = table.column(name) if name in table.column_names else None
        counted = column is not None and column.null_count < len(column)
        sums[key] = int(pc.sum(column).as_py()) if counted else None
    return sums


def split_rejected(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(accepted rows, rejected rows); rejected rows keep only their internal columns."""
    if REJECT_COLUMN not in table.column_names or table.column(REJECT_COLUMN).null_count == table.num_rows:
        return table, _NO_ROWS
    valid = pc.is_valid(table.column(REJECT_COLUMN))
    internal = [c for c in table.column_names if c.startswith(INTERNAL_PREFIX)]
    return table.filter(pc.invert(valid)), table.filter(valid).select(internal)


def rejects_table(rejected: pa.Table) -> pa.Table:
    """What the rejects output holds: the row key and kept columns (not binary ones), reason, kind."""
    names, columns = [], []
    for name in rejected.column_names:
        if name.startswith(KEEP_PREFIX):
            column = rejected.column(name)
            if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
                continue  # image bytes and the like: the rejects name the row, they do not copy it
            names.append(name[len(KEEP_PREFIX) :])
            columns.append(column)
    kinds = (
        rejected.column(REJECT_KIND_COLUMN)
        if REJECT_KIND_COLUMN in rejected.column_names
        else pa.array([ENGINE_ERROR] * rejected.num_rows, pa.string())
    )
    return pa.table(
        columns + [rejected.column(REJECT_COLUMN).cast(pa.string()), kinds.cast(pa.string())],
        names=names + ["reason", "kind"],
    )


#: No rows and no columns: what :func:`split_rejected` returns when no row is rejected (built once per batch before).
_NO_ROWS = pa.table({})


def split_by_range(table: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """Yield (range index, rows of that range) for a block that may hold several ranges."""
    column = table.column(RANGE_COLUMN)
    lo, hi = pc.min_max(column).values()
    if lo == hi:
        yield lo.as_py(), table
        return
    for value in pc.unique(column).to_pylist():
        yield value, table.filter(pc.equal(column, value))


def output_columns(table: pa.Table) -> pa.Table:
    """Drop internal columns and restore kept input columns; a stage output wins a name clash."""
    names = table.column_names
    outputs = [c for c in names if not c.startswith(INTERNAL_PREFIX)]
    kept = [c[len(KEEP_PREFIX) :] for c in names if c.startswith(KEEP_PREFIX)]
    kept = [c for c in kept if c not in outputs]
    return pa.table(
        [table.column(KEEP_PREFIX + c) for c in kept] + [table.column(c) for c in outputs],
        names=kept + outputs,
    )
