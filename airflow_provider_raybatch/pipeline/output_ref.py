"""Which output: :class:`OutputRef`, all a reader of an output (its status, rejects, verifier) needs
to find it, whether named by a task's arguments, the command line's flags or a run's config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, check_output_format


@dataclass(frozen=True)
class OutputRef:
    """An output: a Parquet folder, or a partition of a Delta or Iceberg table.

    :param path: the output folder, or a Delta table's root / an Iceberg table's location (local or a URL).
    :param format: ``"parquet"``, ``"delta"`` or ``"iceberg"``.
    :param partition: a table output's partition (column -> value); empty for a Parquet folder.
    :param identifier: an Iceberg output's table, ``namespace.table``.
    :param catalog: the Iceberg catalog's pyiceberg properties (none: pyiceberg's own configuration
        of the catalog ``raybatch``); left out of the repr, as it may hold a password.
    :param storage_options: fsspec options for a remote path (one filesystem's, or keyed by store;
        None: the environment's credentials); left out of the repr.
    """

    path: str
    format: str = "parquet"
    partition: dict[str, str] = field(default_factory=dict)
    identifier: str | None = None
    catalog: dict[str, Any] = field(default_factory=dict, repr=False)
    storage_options: dict[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_output_format(self.format)

    @property
    def is_table(self) -> bool:
        """A Delta or Iceberg table's partition, read per writer that staged rows for it."""
        return self.format != "parquet"

    @classmethod
    def of(cls, config: BatchInferenceConfig) -> OutputRef:
        """The output a run's ``config`` writes."""
        table = config.table
        if table is None:
            return cls(config.output_path, storage_options=config.storage_options)
        return cls(
            config.output_path, table.format, table.partition, table.identifier, table.catalog, config.storage_options
        )
