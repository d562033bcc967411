"""A commit record: what a committed range left in the output, as the commit log reads and writes it.

Everything that counts rows, lists files or sums tokens of an output reads these, never the JSON
the log keeps (:mod:`.commit_log` alone encodes and decodes that).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from airflow_provider_raybatch.pipeline.columns import COUNT_KEYS

#: The rejects' folder in the output (rows a stage rejected, each with its reason).
REJECTS_DIR = "_rejects"


@dataclass(frozen=True)
class CommitWriter:
    """Who committed a range: the try that held the writer lease, as the lease names it, and when
    that try's stages started (the start of its commit rate's time).

    :param run_key: the writer's run key: ``dag/run/task/map_index`` for an Airflow task, else
        what the writer called its run (the command line's, a script's; None: none given).
    :param try_number: the task instance's try.
    :param ray_job: the Ray Job whose driver committed (on a cluster).
    :param host: the host of the committing process; ``pid`` the process.
    :param started_at: when the try's stages started (Unix time); ranges without rows committed
        before them carry the time the try started committing.
    """

    run_key: str | None = None
    try_number: int | None = None
    ray_job: str | None = None
    host: str | None = None
    pid: int | None = None
    started_at: float | None = None

    @property
    def identity(self) -> tuple[Any, ...]:
        """The try, whatever its start: the records of one try share it."""
        return self.run_key, self.try_number, self.ray_job, self.host, self.pid

    def task_instance(self) -> tuple[str, str, str, int] | None:
        """(dag id, run id, task id, map index) of an Airflow task's run key; None for another key."""
        if (ti := task_instance_of(self.run_key)) is None:
            return None
        dag, run, task, map_index = ti
        return dag, run, task, int(map_index) if map_index.lstrip("-").isdigit() else -1

    def describe(self) -> str:
        """``<dag_id> / <run_id> / <task_id>[ map i], try k`` for a task; else its run key, Ray job or process."""
        if (ti := self.task_instance()) is not None:
            dag, run, task, map_index = ti
            who = f"{dag} / {run} / {task}" + (f" map {map_index}" if map_index >= 0 else "")
        else:
            who = self.run_key or (f"Ray job {self.ray_job}" if self.ray_job else f"pid {self.pid} on {self.host}")
        return who if self.try_number is None else f"{who}, try {self.try_number}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the fields, and the task instance's ids and :meth:`describe` for a reader."""
        ti = self.task_instance()
        names = ("dag_id", "run_id", "task_id", "map_index")
        return {**dict(zip(names, ti or (None,) * 4, strict=True)), **asdict(self), "describe": self.describe()}

    def to_json(self) -> dict[str, Any]:
        """As a record holds it: the fields that are set."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CommitWriter:
        """From :meth:`to_json`'s shape; keys a newer release may add are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class CommitRecord:
    """A committed range: its files, the rows they hold, what its model counted (tokens, truncated
    rows), the plan it was written under.

    :param range_id: the range.
    :param files: its files, relative to the output: data files, then rejects files (under
        :data:`REJECTS_DIR`); none for a range without rows.
    :param rows: the rows of its data files.
    :param rejected: the rows of its rejects files, of which ``engine_errors`` failed in a model.
    :param tokens_in: the prompt tokens of its rows (None: its model counted none).
    :param tokens_out: the generated tokens of its rows (None: its model counted none).
    :param truncated_rows: its rows whose text a model cut to its maximum length (None: not counted).
    :param plan: the id of the plan it was written under (None: a record of an older release).
    :param committed_at: when it was committed (Unix time; None for per-range records of layout 1).
    :param writer: the try that committed it (None: a record of an older release, writer unknown).
    """

    range_id: str
    files: tuple[str, ...]
    rows: int
    rejected: int = 0
    engine_errors: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    truncated_rows: int | None = None
    plan: str | None = None
    committed_at: float | None = None
    writer: CommitWriter | None = None

    @property
    def input_rows(self) -> int:
        """Every input row of the range: written or rejected."""
        return self.rows + self.rejected

    @property
    def data_files(self) -> list[str]:
        return [name for name in self.files if not name.startswith(f"{REJECTS_DIR}/")]

    @property
    def reject_files(self) -> list[str]:
        return [name for name in self.files if name.startswith(f"{REJECTS_DIR}/")]

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        return self.tokens_in, self.tokens_out

    @property
    def counts(self) -> dict[str, int | None]:
        """Its counts by key (:data:`~airflow_provider_raybatch.pipeline.columns.COUNT_KEYS`; None: not counted)."""
        return {key: getattr(self, key) for key in COUNT_KEYS}

    def committed(self, at: float | None, writer: CommitWriter | None) -> CommitRecord:
        return replace(self, committed_at=at, writer=writer)

    def to_json(self) -> dict[str, Any]:
        """As a per-range record file of layout 1 holds it: the fields an older release wrote, and
        the others only where they are set (so records of outputs without rejects or counts stay as
        they were)."""
        data: dict[str, Any] = {"range_id": self.range_id, "files": list(self.files), "rows": self.rows}
        if self.plan:
            data["plan"] = self.plan
        if self.rejected:
            data.update(rejected=self.rejected, engine_errors=self.engine_errors)
        for key, count in self.counts.items():
            if count is not None:
                data[key] = count
        if self.committed_at is not None:
            data["committed_at"] = self.committed_at
        if self.writer is not None:
            data["writer"] = self.writer.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CommitRecord:
        """From :meth:`to_json`'s shape; keys a newer release may add are ignored."""
        return cls(
            range_id=data["range_id"],
            files=tuple(data["files"]),
            rows=int(data["rows"]),
            rejected=int(data.get("rejected", 0)),
            engine_errors=int(data.get("engine_errors", 0)),
            **{key: data.get(key) for key in COUNT_KEYS},
            plan=data.get("plan"),
            committed_at=data.get("committed_at"),
            writer=CommitWriter.from_json(data["writer"]) if data.get("writer") else None,
        )


def task_instance_of(run_key: str | None) -> tuple[str, str, str, str] | None:
    """(dag id, run id, task id, map index) of an Airflow task's run key ``dag/run/task/map_index``;
    None for another key."""
    if not run_key or run_key.count("/") < 3:
        return None
    # Dag and task ids hold no "/", a run id may.
    dag, rest = run_key.split("/", 1)
    run, task, map_index = rest.rsplit("/", 2)
    return dag, run, task, map_index


def by_writer(records: Iterable[CommitRecord]) -> dict[tuple[Any, ...] | None, list[CommitRecord]]:
    """Records grouped by the try that committed them (:attr:`CommitWriter.identity`; None: writer
    unknown), each group in commit order."""
    groups: dict[tuple[Any, ...] | None, list[CommitRecord]] = {}
    for record in sorted(records, key=lambda r: (r.committed_at or 0.0, r.range_id)):
        groups.setdefault(None if record.writer is None else record.writer.identity, []).append(record)
    return groups
