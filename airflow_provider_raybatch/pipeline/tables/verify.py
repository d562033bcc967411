"""Check a table output's partition: ``python -m airflow_provider_raybatch verify <root> --format delta --table-partition ds=...``.

What a reader of the partition relies on, beyond what :func:`.commit.verify.verify_output`
checks of each writer's staging output (every planned range committed once, files as recorded,
row keys unique): every range of the writer's current generation is in one of its table commits,
the partition's files in the table's current snapshot are exactly those commits' files (none
missing, none of an older generation or of a writer that is not ours), the row key is
unique over the partition's rows as the table serves them, and (Iceberg) each replacement of the
partition is one snapshot of the table's history: two (pyiceberg's ``delete`` then ``add_files``)
leave a snapshot in which the partition is empty, which time travel and readers of the snapshots
see. A Delta replacement is one version by construction (its remove and add actions in one commit).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow.parquet as pq

from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.commit.verify import add_faults, verify_output
from airflow_provider_raybatch.pipeline.config import ROW_ID_COLUMN
from airflow_provider_raybatch.pipeline.output_ref import OutputRef
from airflow_provider_raybatch.pipeline.store.files import resolve
from airflow_provider_raybatch.pipeline.tables.staging import TableIntent, intents, staged_writers


def verify_table(output: OutputRef, progress: Callable[[int, int], None] | None = None) -> list[str]:
    """The faults of the partition ``output.partition`` of the table at ``output.path`` (empty when
    every writer's rows are in the table's current snapshot exactly once). Every writer that staged
    rows for the partition is checked.

    :param output: the table's partition.
    :param progress: told of each writer's staging files read (:func:`.commit.verify.verify_output`).
    """
    from airflow_provider_raybatch.pipeline.tables.table_commits import open_table_writer

    fs, root = resolve(output.path, output.storage_options)
    fs.invalidate_cache()
    writers = staged_writers(fs, root, output.partition)
    if not writers:
        return [f"{output.path}: no writer of this provider staged rows for partition {output.partition}"]
    faults: list[str] = []
    committed: set[str] = set()
    id_column = None
    for writer in writers:
        relpath = writer.generation_relpath
        staging = f"{output.path.rstrip('/')}/{relpath}"
        faults += [f"{staging}: {fault}" for fault in verify_output(staging, output.storage_options, progress)]
        ledger = OutputLedger(fs, f"{root}/{relpath}", staging)
        plan = ledger.load_plan()
        if plan is None:
            continue
        id_column = plan.job.get("id_column") or ROW_ID_COLUMN
        decided = intents(fs, ledger.root)
        in_commits = {r for intent in decided for r in intent.ranges}
        add_faults(faults, f"{staging}: range(s) in no table commit", sorted(set(plan.range_ids()) - in_commits))
        committed |= {f.path for intent in decided for f in intent.files}
        if output.format == "iceberg":
            faults += [f"{staging}: {fault}" for fault in _replacement_faults(output, relpath, decided)]

    in_table = set(open_table_writer(output).partition_files(output.partition))
    add_faults(faults, "file(s) of table commits not in the table's current snapshot", sorted(committed - in_table))
    add_faults(
        faults,
        "file(s) in the table's current snapshot that no current generation committed",
        sorted(in_table - committed),
    )
    ids: list[Any] = []
    for name in sorted(in_table):
        with fs.open(name if "://" in name else f"{root}/{name}", "rb") as f:
            ids.extend(pq.read_table(f, columns=[id_column]).column(id_column).to_pylist())
    duplicated = sorted((i for i, n in Counter(ids).items() if n > 1), key=repr)
    add_faults(faults, f"{id_column} value(s) more than once in the partition", [repr(i) for i in duplicated])
    return faults


def _replacement_faults(output: OutputRef, writer_id: str, intents: list[TableIntent]) -> list[str]:
    """The writer's replacements of the partition that are more than one snapshot of the Iceberg
    table's history (a snapshot expired since is not counted)."""
    from airflow_provider_raybatch.pipeline.tables.table_commits import open_table_writer

    replacing = [intent.seq for intent in intents if intent.replace]
    if not replacing:
        return []
    writer = open_table_writer(output, writer_id)
    faults = []
    for seq in replacing:
        operations = writer.snapshots_of(seq)
        if len(operations) > 1:
            faults.append(
                f"table commit {seq} replaced the partition in {len(operations)} snapshots ({', '.join(operations)}): "
                "readers of the table's history see the partition without its old rows or its new ones between them"
            )
    return faults
