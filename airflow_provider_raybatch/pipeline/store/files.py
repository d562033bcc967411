"""Filesystem access through fsspec: local paths, ``s3://`` (s3fs), ``gs://`` (gcsfs), ``abfs://`` / ``az://``
(adlfs), any fsspec protocol."""

from __future__ import annotations

import json
import logging
import os
import posixpath
import uuid
from collections.abc import Callable
from typing import Any

import fsspec
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.store.retries import is_transient, retry_transient
from airflow_provider_raybatch.pipeline.store.urls import options_for

log = logging.getLogger(__name__)

GLOB_CHARS = "*?["


def resolve(path: str, storage_options: dict[str, Any] | None = None) -> tuple[AbstractFileSystem, str]:
    """Return the filesystem for ``path`` and the path as that filesystem spells it.

    ``storage_options`` (credentials, endpoint) apply to remote paths only: one filesystem's options,
    or options keyed by store (``{"s3": {...}, "gs": {...}}``, see :func:`.urls.options_for`).
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


def write_json(
    fs: AbstractFileSystem, path: str, payload: Any, *, compact: bool = False, retry_s: float | None = None
) -> None:
    """Write a JSON file durably, so that readers see the old or the new content, never a partial one.

    Transient store errors are retried (:func:`.retries.retry_transient`: the same bytes to the
    same name). A write that still fails may have been applied all the same (a store can apply a
    PUT and answer 500, or lose the reply): it is read back, and counts as written when the
    store holds these bytes. Otherwise the error is raised, and the caller must treat the write
    as possibly done: delete nothing and count nothing on it.

    :param compact: without indentation (large files: a plan, commit records), else one value a line.
    :param retry_s: how long transient errors are retried (None: :func:`.retries.store_retry_seconds`).
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
        return
    # Object stores publish an object only once its upload completes.
    try:
        retry_transient(
            lambda: _settled(lambda: fs.pipe_file(path, data), fs, path, data), f"writing {path}", budget_s=retry_s
        )
    except Exception as e:
        if holds(fs, path, data):
            log.warning("Writing %s failed (%s: %s), but the store holds it: it was applied", path, type(e).__name__, e)
            return
        raise


def _settled(write: Callable[[], Any], fs: AbstractFileSystem, path: str, data: bytes) -> None:
    """``write()``; a transient error after which the store holds ``data`` at ``path`` counts as success.

    A store that applied the write and answered an error (or lost the reply) is found out at
    once, with one read, rather than after the retries of a write that succeeded long ago.
    """
    try:
        write()
    except Exception as e:
        if is_transient(e) and holds(fs, path, data, retry_s=0):
            return
        raise


def create_file(fs: AbstractFileSystem, path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data`` only if it does not exist; False when another writer created it first.

    Of writers racing to create one name, exactly one wins, on every filesystem. On an object
    store a create whose reply was lost is retried by the client and then refused (the object
    exists: the first attempt made it); a refusal or an error is therefore resolved by reading
    the object back: it is this writer's when it holds ``data`` (which callers make unique to
    the writer where it matters, e.g. a lease record naming the writer and the time).
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
        create = lambda: fs.pipe_file(path, data, mode="create")  # noqa: E731
        retry_transient(lambda: _settled(create, fs, path, data), f"creating {path}")
    except FileExistsError:
        return holds(fs, path, data)
    except Exception:
        if holds(fs, path, data):
            return True
        if exists(fs, path):
            return False  # another writer's: this one's create was not applied
        raise
    return True


def move(fs: AbstractFileSystem, source: str, target: str) -> None:
    """Rename ``source`` to ``target`` (on object stores: copy, then delete), transient errors retried.

    A move retried after an attempt whose reply was lost finds the source gone: it is done
    when the target is there and the source is not.
    """
    try:
        retry_transient(lambda: fs.mv(source, target), f"moving {source} to {target}")
    except FileNotFoundError:
        if not exists(fs, source) and exists(fs, target):
            return
        raise


def holds(fs: AbstractFileSystem, path: str, data: bytes, *, retry_s: float | None = None) -> bool:
    """Whether ``path`` holds exactly ``data`` (False when it is missing or cannot be read).

    :param retry_s: how long transient errors are retried (None: :func:`.retries.store_retry_seconds`).
    """
    try:
        return _read(fs, path, f"reading back {path}", budget_s=retry_s) == data
    except Exception:  # noqa: BLE001 - unknown: the caller treats the write as not resolved
        return False


def absent(fs: AbstractFileSystem, path: str) -> bool:
    """Whether ``path`` is known not to exist: a read of it says so (False when it exists or cannot be read).

    After a failed write this resolves its outcome as "not applied": only then may the caller undo
    what the write was to follow (a store that answers "not found" now has not applied it; should a
    delayed PUT land later all the same, readers check a record against its files).
    """
    try:
        _read(fs, path, f"looking up {path}", end=1)
    except FileNotFoundError:
        return True
    except Exception:  # noqa: BLE001 - unknown: not resolved
        return False
    return False


def exists(fs: AbstractFileSystem, path: str) -> bool:
    """``fs.exists`` with transient errors retried (a listing's cache is bypassed)."""
    fs.invalidate_cache(posixpath.dirname(path))
    return retry_transient(lambda: fs.exists(path), f"looking up {path}")


def ls(fs: AbstractFileSystem, folder: str) -> list[str]:
    """The paths in ``folder`` (none if it does not exist), listed afresh, transient errors retried."""
    fs.invalidate_cache(folder)

    def listing() -> list[str]:
        try:
            return fs.ls(folder, detail=False)
        except FileNotFoundError:
            return []

    return retry_transient(listing, f"listing {folder}")


def read_json(fs: AbstractFileSystem, path: str) -> Any:
    return json.loads(_read(fs, path, f"reading {path}"))


def _read(
    fs: AbstractFileSystem, path: str, what: str, *, budget_s: float | None = None, end: int | None = None
) -> bytes:
    """``path``'s bytes (up to ``end``) as the store holds them now, transient errors retried.

    The folder's cached listing is dropped first: s3fs answers a whole-object read of a file
    missing from a cached listing with FileNotFoundError without asking the store, so a file that
    this process created after listing its folder, or another writer's, would read as absent.
    """

    def read() -> bytes:
        fs.invalidate_cache(posixpath.dirname(path))
        return fs.cat_file(path, start=None if end is None else 0, end=end)

    return retry_transient(read, what, budget_s=budget_s)
