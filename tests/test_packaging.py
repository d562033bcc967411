"""The wheel and sdist, built as a release would build them and checked as PyPI checks them."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from airflow_provider_raybatch import __version__
from tests.conftest import REPO

PACKAGE = "airflow_provider_raybatch"


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # An isolated build, from a copy of the tracked files only: what a release builds, not what
    # this checkout happens to hold (build/, egg-info, caches).
    src = out / "src"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes((REPO / name).read_bytes())
    build = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(src)], capture_output=True, text=True, timeout=600
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return out


def test_twine_accepts_the_wheel_and_the_sdist(dist):
    files = sorted(str(p) for p in dist.glob(f"{PACKAGE}-{__version__}*"))
    assert [Path(f).name for f in files] == [
        f"{PACKAGE}-{__version__}-py3-none-any.whl",
        f"{PACKAGE}-{__version__}.tar.gz",
    ]
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *files], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_wheel_holds_the_package_only_with_its_metadata(dist):
    wheel = zipfile.ZipFile(dist / f"{PACKAGE}-{__version__}-py3-none-any.whl")
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert tops == {PACKAGE, f"{PACKAGE}-{__version__}.dist-info"}
    assert f"{PACKAGE}/pipeline/commit/ledger.py" in wheel.namelist()
    metadata = Parser().parsestr(wheel.read(f"{PACKAGE}-{__version__}.dist-info/METADATA").decode())
    assert metadata["Version"] == __version__ and metadata["License-Expression"] == "Apache-2.0"
    assert "Framework :: Apache Airflow :: Provider" in metadata.get_all("Classifier")
    assert any(url.startswith("Changelog, ") for url in metadata.get_all("Project-URL"))
    entry_points = wheel.read(f"{PACKAGE}-{__version__}.dist-info/entry_points.txt").decode()
    assert f"provider_info = {PACKAGE}.get_provider_info:get_provider_info" in entry_points


def test_the_sdist_holds_the_package_and_the_changelog_not_the_tests(dist):
    with tarfile.open(dist / f"{PACKAGE}-{__version__}.tar.gz") as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md", "docs/changelog.md", f"{PACKAGE}/__init__.py"} <= names
    assert not any(name.startswith(("tests/", "benchmarks/", "dags/")) for name in names)
