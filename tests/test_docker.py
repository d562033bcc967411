"""Container images and the compose stack, checked without a Docker engine.

What can be verified by reading: the files exist, the compose file parses and wires its
services together, the images install this provider's version on the pinned Airflow and Ray,
and the preset connections hold what the hook and the operator read. `docker compose config`
and hadolint run when they are installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib

import pytest
import yaml
from airflow.sdk import Connection
from packaging.requirements import Requirement

from airflow_provider_raybatch import __version__
from airflow_provider_raybatch.get_provider_info import get_provider_info
from airflow_provider_raybatch.hooks.ray_connection import cluster_settings
from tests.conftest import REPO

DOCKER = REPO / "docker"
DOCKERFILES = ["airflow.Dockerfile", "ray.Dockerfile", "ray-gpu.Dockerfile"]
AIRFLOW_SERVICES = [
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
]
SERVICES = {"postgres", *AIRFLOW_SERVICES, "ray-head", "ray-worker", "minio", "s3-init"}
VARIABLE = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def env_example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (DOCKER / ".env.example").read_text().splitlines())
    return {k.strip(): v.strip() for k, v in (p for p in pairs if len(p) == 2 and not p[0].startswith("#"))}


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable substitution: ${VAR}, ${VAR:-default}, ${VAR:?error}, $$."""

    def substitute(match: re.Match) -> str:
        name, kind, arg = match.groups()
        if name in env and env[name] != "":
            return env[name]
        if kind == "?":
            raise KeyError(f"{name} is required: {arg}")
        return arg if kind == "-" else ""

    return VARIABLE.sub(substitute, value).replace("$$", "$")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def service_env(compose: dict, service: str) -> dict[str, str]:
    return {k: interpolate(str(v), env_example()) for k, v in compose["services"][service]["environment"].items()}


def test_files_exist():
    for name in [*DOCKERFILES, "compose.yaml", "compose.host-network.yaml", "README.md", ".env.example", "init_s3.py"]:
        assert (DOCKER / name).is_file(), name
    assert "issue 6" not in (DOCKER / "README.md").read_text(), "placeholder README left"


def test_compose_parses_and_wires_the_stack(compose):
    services = compose["services"]
    assert set(services) == SERVICES
    for name, service in services.items():
        assert "image" in service, name
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"
    for name, command in zip(
        AIRFLOW_SERVICES[1:], ["api-server", "scheduler", "dag-processor", "triggerer"], strict=True
    ):
        assert services[name]["command"] == command
        assert services[name]["depends_on"]["airflow-init"] == {"condition": "service_completed_successfully"}
    head, worker = services["ray-head"]["command"], services["ray-worker"]["command"]
    assert "--head" in head and "--dashboard-host=0.0.0.0" in head and "--block" in head
    gcs_port = re.search(r"--port=(\d+)", head).group(1)
    assert f"--address=ray-head:{gcs_port}" in worker and "--block" in worker
    published = {
        name: [interpolate(port, env_example()) for port in service.get("ports", [])]
        for name, service in services.items()
    }
    assert published["ray-head"] == ["127.0.0.1:8265:8265"]
    assert published["airflow-apiserver"] == ["127.0.0.1:8080:8080"]
    assert published["minio"] == ["127.0.0.1:9000:9000", "127.0.0.1:9001:9001"]
    assert service_env(compose, "airflow-scheduler")["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith(
        "postgresql+psycopg2://airflow:"
    )


def test_the_init_creates_the_pool_the_example_dag_uses(compose):
    """A task whose pool does not exist is never queued: airflow-init creates the DAG's pool."""
    init = compose["services"]["airflow-init"]
    command = [interpolate(part, env_example()) for part in init["command"]]
    assert command[:3] == ["pools", "set", "raybatch_gpu"] and int(command[3]) >= 1, command
    # The official image's entrypoint prefixes `airflow` after the migration and the admin user.
    assert init["environment"]["_AIRFLOW_DB_MIGRATE"] == "true"
    for service in AIRFLOW_SERVICES:
        assert service_env(compose, service)["RAYBATCH_POOL"] == command[2], service
    dag = (REPO / "dags" / "daily_batch_inference.py").read_text()
    assert 'pool=os.environ.get("RAYBATCH_POOL", "raybatch_gpu")' in dag


