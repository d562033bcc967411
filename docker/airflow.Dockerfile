# Airflow with the raybatch provider, from the official Airflow image.
# Build from the repository root:
#   docker build -f docker/airflow.Dockerfile -t raybatch-airflow:0.1.0 .
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11
FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}

ARG AIRFLOW_VERSION
ARG PYTHON_VERSION
# Must equal airflow_provider_raybatch.__version__ (tests/test_docker.py checks it; the build checks it too).
ARG PROVIDER_VERSION=0.1.0
# The `examples` extra brings the `torch` extra (torch, safetensors); `amazon` resolves the stack's
# `aws_default` connection through the Amazon provider. torch from PyPI is a CUDA
# build of several GB; the Airflow side needs the CPU build only (embedded Ray runs on the
# Airflow worker when no `ray` connection is set). The `+cpu` pin takes it from the CPU index;
# the `torch` extra in pyproject.toml allows torch >=2.13,<2.15.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0+cpu
# Where pip reads the constraints: Airflow's published file for this Airflow and Python (the
# default), or a file in the image: `--build-arg AIRFLOW_CONSTRAINTS=/opt/raybatch/constraints.txt`
# takes this repository's pins (copied below), for builds that cannot reach GitHub.
ARG AIRFLOW_CONSTRAINTS=https://raw.githubusercontent.com/apache/airflow/constraints-${AIRFLOW_VERSION}/constraints-${PYTHON_VERSION}.txt

COPY --chown=airflow:0 pyproject.toml README.md constraints.txt /opt/raybatch/
COPY --chown=airflow:0 airflow_provider_raybatch /opt/raybatch/airflow_provider_raybatch
COPY --chown=airflow:0 dags /opt/airflow/dags

# Airflow itself is pinned to the image's version and every shared dependency to Airflow's
# constraints for that version and Python, so installing the provider cannot move them.
RUN pip install --no-cache-dir \
        --extra-index-url "${TORCH_INDEX_URL}" \
        --constraint "${AIRFLOW_CONSTRAINTS}" \
        "apache-airflow==${AIRFLOW_VERSION}" \
        "torch==${TORCH_VERSION}" \
        "/opt/raybatch[examples,amazon]" \
    && python -c "import importlib.metadata as m, sys; v = m.version('airflow-provider-raybatch'); sys.exit(0 if v == '${PROVIDER_VERSION}' else f'provider {v} != ${PROVIDER_VERSION}')"
