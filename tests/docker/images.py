"""The images the compose test runs: stand-in base images, then the project's own Dockerfiles.

No image registry is reachable here, so the official bases (`apache/airflow`, `rayproject/ray`,
`postgres`, `minio/minio`) are built as stand-ins under the same names from Debian packages and
PyPI: a Debian bookworm root file system made by `debootstrap --variant=minbase` and
`docker import`ed, then one Dockerfile per stand-in under tests/docker/standins/. Each stand-in
is built once per machine (skipped when its tag exists); the project's images are built on top
of them with docker/airflow.Dockerfile and docker/ray.Dockerfile every session, where Docker's
layer cache leaves only what changed.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from tests.conftest import REPO
from tests.docker.engine import Engine

STANDINS = Path(__file__).resolve().parent / "standins"
BASE_TAG = "raybatch-standin/debian:bookworm"
ROOTFS_TAG = "raybatch-standin/debian:bookworm-rootfs"
CA_FOLDER = Path("/usr/local/share/ca-certificates")
CA_LABEL = "raybatch.standin.ca-sha256"
CACHE = Path(os.environ.get("RAYBATCH_STANDIN_CACHE", "/var/cache/raybatch-standins"))
#: The root file system debootstrap makes, kept to import again after `docker system prune`.
ROOTFS_TAR = CACHE / "bookworm-minbase.tar"
BASE_PACKAGES = ["python3", "python3-venv", "ca-certificates", "curl", "procps"]
DEBIAN_MIRROR = "http://deb.debian.org/debian"


def _dockerfile_arg(name: str, arg: str) -> str:
    return re.search(rf"^ARG {arg}=(\S+)$", (REPO / "docker" / name).read_text(), re.M).group(1)


def _from_line(name: str) -> str:
    """The base image a project Dockerfile names, its ARGs filled in with their defaults."""
    text = (REPO / "docker" / name).read_text()
    base = re.search(r"^FROM (\S+)$", text, re.M).group(1)
    return re.sub(r"\$\{(\w+)\}", lambda m: _dockerfile_arg(name, m.group(1)), base)


def standin_tags() -> dict[str, str]:
    """Stand-in folder -> the tag the project's Dockerfiles and compose file use."""
    compose = (REPO / "docker" / "compose.yaml").read_text()
    return {
        "airflow": _from_line("airflow.Dockerfile"),
        "ray": _from_line("ray.Dockerfile"),
        "postgres": re.search(r"^\s+image: (postgres:\S+)$", compose, re.M).group(1),
        "minio": re.search(r"\$\{MINIO_IMAGE:-(\S+)\}", compose).group(1),
    }


def _requirements(standin: str) -> list[str]:
    """The heavy dependencies a stand-in preinstalls, so that the project's image builds on top of
    it install only the provider: everything the provider needs besides itself (Airflow is
    installed at the image's version separately)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    torch = "torch==" + _dockerfile_arg("ray.Dockerfile", "TORCH_VERSION")
    own = "airflow-provider-raybatch"
    if standin == "airflow":
        specs = [*project["dependencies"], *extras["torch"], *extras["examples"]]
        skip = {"apache-airflow", own}
    else:
        specs = [*project["dependencies"], *extras["torch"]]
        skip = {"apache-airflow", "ray", "aiohttp", own}
    return [s for s in specs if Requirement(s).name not in skip and Requirement(s).name != "torch"] + [torch]


def _torch_wheels() -> list[Path]:
    """The CPU torch wheel from the machine's local wheel folders, when it has one (pip's
    find-links; download.pytorch.org is not reachable everywhere)."""
    version = _dockerfile_arg("ray.Dockerfile", "TORCH_VERSION")
    folders = [Path(p) for p in os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split() if not p.startswith("http")]
    return [w for f in folders if f.is_dir() for w in f.glob(f"torch-{version}-cp311-*.whl")][:1]


def _ca_files() -> list[Path]:
    return sorted(CA_FOLDER.rglob("*.crt")) if CA_FOLDER.is_dir() else []


def ca_digest() -> str:
    """The machine's extra certificate authorities, as the stand-ins' label records them: when they
    change (a proxy's CA renewed), every stand-in is built again."""
    digest = hashlib.sha256()
    for path in _ca_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _label(engine: Engine, tag: str) -> str | None:
    result = engine.run(
        "docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{CA_LABEL}"}}}}', tag, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else None


