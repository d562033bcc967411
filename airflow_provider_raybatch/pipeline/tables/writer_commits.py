"""What the table writers share: the files a commit adds, the metadata naming a writer's commit,
and the attempts that apply it once."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
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


def columns_error(table: str, found: Mapping[str, str], expected: Mapping[str, str]) -> OutputSchemaError:
    """The error for a table whose columns (name: type) are not the output's, naming those that differ."""
    differ = [n for n in dict.fromkeys([*expected, *found]) if expected.get(n) != found.get(n)]
    named = ", ".join(f"{n} (table: {found.get(n, 'missing')}, output: {expected.get(n, 'missing')})" for n in differ)
    return OutputSchemaError(f"the {table} has columns that differ from this output's: {named or 'in nullability'}")


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
