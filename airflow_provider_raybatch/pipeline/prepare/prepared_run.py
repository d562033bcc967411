"""What preparing an output gives: the output opened by its kind's strategy, and the run it starts."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.commit.commit_record import CommitRecord
from airflow_provider_raybatch.pipeline.commit.lease import Lease
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.planning.planner import Plan

if TYPE_CHECKING:
    from airflow_provider_raybatch.pipeline.tables.staging import Generation

log = logging.getLogger(__name__)


class OpenedOutput(NamedTuple):
    """An output opened for writing (:func:`.folder.open_folder`, :func:`.table.open_table`).

    :param ledger: the bookkeeping this writer writes, fenced by ``lease``.
    :param lease: this writer's lease, held; the caller releases it.
    :param committed: range id -> commit record of the ranges (of the shard) that stand.
    :param generation: a table output's generation, whose staging output ``ledger`` keeps.
    """

    ledger: OutputLedger
    lease: Lease
    committed: dict[str, CommitRecord]
    generation: Generation | None = None


@dataclass
class PreparedRun:
    """A run ready to start: what is left to do is ``plan``'s ranges not in ``committed``.

    :param plan: the input's plan (limited by ``max_rows``; restricted to ``range_ids`` for a shard).
    :param ledger: the output's bookkeeping.
    :param committed: range id -> commit record of the ranges (of the shard) already committed.
    :param keep: input columns carried to the output (the row key first).
    :param in_fs: the input's filesystem.
    :param lease: this writer's lease on the output (or on the shard's ranges), held until
        :meth:`release`; every commit and removal of ``ledger`` checks it first.
    :param generation: a table output's generation, whose staging output ``ledger`` keeps.
    """

    plan: Plan
    ledger: OutputLedger
    committed: dict[str, CommitRecord]
    keep: list[str]
    in_fs: AbstractFileSystem
    lease: Lease
    generation: Generation | None = None

    def release(self) -> None:
        """Fold this writer's commit records together (:meth:`OutputLedger.finish`), then give the lease back.

        Best effort: the records are durable already, and a failure here (often the very one the
        run is ending on) must not hide the run's own error.
        """
        try:
            self.ledger.finish()
        except Exception as e:  # noqa: BLE001 - see above; the next whole-output run folds them
            log.warning("Could not fold the commit records of %s together: %s", self.ledger.display_path, e)
        self.lease.release()