def test_the_ray_worker_sets_its_fixed_port_apart_from_the_heads(compose):
    """On one host's network (network_mode: host) two nodes would collide on the dashboard agent's
    port, the one port a node opens at a fixed number (52365 by default)."""
    worker = interpolate(compose["services"]["ray-worker"]["command"], env_example())
    port = re.search(r"--dashboard-agent-listen-port=(\d+)", worker)
    assert port and int(port.group(1)) != 52365
    assert "--dashboard-agent-listen-port" not in compose["services"]["ray-head"]["command"]
    # The override that puts the nodes on the host's network keeps the worker's port apart too.
    host = yaml.safe_load((DOCKER / "compose.host-network.yaml").read_text())["services"]
    assert {name: service["network_mode"] for name, service in host.items()} == {
        "ray-head": "host",
        "ray-worker": "host",
    }
    on_host = interpolate(host["ray-worker"]["command"], env_example())
    assert "--address=127.0.0.1:6379" in on_host and re.search(r"--dashboard-agent-listen-port=(\d+)", on_host).group(
        1
    ) == port.group(1)
    assert "compose.host-network.yaml" in (DOCKER / "README.md").read_text()


def test_the_airflow_image_takes_its_constraints_from_a_build_argument():
    text = (DOCKER / "airflow.Dockerfile").read_text()
    default = re.search(r"^ARG AIRFLOW_CONSTRAINTS=(\S+)$", text, re.M).group(1)
    assert default == (
        "https://raw.githubusercontent.com/apache/airflow/constraints-${AIRFLOW_VERSION}/constraints-${PYTHON_VERSION}.txt"
    )
    assert '--constraint "${AIRFLOW_CONSTRAINTS}"' in text
    # The repository's pins are in the image, for --build-arg AIRFLOW_CONSTRAINTS=/opt/raybatch/constraints.txt.
    assert re.search(r"^COPY .*\bconstraints\.txt\b.* /opt/raybatch/$", text, re.M)


def test_every_required_variable_is_in_the_env_example():
    text = (DOCKER / "compose.yaml").read_text()
    required = {name for name, kind, _ in VARIABLE.findall(text) if kind == "?"}
    assert required and required <= set(env_example()), required - set(env_example())
    assert "RAY_AUTH_TOKEN" in required


def test_images_install_this_provider_version_on_the_pinned_airflow_and_ray(compose):
    # One place for the version: the package's __version__, which the build reads.
    assert pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "airflow_provider_raybatch.__version__"}
    version = __version__
    # The images are built on the newest tested set: constraints.txt's pins.
    constraints = (REPO / "constraints.txt").read_text()
    ray_pin = re.search(r"^ray==(\S+)$", constraints, re.M).group(1)
    airflow_pin = re.search(r"^apache-airflow==(\S+)$", constraints, re.M).group(1)
    for name in DOCKERFILES:
        text = (DOCKER / name).read_text()
        assert f"ARG PROVIDER_VERSION={version}\n" in text, name
        assert "m.version('airflow-provider-raybatch'); sys.exit(0 if v == '${PROVIDER_VERSION}'" in text, name
        assert re.search(r"^COPY .*airflow_provider_raybatch ", text, re.M), f"{name} must install this source"
    airflow = (DOCKER / "airflow.Dockerfile").read_text()
    assert f"ARG AIRFLOW_VERSION={airflow_pin}\n" in airflow and "ARG PYTHON_VERSION=3.11\n" in airflow
    assert "FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}" in airflow
    assert "constraints-${AIRFLOW_VERSION}/constraints-${PYTHON_VERSION}.txt" in airflow
    for name, base in (("ray.Dockerfile", "-py311"), ("ray-gpu.Dockerfile", "-py311-gpu")):
        text = (DOCKER / name).read_text()
        assert f"ARG RAY_VERSION={ray_pin}\n" in text and f"FROM rayproject/ray:${{RAY_VERSION}}{base}\n" in text
        assert "pip install --no-cache-dir --no-deps /tmp/raybatch" in text, "the cluster must not need Airflow"
    vllm = pyproject()["project"]["optional-dependencies"]["vllm"]
    assert all(f'"{spec}"' in (DOCKER / "ray-gpu.Dockerfile").read_text() for spec in vllm)
    images = {interpolate(s["image"], {}) for s in compose["services"].values() if "raybatch" in s["image"]}
    assert images == {f"raybatch-airflow:{version}", f"raybatch-ray:{version}"}


