"""The images the compose test runs: stand-in base images, then the project's own Dockerfiles.

No image registry is reachable here, so the official bases (`apache/airflow`, `rayproject/ray`,
`postgres`, `minio/minio`) are built as stand-ins under the same names from Debian packages and
PyPI: a Debian bookworm root file system made by `mmdebstrap --variant=minbase` and
`docker import`ed, then one Dockerfile per stand-in under tests/support/docker/standins/, whose Python
packages uv installs. Each stand-in is built once per machine: skipped when its tag exists with
the digest of its definition in its label (its folder, the packages and pins it installs, the
base's digest, the machine's extra CAs), rebuilt when any of them changed. The project's images
are built on top of them with docker/airflow.Dockerfile and docker/ray.Dockerfile every session,
where Docker's layer cache leaves only what changed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.requirements import Requirement

from tests.conftest import REPO
from tests.support.docker.engine import Engine

STANDINS = Path(__file__).resolve().parent / "standins"
BASE_TAG = "raybatch-standin/debian:bookworm"
ROOTFS_TAG = "raybatch-standin/debian:bookworm-rootfs"
CA_FOLDER = Path("/usr/local/share/ca-certificates")
#: The label that records the digest of a stand-in's definition (see :func:`definition_digest`).
DIGEST_LABEL = "raybatch.standin.sha256"
CACHE = Path(os.environ.get("RAYBATCH_STANDIN_CACHE", "/var/cache/raybatch-standins"))
#: python3 for the shared libraries the copied CPython links (OpenSSL, libffi, SQLite...);
#: dumb-init for the Airflow stand-in's entrypoint.
BASE_PACKAGES = ["python3", "python3-venv", "ca-certificates", "curl", "procps", "dumb-init"]
DEBIAN_MIRROR = "http://deb.debian.org/debian"
#: mmdebstrap rather than debootstrap: 40 s instead of nearly 4 minutes (apt's parallel downloads,
#: dpkg without fsync). The package lists stay, so that a stand-in's `apt-get install` needs no
#: `apt-get update`.
MMDEBSTRAP = [
    "mmdebstrap",
    "--variant=minbase",
    f"--include={','.join(BASE_PACKAGES)}",
    "--skip=cleanup/apt/lists",
    "--format=tar",
    "bookworm",
]
#: The root file system mmdebstrap makes, kept to import again after `docker system prune`;
#: its name changes with the command, so that a changed package list makes a new one.
ROOTFS_TAR = CACHE / f"bookworm-minbase-{hashlib.sha256(' '.join(MMDEBSTRAP).encode()).hexdigest()[:12]}.tar"


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
        specs = [*project["dependencies"], *extras["torch"], *extras["examples"], *extras["amazon"]]
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


class StandinsUnavailable(Exception):
    """The stand-ins cannot be built on this machine; the message says why."""


#: The Python the official images carry is a recent 3.11 (the Airflow constraints need >= 3.11.5:
#: soupsieve through the Amazon provider); Debian bookworm's is 3.11.2 and no Python download is
#: reachable here, so the stand-ins get the CPython 3.11 the tests run on, as the official images
#: get theirs: built from source for Debian bookworm under /usr/local.
MIN_PYTHON = (3, 11, 5)


def stand_in_python() -> Path:
    """The installation prefix of the CPython the stand-ins copy (the tests' own interpreter).

    :raises StandinsUnavailable: when the tests run on another Python than CPython 3.11.5+.
    """
    prefix = Path(sys.base_prefix)
    if sys.implementation.name != "cpython" or not MIN_PYTHON <= sys.version_info[:3] < (3, 12):
        raise StandinsUnavailable(
            f"the stand-ins copy the tests' Python, which must be CPython 3.11.5+ ({sys.version})"
        )
    if not (prefix / "bin" / "python3.11").is_file() or not (prefix / "lib" / "python3.11" / "os.py").is_file():
        raise StandinsUnavailable(f"{prefix} is not a CPython installation prefix (bin/python3.11, lib/python3.11)")
    return prefix


def _copy_python(prefix: Path, target: Path) -> None:
    """The interpreter, its shared library and standard library, without site-packages or tests."""
    (target / "bin").mkdir(parents=True)
    shutil.copy2(prefix / "bin" / "python3.11", target / "bin" / "python3.11")
    (target / "lib").mkdir()
    for library in (prefix / "lib").glob("libpython3*.so*"):
        shutil.copy2(library, target / "lib" / library.name)
    skip = shutil.ignore_patterns("site-packages", "test", "idlelib", "tkinter", "turtledemo")
    shutil.copytree(prefix / "lib" / "python3.11", target / "lib" / "python3.11", ignore=skip, symlinks=True)
    (target / "lib" / "python3.11" / "site-packages").mkdir()
    if (prefix / "include" / "python3.11").is_dir():
        shutil.copytree(prefix / "include" / "python3.11", target / "include" / "python3.11")


def _ca_files() -> list[Path]:
    return sorted(CA_FOLDER.rglob("*.crt")) if CA_FOLDER.is_dir() else []


def _digest(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def _folder(folder: Path) -> list[bytes]:
    return [
        str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    ]


def base_digest() -> str:
    """The base's definition: its folder, the mmdebstrap command and the machine's extra
    certificate authorities (when a proxy's CA is renewed, every stand-in is built again)."""
    cas = [path.name.encode() + b"\0" + path.read_bytes() for path in _ca_files()]
    python = f"{stand_in_python()} {sys.version}".encode()
    return _digest(" ".join(MMDEBSTRAP).encode(), python, *_folder(STANDINS / "base"), *cas)


def definition_digest(standin: str) -> str:
    """A stand-in's definition: its folder, the requirements and pins it installs, the torch wheel
    it is given, and the base's digest (a rebuilt base rebuilds every stand-in)."""
    return _digest(
        base_digest().encode(),
        *_folder(STANDINS / standin),
        (REPO / "constraints.txt").read_bytes(),
        "\n".join(_requirements(standin)).encode(),
        " ".join(w.name for w in _torch_wheels()).encode(),
    )


def _label(engine: Engine, tag: str) -> str | None:
    result = engine.run(
        "docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{DIGEST_LABEL}"}}}}', tag, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else None


