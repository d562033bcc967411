"""One schema per output: the rule a range's files must meet before they are committed.

The first range committed records the schema of its output file (and the first rejects file
that of the rejects) under ``_raybatch/schemas/``; every later range is compared with it before
it commits. Column names and order, types and nullability must be the same, with one
promotion: a column of Arrow type ``null`` in a range (a stage that returned only Nones) is
written with the recorded type. A range that differs otherwise is refused, naming the column,
both types and the range, and nothing of it is committed.
"""

from __future__ import annotations

import base64
from typing import Any

import pyarrow as pa


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """The schema as JSON: readable fields, and the exact Arrow schema (IPC, base64) that is compared."""
    schema = schema.remove_metadata()
    return {
        "fields": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema],
        "arrow": base64.b64encode(schema.serialize().to_pybytes()).decode(),
    }


def schema_from_json(data: dict[str, Any]) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(data["arrow"])))


def schema_mismatch(recorded: pa.Schema, found: pa.Schema) -> str:
    """How ``found`` breaks the rule against ``recorded`` ("" when it may be written as ``recorded``)."""
    if recorded.names != found.names:
        return f"columns {found.names} instead of the recorded {recorded.names}"
    for old, new in zip(recorded, found, strict=True):
        if new.type != old.type and not pa.types.is_null(new.type):
            return f"column {new.name!r} has type {new.type} where the output has {old.type}"
        if new.nullable != old.nullable and not pa.types.is_null(new.type):
            nullable = {True: "nullable", False: "not nullable"}
            return f"column {new.name!r} is {nullable[new.nullable]} where the output's is {nullable[old.nullable]}"
    return ""


def promotion_needed(recorded: pa.Schema, found: pa.Schema) -> bool:
    """True when ``found`` meets the rule only through a promotion (a cast to ``recorded``)."""
    return not found.remove_metadata().equals(recorded.remove_metadata())