def test_images_install_the_cluster_dependencies_and_the_torch_extra():
    """The Ray images install the provider with --no-deps and list its dependencies by hand: the
    lists must follow pyproject.toml, the `torch` extra included (its torch is the CPU build pinned
    by TORCH_VERSION, or vLLM's CUDA build on the GPU image)."""
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    assert not any(Requirement(d).name in ("torch", "safetensors") for d in project["dependencies"])
    torch_extra = {Requirement(d).name: d for d in extras["torch"]}
    assert set(torch_extra) == {"torch", "safetensors"}
    assert {"airflow-provider-raybatch[torch]"} <= set(extras["examples"]) & set(extras["llm"])
    # Everything but Airflow, Ray (installed with its own extras) and the Jobs API client of the Airflow side.
    cluster_core = [
        d for d in project["dependencies"] if Requirement(d).name not in ("apache-airflow", "ray", "aiohttp")
    ]
    torch_range = Requirement(torch_extra["torch"]).specifier
    for name in ("ray.Dockerfile", "ray-gpu.Dockerfile"):
        text = (DOCKER / name).read_text()
        for spec in [*cluster_core, torch_extra["safetensors"]]:
            assert f'"{spec}"' in text, f"{name} does not install {spec}"
    ray_cpu = (DOCKER / "ray.Dockerfile").read_text()
    assert '"torch==${TORCH_VERSION}"' in ray_cpu
    for name in ("ray.Dockerfile", "airflow.Dockerfile"):
        version = re.search(r"^ARG TORCH_VERSION=(\S+)$", (DOCKER / name).read_text(), re.M).group(1)
        assert version.endswith("+cpu") and torch_range.contains(version), (
            f"{name}: torch {version} not in {torch_range}"
        )
    # The Airflow image gets torch through the `examples` extra, pinned to the CPU build in the same install,
    # and the Amazon provider that resolves the stack's `aws_default` connection.
    airflow = (DOCKER / "airflow.Dockerfile").read_text()
    assert '"/opt/raybatch[examples,amazon]"' in airflow and '"torch==${TORCH_VERSION}"' in airflow


def test_ray_connection_env_matches_the_hook_fields(compose):
    env = service_env(compose, "airflow-scheduler")
    conn = json.loads(env["AIRFLOW_CONN_RAY_DEFAULT"])
    assert conn["conn_type"] == "ray" == get_provider_info()["connection-types"][0]["connection-type"]
    assert conn["host"] == "http://ray-head:8265"  # the dashboard / Jobs API the head publishes
    ray_env = service_env(compose, "ray-head")
    assert ray_env["RAY_AUTH_MODE"] == "token"
    assert conn["password"] == ray_env["RAY_AUTH_TOKEN"] == service_env(compose, "ray-worker")["RAY_AUTH_TOKEN"]
    (ray_type,) = [c for c in get_provider_info()["connection-types"] if c["connection-type"] == "ray"]
    names = set(ray_type["conn-fields"])
    assert set(conn["extra"]) <= names, f"extras the `ray` connection does not declare: {set(conn['extra']) - names}"
    # And the hook reads them as meant.
    cluster = cluster_settings(
        Connection(
            conn_id="ray_default",
            conn_type="ray",
            host=conn["host"],
            password=conn["password"],
            extra=json.dumps(conn["extra"]),
        )
    )
    assert cluster.address == "http://ray-head:8265" and cluster.namespace == conn["extra"]["namespace"]