def ensure_base(engine: Engine, log: list[str]) -> None:
    if _label(engine, BASE_TAG) == ca_digest():
        return
    started = time.monotonic()
    if not engine.image_exists(ROOTFS_TAG):
        _import_rootfs(engine)
    with tempfile.TemporaryDirectory() as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(STANDINS / "base", context)
        (context / "ca").mkdir()
        for path in _ca_files():
            shutil.copy(path, context / "ca" / path.name)
        engine.run(
            "docker",
            "build",
            "--network=host",
            "--build-arg",
            f"CA_SHA256={ca_digest()}",
            "--tag",
            BASE_TAG,
            str(context),
        )
    log.append(f"{BASE_TAG}: {time.monotonic() - started:.0f} s")


def _import_rootfs(engine: Engine) -> None:
    if not ROOTFS_TAR.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            rootfs = Path(tmp) / "rootfs"
            subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}",
                    "bookworm",
                    str(rootfs),
                    DEBIAN_MIRROR,
                ],
                check=True,
                capture_output=True,
                timeout=1800,
            )
            for deb in (rootfs / "var" / "cache" / "apt" / "archives").glob("*.deb"):
                deb.unlink()
            partial = ROOTFS_TAR.with_suffix(".partial")
            subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True, timeout=600)
            partial.rename(ROOTFS_TAR)
    engine.run(
        "docker",
        "import",
        "--change",
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--change",
        'CMD ["bash"]',
        str(ROOTFS_TAR),
        ROOTFS_TAG,
    )


def ensure_standins(engine: Engine, log: list[str]) -> None:
    """Build every stand-in base image whose tag is missing."""
    ensure_base(engine, log)
    for standin, tag in standin_tags().items():
        if _label(engine, tag) == ca_digest():
            continue
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            context = Path(tmp) / "context"
            shutil.copytree(STANDINS / standin, context)
            shutil.copy(REPO / "constraints.txt", context / "constraints.txt")
            (context / "requirements.txt").write_text("\n".join(_requirements(standin)) + "\n")
            (context / "wheels").mkdir()
            wheels = _torch_wheels()
            for wheel in wheels:
                shutil.copy(wheel, context / "wheels" / wheel.name)
            # No torch index when the wheel is at hand (download.pytorch.org may not be reachable).
            index = [] if not wheels else ["--build-arg", "TORCH_INDEX_URL="]
            engine.run("docker", "build", "--network=host", *index, "--tag", tag, str(context), timeout=3600)
        log.append(f"{tag}: {time.monotonic() - started:.0f} s")


def build_project_images(engine: Engine, log: list[str]) -> dict[str, str]:
    """docker/airflow.Dockerfile and docker/ray.Dockerfile on the stand-ins, as a user builds them
    but with this repository's constraints (GitHub's constraint files are not reachable here)."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    images = {"airflow": f"raybatch-airflow:{version}", "ray": f"raybatch-ray:{version}"}
    args = {
        "airflow": ["--build-arg", "AIRFLOW_CONSTRAINTS=/opt/raybatch/constraints.txt"],
        "ray": [],
    }
    for name, tag in images.items():
        started = time.monotonic()
        engine.run(
            "docker",
            "build",
            "--network=host",
            # torch is already in the stand-ins: no CPU index needed (and not reachable everywhere).
            "--build-arg",
            "TORCH_INDEX_URL=https://pypi.org/simple",
            *args[name],
            "--file",
            str(REPO / "docker" / f"{name}.Dockerfile"),
            "--tag",
            tag,
            str(REPO),
            timeout=3600,
        )
        log.append(f"{tag}: {time.monotonic() - started:.0f} s")
    return images
