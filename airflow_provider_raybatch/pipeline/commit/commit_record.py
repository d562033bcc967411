"""A commit record: what a committed range left in the output, as the commit log reads and writes it.

Everything that counts rows, lists files or sums tokens of an output reads these, never the JSON
the log keeps (:mod:`.commit_log` alone encodes and decodes that).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

#: The rejects' folder in the output (rows a stage rejected, each with its reason).
REJECTS_DIR = "_rejects"


@dataclass(frozen=True)
class CommitRecord:
    """A committed range: its files, the rows they hold, the tokens its model counted, the plan it
    was written under.

    :param range_id: the range.
    :param files: its files, relative to the output: data files, then rejects files (under
        :data:`REJECTS_DIR`); none for a range without rows.
    :param rows: the rows of its data files.
    :param rejected: the rows of its rejects files, of which ``engine_errors`` failed in a model.
    :param tokens_in: the prompt tokens of its rows (None: its model counted none).
    :param tokens_out: the generated tokens of its rows (None: its model counted none).
    :param plan: the id of the plan it was written under (None: a record of an older release).
    :param committed_at: when it was committed (Unix time; None for per-range records of layout 1).
    """

    range_id: str
    files: tuple[str, ...]
    rows: int
    rejected: int = 0
    engine_errors: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    plan: str | None = None
    committed_at: float | None = None

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

    def committed(self, at: float) -> CommitRecord:
        return replace(self, committed_at=at)

    def to_json(self) -> dict[str, Any]:
        """As a per-range record file of layout 1 holds it: the fields an older release wrote, and
        the others only where they are set (so records of outputs without rejects or tokens stay as
        they were)."""
        data: dict[str, Any] = {"range_id": self.range_id, "files": list(self.files), "rows": self.rows}
        if self.plan:
            data["plan"] = self.plan
        if self.rejected:
            data.update(rejected=self.rejected, engine_errors=self.engine_errors)
        for key, count in (("tokens_in", self.tokens_in), ("tokens_out", self.tokens_out)):
            if count is not None:
                data[key] = count
        if self.committed_at is not None:
            data["committed_at"] = self.committed_at
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
            tokens_in=data.get("tokens_in"),
            tokens_out=data.get("tokens_out"),
            plan=data.get("plan"),
            committed_at=data.get("committed_at"),
        )
