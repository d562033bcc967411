"""The writer's lease: of the whole output, or of one shard's ranges; the two kinds exclude each other."""

from __future__ import annotations

import posixpath

from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.commit.lease import Lease, LeaseHolder
from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig


def take_lease(
    config: BatchInferenceConfig, fs: AbstractFileSystem, folder: str, holder: LeaseHolder, what: str | None = None
) -> Lease:
    """Take the lease of the whole output, or of ``config.range_ids``, kept in the folder ``folder``.

    A whole-output writer (a run, or the planning task of a mapped run) and a shard's writer
    exclude each other: each takes its own lease, then fails if the other kind is live.

    :param folder: the output folder (or a table writer's folder) whose bookkeeping holds the leases.
    :param what: the output, in messages (default: ``output <output_path>``).
    """
    what = what or f"output {config.output_path}"
    leases = OutputLedger(fs, folder, config.output_path)  # only where the leases live: nothing is written by it

    def make(lease_folder: str) -> Lease:
        whole = lease_folder == leases.lease_folder()
        shard = "" if whole else f"shard {posixpath.basename(lease_folder)} of "
        return Lease(fs, lease_folder, f"{shard}{what}", holder, config.lease_timeout)

    whole = config.range_ids is None
    lease = make(leases.lease_folder() if whole else leases.lease_folder(config.range_ids))
    lease.acquire()
    try:
        # The other kind is looked for only once this lease is taken: of a whole-output writer and
        # a shard's writer starting together, each creates its lease before it looks for the
        # other's, so the one that looks last sees the other's and stops, in every interleaving.
        # (Listed before, a shard lease created in between was missed, and both wrote.)
        others = [make(f) for f in leases.shard_lease_folders()] if whole else [make(leases.lease_folder())]
        for other in others:
            if (record := other.live()) is not None:
                raise other.busy_error(record)
    except BaseException:
        lease.release()
        raise
    return lease
