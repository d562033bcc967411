"""Reading many input files' footers: by threads of this process, or, when this process is a Ray
driver (a Ray Job on a cluster) and the input has many files, by Ray tasks spread over the cluster
(:func:`read_footers`): both give the same files, fingerprints and schemas.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
from fsspec import AbstractFileSystem

from airflow_provider_raybatch.pipeline.errors import ConfigError, InputError
from airflow_provider_raybatch.pipeline.planning.input_files import InputFile, read_file_info

log = logging.getLogger(__name__)


#: Reads the footers of ``paths`` (under the input root ``root``): ``(fs, root, paths, id_column)`` ->
#: each file's :class:`InputFile` and Arrow schema, in the order of ``paths``; raises
#: :class:`InputError` naming the first file (in that order) that cannot be read.
FooterReader = Callable[[AbstractFileSystem, str, list[str], str | None], list[tuple[InputFile, pa.Schema]]]

#: Threads reading footers in one process: footer reads wait on storage (one or two requests per
#: file on an object store) more than they compute.
FOOTER_THREADS = 16
#: Environment variable: the fewest input files whose footers a Ray driver reads with Ray tasks.
RAY_FOOTERS_MIN_FILES_ENV = "RAYBATCH_RAY_FOOTERS_MIN_FILES"
#: Below this many files, the driver's threads read the footers before Ray tasks would have
#: started: a job's first tasks start fresh worker processes (1-3 s measured on 2 cores), while
#: threads read a local footer in 0.3-0.5 ms (benchmarks/planning_cost.py) and one on an object
#: store in a request or two. Above it, the reads spread over the cluster's nodes and networks.
DEFAULT_RAY_FOOTERS_MIN_FILES = 1000
#: Files per Ray task, at least and at most: a task is worth its scheduling only with some hundred
#: footers, and a task of a few thousand is short enough to redo if its node is lost.
MIN_FILES_PER_TASK, MAX_FILES_PER_TASK = 100, 2000


def read_footers(
    fs: AbstractFileSystem, root: str, paths: list[str], id_column: str | None
) -> list[tuple[InputFile, pa.Schema]]:
    """The default :data:`FooterReader`: Ray tasks on a Ray driver with many files, else threads here.

    Ray is used only when this process is already connected to it (the driver of a Ray Job): it
    is never started for planning, so an embedded run plans before its local Ray starts, and
    bad settings or input fail before that expensive start.
    """
    if len(paths) >= ray_footers_min_files() and _ray_is_initialized():
        return read_footers_on_ray(fs, root, paths, id_column)
    return read_footers_threaded(fs, root, paths, id_column)


def ray_footers_min_files() -> int:
    """:data:`DEFAULT_RAY_FOOTERS_MIN_FILES`, or the value of :data:`RAY_FOOTERS_MIN_FILES_ENV`."""
    value = os.environ.get(RAY_FOOTERS_MIN_FILES_ENV, "").strip()
    try:
        return int(value) if value else DEFAULT_RAY_FOOTERS_MIN_FILES
    except ValueError:
        raise ConfigError(f"{RAY_FOOTERS_MIN_FILES_ENV} must be an integer, got {value!r}") from None


def _ray_is_initialized() -> bool:
    # Not imported means not initialised; importing Ray only to ask would cost seconds.
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def read_footers_threaded(
    fs: AbstractFileSystem, root: str, paths: list[str], id_column: str | None
) -> list[tuple[InputFile, pa.Schema]]:
    """A :data:`FooterReader`: :data:`FOOTER_THREADS` threads of this process."""
    with ThreadPoolExecutor(max_workers=max(1, min(FOOTER_THREADS, len(paths)))) as pool:
        return list(pool.map(lambda p: read_file_info(fs, p, root, id_column), paths))


def read_footers_on_ray(
    fs: AbstractFileSystem,
    root: str,
    paths: list[str],
    id_column: str | None,
    *,
    files_per_task: int | None = None,
) -> list[tuple[InputFile, pa.Schema]]:
    """A :data:`FooterReader`: Ray tasks of this process's Ray (which must be initialised), each
    reading a contiguous batch of files with threads.

    Batches, not a task per file: 100,000 files make at most a few hundred tasks.

    :param files_per_task: the files of each task; None: about two tasks per CPU of the cluster,
        within :data:`MIN_FILES_PER_TASK` and :data:`MAX_FILES_PER_TASK`.
    """
    import ray

    if files_per_task is None:
        files_per_task = _files_per_task(len(paths), int(ray.cluster_resources().get("CPU", 1)))
    started = time.monotonic()
    # SPREAD: footer reads wait on storage, so each node's network adds to the throughput.
    task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_read_footer_batch)
    fs_ref = ray.put(fs)
    batches = [paths[i : i + files_per_task] for i in range(0, len(paths), files_per_task)]
    results = ray.get([task.remote(fs_ref, root, batch, id_column) for batch in batches])
    infos: list[tuple[InputFile, pa.Schema]] = []
    for files, schemas, error in results:
        infos.extend((info, schemas[index]) for info, index in files)
        if error is not None:
            # The batches are in path order and each stops at its first bad file: this is the
            # first bad file of the input, as the threads would name it.
            raise InputError(error)
    log.info("Read %d footers in %d Ray task(s) in %.1f s", len(infos), len(batches), time.monotonic() - started)
    return infos


def _files_per_task(files: int, cpus: int) -> int:
    """About two tasks per CPU (a slow node's batch is then not the last to wait for), each of
    :data:`MIN_FILES_PER_TASK` to :data:`MAX_FILES_PER_TASK` files where there are enough."""
    most = math.ceil(files / MIN_FILES_PER_TASK)
    fewest = math.ceil(files / MAX_FILES_PER_TASK)
    tasks = max(1, min(most, max(2 * max(cpus, 1), fewest)))
    return math.ceil(files / tasks)


def _read_footer_batch(
    fs: AbstractFileSystem, root: str, paths: list[str], id_column: str | None
) -> tuple[list[tuple[InputFile, int]], list[pa.Schema], str | None]:
    """One Ray task's footers: each file with the index of its schema among the batch's distinct
    schemas (the files of an input mostly share one: it travels back once), and the first error."""
    files: list[tuple[InputFile, int]] = []
    schemas: list[pa.Schema] = []
    index_of: dict[bytes, int] = {}
    try:
        infos = read_footers_threaded(fs, root, paths, id_column)
    except InputError as e:
        # The exception's message, not the exception: a Ray task error would wrap it in a traceback.
        return files, schemas, str(e)
    for info, schema in infos:
        key = schema.serialize().to_pybytes()
        if key not in index_of:
            index_of[key] = len(schemas)
            schemas.append(schema)
        files.append((info, index_of[key]))
    return files, schemas, None
