"""Filesystem access through fsspec: local paths, ``s3://`` (s3fs), ``gs://`` (gcsfs), ``abfs://`` / ``az://``
(adlfs), any fsspec protocol."""

from __future__ import annotations

import json
import os
import posixpath
import uuid
from typing import Any

import fsspec
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.schemes import options_for

GLOB_CHARS = "*?["


def resolve(path: str, storage_options: dict[str, Any] | None = None) -> tuple[AbstractFileSystem, str]:
    """Return the filesystem for ``path`` and the path as that filesystem spells it.

    ``storage_options`` (credentials, endpoint) apply to remote paths only: one filesystem's options,
    or options keyed by store (``{"s3": {...}, "gs": {...}}``, see :func:`.schemes.options_for`).
    """
    fs, fs_path = fsspec.core.url_to_fs(path, **options_for(path, storage_options))
    return fs, fs_path.rstrip("/") or "/"


def is_local(fs: AbstractFileSystem) -> bool:
    return "file" in _protocols(fs)


def same_filesystem(a: AbstractFileSystem, b: AbstractFileSystem) -> bool:
    return bool(_protocols(a) & _protocols(b))


def _protocols(fs: AbstractFileSystem) -> set[str]:
    protocol = fs.protocol
    return set(protocol) if isinstance(protocol, (tuple, list)) else {protocol}


def static_prefix(fs_path: str) -> str:
    """The folder part of a glob before its first wildcard (the path itself if no wildcard)."""
    cut = min((fs_path.find(c) for c in GLOB_CHARS if c in fs_path), default=-1)
    if cut < 0:
        return fs_path
    return posixpath.dirname(fs_path[:cut]) or "/"


def is_within(child: str, parent: str) -> bool:
    child, parent = child.rstrip("/"), parent.rstrip("/")
    return child == parent or child.startswith(parent + "/")


def is_hidden(relpath: str) -> bool:
    """Files and folders starting with ``_`` or ``.`` are bookkeeping, as for Spark and pyarrow."""
    return any(part.startswith(("_", ".")) for part in relpath.split("/"))


def fsync(fs: AbstractFileSystem, *paths: str) -> None:
    """Flush local files or folders to disk (a no-op elsewhere: an object store's upload is durable).

    A rename is durable only once its folder is synced, and a file's content only once the file
    is: without both, a power cut can leave a name pointing at an empty or missing file.
    """
    if not is_local(fs):
        return
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def ensure_folder(fs: AbstractFileSystem, folder: str) -> None:
    """Create ``folder`` if missing, durably: its parent is synced so that the new entry survives."""
    if not fs.isdir(folder):
        fs.makedirs(folder, exist_ok=True)
        fsync(fs, posixpath.dirname(folder))


def write_json(fs: AbstractFileSystem, path: str, payload: Any, *, compact: bool = False) -> None:
    """Write a JSON file durably, so that readers see the old or the new content, never a partial one.

    :param compact: without indentation (large files: a plan, commit records), else one value a line.
    """
    if compact:
        data = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    else:
        data = json.dumps(payload, indent=1, sort_keys=True).encode()
    if is_local(fs):
        # Local writes are not atomic: write a sibling, then rename over the target.
        folder = posixpath.dirname(path)
        tmp = f"{folder}/.{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp"
        ensure_folder(fs, folder)
        with fs.open(tmp, "wb") as f:
            f.write(data)
        fsync(fs, tmp)
        fs.mv(tmp, path)
        fsync(fs, folder)
    else:
        # Object stores publish an object only once its upload completes.
        with fs.open(path, "wb") as f:
            f.write(data)


def create_file(fs: AbstractFileSystem, path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data`` only if it does not exist; False when another writer created it first.

    Of writers racing to create one name, exactly one wins, on every filesystem.
    """
    if is_local(fs):
        # Written aside, then hard-linked to its name: link() fails if the name exists, and a
        # reader never sees the file half written (as it could after O_CREAT | O_EXCL).
        folder = posixpath.dirname(path)
        ensure_folder(fs, folder)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        fsync(fs, folder)
        return True
    try:
        # A conditional write, refused if the object exists: S3 and Azure send If-None-Match: *
        # (s3fs, adlfs), GCS ifGenerationMatch=0 (gcsfs); each raises FileExistsError on refusal.
        fs.pipe_file(path, data, mode="create")
    except FileExistsError:
        return False
    return True


def read_json(fs: AbstractFileSystem, path: str) -> Any:
    with fs.open(path, "rb") as f:
        return json.loads(f.read())
