"""Operator arguments as templates render them: text that spells a number, ``"None"`` for a Param
that is None, a list rendered as its text. Each is read here, or refused naming the argument,
before any Ray work (the config's own checks then apply to the values)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.resources import ReplicaResources

#: What a template renders for a value that is not set: a Param or variable that is None, or empty.
_UNSET_TEXT = ("", "None")


def rendered_number(name: str, value: Any, kind: type[int] | type[float], expected: str, *, optional: bool) -> Any:
    """A numeric argument as given, or the number a template rendered as text.

    Templates render text unless the DAG sets ``render_template_as_native_obj=True``, so ``"100"``
    and ``"0.05"`` are read as the numbers they spell. ``"None"`` and ``""`` mean None for an
    ``optional`` argument (its "no limit"). Values that are not text are left to the config's checks
    (which refuse ``True``, ``1.5`` rows, a negative number...).

    :param name: the argument, named in errors.
    :param value: its (rendered) value.
    :param kind: ``int`` or ``float``: what the text must spell.
    :param expected: what the argument takes, for the error (the config's check words it the same).
    :param optional: whether None is one of its values.
    :raises ConfigError: text that does not spell a ``kind``, naming the argument and the text.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if optional and text in _UNSET_TEXT:
        return None
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{name} must be {expected}, got {value!r}") from None


def rendered_error_fraction(value: Any) -> Any:
    """``max_error_fraction`` as given or rendered; unset (None, ``"None"``, ``""``) is refused.

    None would be ambiguous for a quality bar: the operator's default, or no bar at all? The two
    differ a hundredfold in the errors they let through, so the DAG must say which.
    """
    expected = "a number between 0 and 1"
    if value is None or (isinstance(value, str) and value.strip() in _UNSET_TEXT):
        raise ConfigError(
            f"max_error_fraction must be {expected}, got {value!r}: it has no unset value (a Param that is None "
            "renders as 'None'); give a number, such as the default 0.01, or 1 to tolerate any share of errors"
        )
    return rendered_number("max_error_fraction", value, float, expected, optional=False)


def rendered_columns(name: str, value: Any) -> Any:
    """``columns`` / ``keep_columns`` as given; a rendered ``"None"`` or ``""`` is None (every column).

    :raises ConfigError: other text (a template renders a list as its text), naming the argument.
    """
    if not isinstance(value, str):
        return value
    if value.strip() in _UNSET_TEXT:
        return None
    raise ConfigError(
        f"{name} must be a list of column names or None, got the text {value!r}: to render a list from a "
        "template, set render_template_as_native_obj=True on the DAG"
    )


def rendered_seconds(value: float | timedelta | str | None) -> Any:
    """``progress_timeout`` given as seconds, a ``timedelta`` or rendered text, in seconds (None: no limit)."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    return rendered_number("progress_timeout", value, float, "a number of seconds > 0 or None", optional=True)


def check_paths(**paths: object) -> None:
    """Each path must be absolute (``/data/in``) or a URL (``s3://bucket/in``): a relative path would
    depend on the worker's current folder.

    A DAG's ``Param`` schemas refuse bad values when a run is triggered; values that arrive another
    way (a DAG without schemas, a template, ``dag.test()``) are checked here, before any Ray work.
    """
    for name, value in paths.items():
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{name} must be a non-empty path, got {value!r}")
        if not (value.startswith("/") or "://" in value):
            raise ConfigError(f"{name} must be an absolute path or a URL such as s3://bucket/prefix, got {value!r}")


def as_kind(value: Any, kind: type | tuple[type, ...], name: str) -> Any:
    """A rendered argument as ``kind``: Jinja renders to strings unless ``render_template_as_native_obj``."""
    if isinstance(value, str) and not (isinstance(kind, type) and kind is str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ConfigError(f"{name} must be {kind}, got the string {value!r}") from e
    if not isinstance(value, kind):
        raise ConfigError(f"{name} must be {kind}, got {type(value).__name__}")
    return value


def rendered_replica_resources(
    *,
    batch_size: Any,
    concurrency: Any,
    num_cpus: Any,
    num_gpus: Any,
    memory: Any = None,
    accelerator_type: str | None = None,
    resources: dict[str, float] | None = None,
    max_concurrent_batches: Any = None,
) -> ReplicaResources:
    """The replicas' resources from the operator's (templated) arguments: ``"16"`` is 16, ``"None"``
    is None where None is a value, a concurrency of ``"[1, 4]"`` is ``(1, 4)``; the resources'
    own checks then apply (:meth:`ReplicaResources.validate`)."""
    if isinstance(concurrency, str):
        unset = concurrency.strip() in _UNSET_TEXT
        concurrency = None if unset else as_kind(concurrency, (int, list), "concurrency")
    return ReplicaResources(
        batch_size=rendered_number("batch_size", batch_size, int, "an integer >= 1 or None", optional=True),
        concurrency=concurrency,
        num_cpus=rendered_number("num_cpus", num_cpus, float, "a number >= 0", optional=False),
        num_gpus=rendered_number("num_gpus", num_gpus, float, "a number >= 0 or None", optional=True),
        memory=rendered_number("memory", memory, int, "a number of bytes or None", optional=True),
        accelerator_type=accelerator_type,
        resources=resources,
        max_concurrent_batches=rendered_number(
            "max_concurrent_batches", max_concurrent_batches, int, "an integer >= 1 or None", optional=True
        ),
    )
