"""A pytest plugin (``-p tests.support.slow_first``, with ``--dist loadfile --no-loadscope-reorder``): the test
files that take minutes go to the workers first, the rest after them, most tests first.

pytest-xdist's own order (``--loadscope-reorder``, its default) hands out the files with the most tests first, so
the files of one or two long tests came last: the compose stack's (2 tests, about 6 minutes) started some 40 minutes
into `make test`, among the node loss, the shared head's death and the like; whenever the other worker ran out of
files before it, it waited idle. A file goes to a worker as a whole: the long ones go first, and the short ones
that come last even out the workers' ends.
"""

from __future__ import annotations

from collections import Counter

import pytest

#: Files that take minutes, in the order they are handed out, with their seconds in CI on 2 workers (2026-11-29: the
#: sum of the file's tests among the slowest 30, so at least this long). Longest first, but for the compose stack:
#: third, a few minutes in, once `.ci/run`'s installs of the other jobs' venvs, which run beside the suite's first
#: minutes, are done or nearly (its health checks give up on a service whose check times out under load).
#: The files not listed follow, by number of tests.
SLOW_FILES = [
    "tests/test_benchmarks.py",  # 210
    "tests/pipeline/test_store_faults.py",  # 194
    "tests/docker/test_compose_stack.py",  # 346
    "tests/pipeline/runtime/test_shared_ray.py",  # 183
    "tests/e2e/test_scheduler.py",  # 159
    "tests/operators/test_ray_pipeline_on_cluster.py",  # 133
    "tests/pipeline/test_runner.py",  # 132
    "tests/pipeline/test_node_loss.py",  # 109
    "tests/operators/test_batch_inference.py",  # 98
    "tests/pipeline/runtime/test_shared_head_death.py",  # 82
]


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Sort the collected tests by file: the listed files first, in their order, then the others by number of tests.

    :param items: the tests, sorted in place; a file's tests stay together and in their order (the sort is stable).
    """
    tests = Counter(_file(item) for item in items)
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: (rank.get(_file(item), len(rank)), -tests[_file(item)]))
