"""What the table writers share: the files a commit adds, the metadata naming a writer's commit,
and the attempts that apply it once."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_raybatch.pipeline.errors import OutputSchemaError, StoreUnavailableError

log = logging.getLogger(__name__)

#: Attempts at one table commit that conflicts with other writers' commits (each reads the table again).
MAX_ATTEMPTS = 20
#: Metadata keys of the provider's table commits (Delta's commit info, Iceberg's snapshot summary).
WRITER_KEY, SEQ_KEY, RANGES_KEY = "raybatch.writer", "raybatch.seq", "raybatch.ranges"


@dataclass(frozen=True)
class DataFile:
    """A Parquet file already written under the table's root.

    :param path: relative to the table's root, with ``/``.
    :param size: bytes.
    :param rows: its row count (Delta's statistics need it: a file without them breaks later
        replacements of its partition).
    """

    path: str
    size: int
    rows: int


def s3_settings(options: Mapping[str, Any]) -> dict[str, str]:
    """The S3 credentials, endpoint and region in fsspec's options for a store (s3fs's names, as the
    provider builds them from an Airflow connection), by a short name each table library maps to its own."""
    client = options.get("client_kwargs") or {}
    found = {
        "key": options.get("key"),
        "secret": options.get("secret"),
        "token": options.get("token"),
        "endpoint": client.get("endpoint_url") or options.get("endpoint_url"),
        "region": client.get("region_name"),
    }
    return {name: str(value) for name, value in found.items() if value}


def commit_metadata(writer_id: str, seq: int, ranges: Sequence[str]) -> dict[str, str]:
    """The metadata of a writer's commit ``seq``: who made it, its number, the ranges it adds."""
    return {WRITER_KEY: writer_id, SEQ_KEY: str(seq), RANGES_KEY: json.dumps(list(ranges))}


#: How the option that adds an output's new columns to its table is named, in errors.
ADD_COLUMNS_OPTION = "table_add_columns=True (TableOutput.add_columns)"


def columns_error(
    table: str,
    found: Mapping[str, str],
    expected: Mapping[str, str],
    differ: Sequence[str] | None = None,
    *,
    add_columns: bool = False,
) -> OutputSchemaError:
    """The error for a table whose columns (name: type) are not the output's, naming those that differ.

    :param differ: the columns that differ (None: those whose types in ``found`` and ``expected`` differ).
    :param add_columns: whether the run was allowed to add columns (the error says what it cannot do).
    """
    if differ is None:
        differ = [n for n in dict.fromkeys([*expected, *found]) if expected.get(n) != found.get(n)]
    named = ", ".join(f"{n} (table: {found.get(n, 'missing')}, output: {expected.get(n, 'missing')})" for n in differ)
    message = f"the {table} has columns that differ from this output's: {named or 'in nullability'}"
    if differ and all(n not in found for n in differ):
        message += f"; set {ADD_COLUMNS_OPTION} to add the output's new columns to the table"
    elif add_columns:
        message += (
            f"; {ADD_COLUMNS_OPTION} only adds new columns: every column of the table must be written, with its type"
        )
    return OutputSchemaError(message)


def columns_to_add(
    table: str,
    found: Mapping[str, Any],
    expected: Mapping[str, Any],
    *,
    add_columns: bool,
    not_null: Collection[str] = (),
    shown: tuple[Mapping[str, str], Mapping[str, str]] | None = None,
) -> list[str]:
    """The output's columns that the table lacks, to add to it before a commit of the output's files.

    Columns are matched by name, in any order (both formats read a file's columns by name, and a
    column added to a table goes after its others).

    :param table: the table, as errors name it.
    :param found: the table's columns, name -> what the format compares (a type, or a field).
    :param expected: the output's columns, likewise.
    :param add_columns: whether new columns may be added (else any difference is refused).
    :param not_null: the output's columns that hold no nulls by their type: never added, as the
        table's rows so far would read null in them.
    :param shown: ``found`` and ``expected`` as the error shows them (default: as given).
    :return: the new columns, in the output's order (empty when the table has the output's columns).
    :raises OutputSchemaError: the columns differ otherwise, or new ones may not be added.
    """
    differ = [n for n in dict.fromkeys([*expected, *found]) if n not in found or expected.get(n) != found[n]]
    new = [n for n in differ if n not in found]
    if differ and (not add_columns or differ != new):
        found_shown, expected_shown = shown or (found, expected)
        raise columns_error(table, found_shown, expected_shown, differ, add_columns=add_columns)
    refused = [n for n in new if n in not_null]
    if refused:
        raise OutputSchemaError(
            f"the output's column(s) {refused} are not nullable: a column added to the {table} must be nullable "
            "(the table's rows so far read null in it); make the output's column nullable"
        )
    return new


def apply_once(attempt: Callable[[], bool | None], conflicts: tuple[type[BaseException], ...], what: str) -> bool:
    """Call ``attempt`` until it applies the commit (True) or finds it applied (False).

    Each attempt reads the table first, so a conflict with another writer's commit (``conflicts``)
    or an error whose outcome is unknown (``OSError``: the commit may have landed) is resolved by
    the next one. ``attempt`` returns None to be called again at once (it lost a creation race).

    :raises StoreUnavailableError: after :data:`MAX_ATTEMPTS` (retryable: the next try reads
        which commits landed before it writes anything).
    """
    error: BaseException | None = None
    for n in range(MAX_ATTEMPTS):
        if n and error is not None:
            time.sleep(min(2.0, 0.05 * 2**n) * random.uniform(0.5, 1.0))
        try:
            result = attempt()
        except conflicts as e:
            error = e
            continue
        except OSError as e:
            error = e
            log.warning("%s failed (%s); reading the table again", what, e)
            continue
        if result is not None:
            return result
        error = None
    raise StoreUnavailableError(
        f"{what} did not land in {MAX_ATTEMPTS} attempts: {error}; a retry reads which commits landed and goes on"
    )
