"""Fields that carry their own description, so that an argument is described once.

The config's dataclasses declare each field with :func:`described`; their ``:param:`` docstrings,
and those of the operators that take the same arguments, are composed from it (:func:`param_docs`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, field, fields
from typing import Any

#: Where a described field keeps its description.
DOC = "doc"


def described(doc: str, *, default: Any = MISSING, default_factory: Any = MISSING, repr: bool = True) -> Any:
    """A dataclass field with its description, as a ``:param:`` line says it (one sentence or more).

    :param doc: the description; ``:param:`` docstrings of the class and of the operators quote it.
    :param default: the field's default (none: a required field).
    :param default_factory: or a function making its default.
    :param repr: whether the dataclass's ``repr`` shows it (False for credentials).
    """
    return field(default=default, default_factory=default_factory, repr=repr, metadata={DOC: doc})


def description(cls: type, name: str) -> str:
    """What ``cls``'s field ``name`` is, as declared with :func:`described`."""
    return next(f.metadata[DOC] for f in fields(cls) if f.name == name)


def param_docs(
    cls: type,
    names: Iterable[str] | None = None,
    *,
    prefix: str = "",
    renamed: Mapping[str, str] | None = None,
    notes: Mapping[str, str] | None = None,
) -> str:
    """``:param:`` lines for ``cls``'s described fields, to end a docstring with.

    :param names: the fields to describe, in this order (None: all of them, in declaration order).
    :param prefix: put before each field's name (an operator's ``table_`` arguments).
    :param renamed: the name a caller takes a field under, where it is another, by the field's name.
    :param notes: what a caller adds to a field's description (how an operator renders it), by name.
    """
    notes = notes or {}
    renamed = renamed or {}
    names = [f.name for f in fields(cls)] if names is None else list(names)
    lines = []
    for name in names:
        text = " ".join(part for part in (description(cls, name), notes.get(name, "")) if part)
        lines += textwrap.wrap(
            f":param {prefix}{renamed.get(name, name)}: {text}",
            width=108,
            initial_indent="    ",
            subsequent_indent="        ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    return "\n" + "\n".join(lines) + "\n"