def _image_id(engine: Engine, tag: str) -> str | None:
    result = engine.run("docker", "image", "inspect", "--format", "{{.Id}}", tag, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def _build(engine: Engine, tag: str, digest: str, context: Path, *args: str) -> None:
    """docker build, the digest in the image's label; the image the tag named before is removed
    (when no container uses it), so that rebuilt stand-ins do not pile up on the disk, and a
    failed step's container too (--force-rm)."""
    previous = _image_id(engine, tag)
    engine.run(
        "docker",
        "build",
        "--network=host",
        "--force-rm",
        "--label",
        f"{DIGEST_LABEL}={digest}",
        *args,
        "--tag",
        tag,
        str(context),
        timeout=3600,
    )
    if previous and previous != _image_id(engine, tag):
        engine.run("docker", "rmi", previous, check=False)


def ensure_base(engine: Engine, log: list[str]) -> None:
    digest = base_digest()
    if _label(engine, BASE_TAG) == digest:
        return
    started = time.monotonic()
    if _label(engine, ROOTFS_TAG) != ROOTFS_TAR.name:
        _import_rootfs(engine)
        log.append(f"{ROOTFS_TAG}: {time.monotonic() - started:.0f} s")
        started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(STANDINS / "base", context)
        (context / "ca").mkdir()
        for path in _ca_files():
            shutil.copy(path, context / "ca" / path.name)
        _copy_python(stand_in_python(), context / "python")
        _build(engine, BASE_TAG, digest, context)
    log.append(f"{BASE_TAG}: {time.monotonic() - started:.0f} s")


def _import_rootfs(engine: Engine) -> None:
    if not ROOTFS_TAR.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = ROOTFS_TAR.with_suffix(".partial")
        subprocess.run([*MMDEBSTRAP, str(partial), DEBIAN_MIRROR], check=True, capture_output=True, timeout=1800)
        partial.rename(ROOTFS_TAR)
    engine.run(
        "docker",
        "import",
        "--change",
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--change",
        'CMD ["bash"]',
        "--change",
        f"LABEL {DIGEST_LABEL}={ROOTFS_TAR.name}",
        str(ROOTFS_TAR),
        ROOTFS_TAG,
    )


@contextlib.contextmanager
def _wheel_server(wheels: list[Path]) -> Iterator[str | None]:
    """A loopback HTTP server listing the wheels (a find-links page for uv), which the builds reach
    on the host's network: the torch wheel (200 MB) is read from the machine instead of being
    copied into each build context and image layer. None when there are no wheels."""
    if not wheels:
        yield None
        return
    with tempfile.TemporaryDirectory() as folder:
        for wheel in wheels:
            (Path(folder) / wheel.name).symlink_to(wheel)

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=folder))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()
            server.server_close()


def _build_standin(engine: Engine, standin: str, tag: str, find_links: str | None, log: list[str]) -> None:
    digest = definition_digest(standin)
    if _label(engine, tag) == digest:
        return
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(STANDINS / standin, context)
        shutil.copy(REPO / "constraints.txt", context / "constraints.txt")
        (context / "requirements.txt").write_text("\n".join(_requirements(standin)) + "\n")
        # No torch index when the wheel is at hand (download.pytorch.org may not be reachable).
        wheel_args = ["--build-arg", f"FIND_LINKS={find_links}", "--build-arg", "TORCH_INDEX_URL="]
        _build(engine, tag, digest, context, *(wheel_args if find_links else []))
    log.append(f"{tag}: {time.monotonic() - started:.0f} s")


def ensure_standins(engine: Engine, log: list[str]) -> None:
    """Build every stand-in base image whose tag is missing or was built from another definition.

    The four are built at once: each build waits on the network, the disk or the CPU at different
    times, so together they take about half as long as one after another on two cores.
    """
    ensure_base(engine, log)
    started = time.monotonic()
    with _wheel_server(_torch_wheels()) as find_links, ThreadPoolExecutor(max_workers=4) as pool:
        builds = [
            pool.submit(_build_standin, engine, standin, tag, find_links, log)
            for standin, tag in standin_tags().items()
        ]
        for build in builds:
            build.result()
    log.append(f"stand-ins together: {time.monotonic() - started:.0f} s")


def build_project_images(engine: Engine, log: list[str]) -> dict[str, str]:
    """docker/airflow.Dockerfile and docker/ray.Dockerfile on the stand-ins, as a user builds them
    but with this repository's constraints (GitHub's constraint files are not reachable here)."""
    from airflow_provider_raybatch import __version__ as version

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
