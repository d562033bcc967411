"""Check a table output's partition: ``python -m airflow_provider_raybatch verify <root> --format delta --partition ds=...``.

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

import posixpath
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow.parquet as pq

from airflow_provider_raybatch.pipeline.commit.ledger import META_DIR, OutputLedger
from airflow_provider_raybatch.pipeline.commit.verify import add_faults, verify_output
from airflow_provider_raybatch.pipeline.config import ROW_ID_COLUMN, BatchInferenceConfig, TableOutput
from airflow_provider_raybatch.pipeline.store.files import ls, read_json, resolve


def verify_table(config: BatchInferenceConfig, progress: Callable[[int, int], None] | None = None) -> list[str]:
    """The faults of the partition ``config.table`` names in the table at ``config.output_path``
    (empty when every writer's rows are in the table's current snapshot exactly once).

    ``config.table.writer`` is not used: every writer that staged rows for the partition is checked.

    :param progress: told of each writer's staging files read (:func:`.commit.verify.verify_output`).
    """
    from airflow_provider_raybatch.pipeline.tables.table_commits import open_table_writer

    table = config.table
    assert table is not None
    fs, root = resolve(config.output_path, config.storage_options)
    fs.invalidate_cache()
    partition_dir = "/".join(f"{k}={v}" for k, v in table.partition.items())
    writers = [
        posixpath.basename(p.rstrip("/"))
        for p in ls(fs, f"{root}/{partition_dir}")
        if fs.exists(f"{p.rstrip('/')}/{META_DIR}/generation.json")
    ]
    if not writers:
        return [f"{config.output_path}: no writer of this provider staged rows for partition {table.partition}"]
    faults: list[str] = []
    committed: set[str] = set()
    id_column = None
    for writer in sorted(writers):
        number = read_json(fs, f"{root}/{partition_dir}/{writer}/{META_DIR}/generation.json")["number"]
        relpath = f"{partition_dir}/{writer}/g{number}"
        staging = f"{config.output_path.rstrip('/')}/{relpath}"
        faults += [f"{staging}: {fault}" for fault in verify_output(staging, config.storage_options, progress)]
        ledger = OutputLedger(fs, f"{root}/{relpath}", staging)
        plan = ledger.load_plan()
        if plan is None:
            continue
        id_column = plan.job.get("id_column") or ROW_ID_COLUMN
        intents = [read_json(fs, p) for p in sorted(ls(fs, f"{ledger.meta}/table")) if p.endswith(".json")]
        in_commits = {r for intent in intents for r in intent["ranges"]}
        add_faults(faults, f"{staging}: range(s) in no table commit", sorted(set(plan.range_ids()) - in_commits))
        committed |= {f["path"] for intent in intents for f in intent["files"]}
        if table.format == "iceberg":
            faults += [f"{staging}: {fault}" for fault in _replacement_faults(config, relpath, intents)]

    in_table = set(open_table_writer(config).partition_files(table.partition))
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


def _replacement_faults(config: BatchInferenceConfig, writer_id: str, intents: list[dict[str, Any]]) -> list[str]:
    """The writer's replacements of the partition that are more than one snapshot of the Iceberg
    table's history (a snapshot expired since is not counted)."""
    from airflow_provider_raybatch.pipeline.tables.table_commits import open_table_writer

    replacing = [intent["seq"] for intent in intents if intent["replace"]]
    if not replacing:
        return []
    writer = open_table_writer(config, writer_id)
    faults = []
    for seq in replacing:
        operations = writer.snapshots_of(seq)
        if len(operations) > 1:
            faults.append(
                f"table commit {seq} replaced the partition in {len(operations)} snapshots ({', '.join(operations)}): "
                "readers of the table's history see the partition without its old rows or its new ones between them"
            )
    return faults


def table_config(
    output_path: str,
    output_format: str,
    partition: dict[str, str],
    identifier: str | None = None,
    catalog: dict[str, Any] | None = None,
) -> BatchInferenceConfig:
    """The config :func:`verify_table` reads, from what a user names on the command line."""
    table = TableOutput(output_format, partition, writer="verify", identifier=identifier, catalog=catalog or {})  # type: ignore[arg-type]
    return BatchInferenceConfig(input_path="-", output_path=output_path, stages=[], table=table)
