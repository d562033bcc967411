"""Plan the input into deterministic, checkpointable row ranges.

A range is a contiguous run of rows of one file, cut at row-group boundaries where it can be
(row groups larger than ``rows_per_range`` are cut by row offset). Its id depends only on the
file's path relative to the input root and the row bounds, so the plan is the same whatever the
listing order, the number of workers or the machine that plans it.

The input's files and their footers come from :mod:`.input_files` (threads here, or Ray tasks on
a Ray driver with many files): both give the same plan.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.errors import InputError
from airflow_provider_raybatch.pipeline.planning.footers import FooterReader, read_footers
from airflow_provider_raybatch.pipeline.planning.input_files import FINGERPRINT_FIELDS, InputFile, list_input_files
from airflow_provider_raybatch.pipeline.store.retries import retry_transient


@dataclass(frozen=True)
class RowRange:
    id: str
    file_index: int
    start: int
    end: int

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass
class Plan:
    files: list[InputFile]
    ranges: list[RowRange]
    schema: pa.Schema  # of the columns read

    @property
    def total_rows(self) -> int:
        """Rows in the planned ranges (all input rows, unless limited or restricted to a shard)."""
        return sum(r.rows for r in self.ranges)

    @property
    def input_rows(self) -> int:
        """Rows in the input files, whatever the ranges cover."""
        return sum(f.rows for f in self.files)

    def describe(self) -> dict[str, Any]:
        """What ``plan.json`` records of the input: its files with their row groups. The ranges are
        not listed (a million ranges would make a plan of some 100 MB): they follow from the files,
        ``rows_per_range`` and ``max_rows`` (:func:`recorded_ranges`)."""
        return {"files": [f.describe() for f in self.files]}


def plan_ranges(files: list[InputFile], rows_per_range: int) -> list[RowRange]:
    ranges = []
    for index, file in enumerate(files):
        digest = hashlib.sha1(file.relpath.encode()).hexdigest()[:12]
        bounds = _cut(file.row_groups, rows_per_range)
        if not bounds:
            # An empty file still gets a range, so its (empty) result is committed like any other.
            bounds = [(0, 0)]
        ranges.extend(RowRange(f"{digest}-{start}-{end}", index, start, end) for start, end in bounds)
    return ranges


def _cut(row_groups: tuple[int, ...], rows_per_range: int) -> list[tuple[int, int]]:
    bounds, start, offset = [], 0, 0
    for rows in row_groups:
        if rows > rows_per_range:
            if offset > start:
                bounds.append((start, offset))
            bounds.extend(
                (s, min(s + rows_per_range, offset + rows)) for s in range(offset, offset + rows, rows_per_range)
            )
            start = offset + rows
        elif offset + rows - start > rows_per_range:
            bounds.append((start, offset))
            start = offset
        offset += rows
    if offset > start:
        bounds.append((start, offset))
    return bounds


def contiguous_groups(ranges: list[RowRange], count: int) -> list[list[RowRange]]:
    """``ranges`` cut into ``min(count, len(ranges))`` contiguous groups, as equal in size as possible:
    a mapped run's shards (the same ranges and count always give the same groups)."""
    count = min(count, len(ranges))
    return [ranges[i * len(ranges) // count : (i + 1) * len(ranges) // count] for i in range(count)]


def plan_input(
    fs: AbstractFileSystem,
    fs_path: str,
    display_path: str,
    columns: list[str] | None,
    rows_per_range: int,
    id_column: str | None = None,
    footer_reader: FooterReader | None = None,
) -> Plan:
    """List and inspect the input, check the requested columns, and cut it into ranges.

    Every file must give each column read the same Arrow type, so that every range's output has
    the same schema; with ``id_column``, a file whose footer statistics count nulls in it is refused.

    :param footer_reader: how the footers are read (:data:`FooterReader`); None: :func:`read_footers`,
        threads here or Ray tasks on a Ray driver.
    """
    root, paths = retry_transient(lambda: list_input_files(fs, fs_path, display_path), f"listing {display_path}")
    infos = (footer_reader or read_footers)(fs, root, paths, id_column)
    files = [info for info, _ in infos]
    first_schema = infos[0][1]
    wanted = columns if columns is not None else first_schema.names
    seen: dict[str, tuple[pa.DataType, str]] = {}  # column -> its first type other than null, and where
    for info, schema in infos:
        missing = [c for c in wanted if c not in schema.names]
        if missing:
            raise InputError(f"column(s) {missing} not found in {info.path!r}; it has columns {schema.names}")
        for name in wanted:
            found = schema.field(name).type
            if pa.types.is_null(found):
                continue  # only nulls (or no rows): fits any type
            expected, where = seen.setdefault(name, (found, info.path))
            if found != expected:
                raise InputError(
                    f"column {name!r} has type {expected} in {where!r} but {found} in {info.path!r}: "
                    "every input file must give a column the same type (the output holds one schema); "
                    "rewrite the files with one type"
                )
        if info.null_ids:
            raise InputError(
                f"id_column {id_column!r} holds {info.null_ids} null(s) in {info.path!r} (by its footer statistics): "
                "the id column is the row key and must be set on every row"
            )
    schema = pa.schema(
        [first_schema.field(c).with_type(seen[c][0]) if c in seen else first_schema.field(c) for c in wanted]
    )
    return Plan(files, plan_ranges(files, rows_per_range), schema)


def recorded_ranges(recorded: dict[str, Any], rows_per_range: int, max_rows: int | None = None) -> list[RowRange]:
    """The ranges of a recorded plan (:meth:`Plan.describe`): cut again from its files' row
    groups exactly as :func:`plan_input` cut them; listed as they are by a plan of layout version 1."""
    if "ranges" in recorded:
        return [RowRange(**r) for r in recorded["ranges"]]
    files = [
        InputFile(f["relpath"], f["relpath"], f["size"], f["rows"], tuple(f["row_groups"]), f["signature"])
        for f in recorded["files"]
    ]
    return limit_rows(Plan(files, plan_ranges(files, rows_per_range), pa.schema([])), max_rows).ranges


def input_changes(recorded: dict[str, Any], plan: Plan) -> str:
    """Describe how the input differs from the recorded plan's ("" when it does not)."""
    old = {f["relpath"]: f for f in recorded["files"]}
    new = {f.relpath: f.describe() for f in plan.files}
    changes = {
        "added": sorted(new.keys() - old.keys()),
        "removed": sorted(old.keys() - new.keys()),
        "rewritten": sorted(p for p in new.keys() & old.keys() if _fingerprint_differs(old[p], new[p])),
    }
    return "; ".join(f"{label}: {_short(paths)}" for label, paths in changes.items() if paths)


def _fingerprint_differs(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Signatures differ, or a field both plans recorded (a plan of an older version records fewer)."""
    return old["signature"] != new["signature"] or any(
        k in old and k in new and old[k] != new[k] for k in FINGERPRINT_FIELDS
    )


def _short(paths: list[str], limit: int = 5) -> str:
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


def limit_rows(plan: Plan, max_rows: int | None) -> Plan:
    """Keep only the ranges holding the input's first ``max_rows`` rows (a smoke run).

    The last range kept is cut at ``max_rows``; its id follows from its bounds like any other, so a
    limited plan is as deterministic as a full one (and never shares a cut range's id with it).
    """
    if max_rows is None or max_rows >= plan.total_rows:
        return plan
    ranges, rows = [], 0
    for row_range in plan.ranges:
        if rows >= max_rows:
            break
        if rows + row_range.rows > max_rows:
            end = row_range.start + max_rows - rows
            prefix = row_range.id.rsplit("-", 2)[0]
            row_range = RowRange(f"{prefix}-{row_range.start}-{end}", row_range.file_index, row_range.start, end)
        ranges.append(row_range)
        rows += row_range.rows
    return Plan(plan.files, ranges, plan.schema)


def select_ranges(plan: Plan, range_ids: list[str] | None) -> Plan:
    """The plan restricted to ``range_ids`` (a shard of a mapped run), in plan order."""
    if range_ids is None:
        return plan
    wanted = set(range_ids)
    unknown = wanted - {r.id for r in plan.ranges}
    if unknown:
        raise InputError(
            f"{len(unknown)} range id(s) of the shard are not in the input's plan (e.g. {sorted(unknown)[0]}): "
            "the shards were planned on other input or settings; rerun the planning task"
        )
    return Plan(plan.files, [r for r in plan.ranges if r.id in wanted], plan.schema)