def test_aws_connection_env_reaches_the_store(compose, monkeypatch):
    from airflow_provider_raybatch.hooks.object_stores import storage_options

    env = service_env(compose, "airflow-scheduler")
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", env["AIRFLOW_CONN_AWS_DEFAULT"])
    minio = service_env(compose, "minio")
    assert any(port.endswith(":9000") for port in compose["services"]["minio"]["ports"])
    assert storage_options("aws_default") == {
        "s3": {
            "client_kwargs": {"endpoint_url": "http://minio:9000", "region_name": "us-east-1"},
            "key": minio["MINIO_ROOT_USER"],
            "secret": minio["MINIO_ROOT_PASSWORD"],
        }
    }
    # Code reading s3:// without a connection (the example DAG) gets the same store from the env.
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (
        minio["MINIO_ROOT_USER"],
        minio["MINIO_ROOT_PASSWORD"],
    )


def compose_cli() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


@pytest.mark.parametrize("overrides", [[], ["compose.host-network.yaml"]])
def test_docker_compose_config_accepts_the_file(tmp_path, overrides):
    cli = compose_cli()
    if cli is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    env_file = tmp_path / ".env"
    env_file.write_text((DOCKER / ".env.example").read_text())
    files = [arg for name in ["compose.yaml", *overrides] for arg in ("-f", str(DOCKER / name))]
    result = subprocess.run(
        [*cli, "--env-file", str(env_file), *files, "config", "--quiet"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_no_error(name):
    if not shutil.which("hadolint"):
        pytest.skip("hadolint is not installed")
    result = subprocess.run(
        ["hadolint", "--failure-threshold", "error", str(DOCKER / name)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_stand_in_bases_cover_every_base_image_and_stay_in_the_test_tree(compose):
    """tests/docker builds stand-ins for the official bases (no registry there): one per image the
    project's Dockerfiles and compose file name, and none of them used from docker/."""
    from tests.support.docker.images import STANDINS, standin_tags

    tags = standin_tags()
    assert tags == {
        "airflow": "apache/airflow:3.3.2-python3.11",
        "ray": "rayproject/ray:2.60.0-py311",
        "postgres": compose["services"]["postgres"]["image"],
        "minio": interpolate(compose["services"]["minio"]["image"], {}),
    }
    for name in [*tags, "base"]:
        assert (STANDINS / name / "Dockerfile").is_file(), name
    for path in [*DOCKER.glob("*Dockerfile"), DOCKER / "compose.yaml"]:
        assert "standin" not in path.read_text(), f"{path.name} must not use the tests' stand-ins"
    assert "stand-in" in (DOCKER / "README.md").read_text() and "stand-in" in (REPO / "README.md").read_text()


def test_a_changed_stand_in_definition_is_built_again(tmp_path, monkeypatch):
    """A stand-in is reused while its label holds the digest of its definition: a change to one
    stand-in's folder changes its digest only; a change to the base changes every digest."""
    from tests.support.docker import images

    try:
        images.stand_in_python()
    except images.StandinsUnavailable as reason:
        pytest.skip(str(reason))
    copy = tmp_path / "standins"
    shutil.copytree(images.STANDINS, copy)
    monkeypatch.setattr(images, "STANDINS", copy)
    names = list(images.standin_tags())
    before = {name: images.definition_digest(name) for name in names}
    assert len(set(before.values())) == len(names)
    with (copy / "minio" / "entrypoint").open("a") as f:
        f.write("# changed\n")
    after = {name: images.definition_digest(name) for name in names}
    assert [name for name in names if after[name] != before[name]] == ["minio"]
    with (copy / "base" / "Dockerfile").open("a") as f:
        f.write("# changed\n")
    assert all(images.definition_digest(name) != after[name] for name in names)
