"""The provider as it was at an earlier commit, for before/after comparisons (``driver_path``,
``start_cost``): a temporary git worktree whose package a child imports in place of this one."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.support.paths import REPO

#: The last commit whose driver received every row and wrote every range file, with a ledger of
#: one record per range and a plan listing every range: "before" in the scale-out benchmarks.
BEFORE_SCALE_OUT = "b0ef868"


@contextmanager
def provider_at(commit: str) -> Iterator[str]:
    """A folder holding the provider package as it was at ``commit`` (in a temporary git worktree).

    Put it first on a child's ``sys.path`` (the ``package_root`` parameter of the variants): only
    the provider comes from the earlier commit, the benchmark's own code stays this checkout's.
    """
    with tempfile.TemporaryDirectory(prefix="rbb-before-") as tmp:
        tree, package_root = Path(tmp) / "tree", Path(tmp) / "package"
        subprocess.run(["git", "worktree", "add", "--detach", tree, commit], cwd=REPO, check=True)
        try:
            package_root.mkdir()
            (package_root / "airflow_provider_raybatch").symlink_to(tree / "airflow_provider_raybatch")
            yield str(package_root)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=REPO, check=False)
