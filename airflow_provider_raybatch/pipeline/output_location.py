"""Where an output may go: its own folder, not a root, not inside its input (or around it), not a file.

Checked before anything is written (:func:`.prepare.prepare`): each of these mistakes would
otherwise fail late, on every retry alike, or worse, feed the output back in as input.
"""

from __future__ import annotations

import posixpath

from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.store.files import is_local, is_within, same_filesystem, static_prefix


def check_output_location(
    config: BatchInferenceConfig, in_fs: AbstractFileSystem, in_path: str, out_fs: AbstractFileSystem, out_path: str
) -> None:
    """Refuse an output at a filesystem or bucket root, one overlapping the input, or one that is a file.

    Paths are compared as the store resolves them, not as written: ``/data/x/../in/out`` and a
    symlink into ``/data/in`` both lie inside ``/data/in``. Compared as written, such an output was
    written into the input, and the next run over that input read it back as input.
    """
    outs = _resolved_spellings(out_fs, out_path)
    if any(_is_root(out_fs, spelling) for spelling in outs):
        raise ConfigError(
            f"output path {config.output_path!r} is a filesystem or bucket root: give the output its own folder"
        )
    if same_filesystem(in_fs, out_fs):
        ins = _resolved_spellings(in_fs, static_prefix(in_path))
        for out_spelling in outs:
            for in_spelling in ins:
                if is_within(out_spelling, in_spelling) or is_within(in_spelling, out_spelling):
                    resolved = f" (resolved: {out_spelling!r} and {in_spelling!r})"
                    written = out_spelling == out_path and in_spelling == static_prefix(in_path)
                    raise ConfigError(
                        f"output path {config.output_path!r} overlaps input path {config.input_path!r}"
                        f"{'' if written else resolved}: the output would be read back as input; "
                        "choose a folder outside the input"
                    )
    _refuse_file_output(config, out_fs, outs[0])


def _resolved_spellings(fs: AbstractFileSystem, path: str) -> list[str]:
    """The spellings of ``path`` to compare locations by.

    Local: the real path (``..`` and symlinks resolved as the operating system resolves them). An
    object store has no symlinks and its keys are literal, but clients and servers differ on
    whether ``.`` and ``..`` segments reach it as written or resolved: both spellings count.
    """
    if is_local(fs):
        return [posixpath.realpath(path)]
    normal = posixpath.normpath(path)
    return [path] if normal == path else [path, normal]


def _is_root(fs: AbstractFileSystem, path: str) -> bool:
    """``/`` locally; a bucket (or container) on an object store, where a path's first part is the bucket."""
    inside = path.strip("/")
    return not inside or inside == "." or (not is_local(fs) and "/" not in inside)


def _refuse_file_output(config: BatchInferenceConfig, fs: AbstractFileSystem, path: str) -> None:
    """Refuse an output path that is an existing file, or lies under one (locally).

    The output is a folder: writing its bookkeeping would fail with an error that every retry
    repeats. Object stores are asked about the path itself only (one request); locally the nearest
    existing path above it is checked too.
    """
    blocking = path
    if is_local(fs):
        while not fs.exists(blocking) and posixpath.dirname(blocking) != blocking:
            blocking = posixpath.dirname(blocking)
    if not fs.isfile(blocking):
        return
    where = "is an existing file" if blocking == path else f"lies under {blocking!r}, which is a file"
    raise ConfigError(
        f"output path {config.output_path!r} {where}: the output is a folder; choose a folder path for it"
    )
