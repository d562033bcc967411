# Ray head and CPU workers with the provider's pipeline module and its model dependencies.
# Code that runs on the cluster never imports Airflow, so Airflow is not installed here.
# Build from the repository root:
#   docker build -f docker/ray.Dockerfile -t raybatch-ray:0.1.0 .
# GPU workers (CUDA, vLLM): docker/ray-gpu.Dockerfile.
ARG RAY_VERSION=2.60.0
FROM rayproject/ray:${RAY_VERSION}-py311

ARG RAY_VERSION
# Must equal airflow_provider_raybatch.__version__ (tests/test_docker.py checks it; the build checks it too).
ARG PROVIDER_VERSION=0.1.0
# The provider's `torch` extra (TorchPredictor), with the CPU build of torch (PyPI's is a CUDA
# build of several GB) from the CPU index; the version is within the extra's range.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0+cpu

COPY --chown=ray:users pyproject.toml README.md /tmp/raybatch/
COPY --chown=ray:users airflow_provider_raybatch /tmp/raybatch/airflow_provider_raybatch

# --no-deps: the provider's own dependencies include Airflow, so the pipeline's are listed here:
# the core ones the cluster needs (not Airflow nor its Jobs API client), then the `torch`
# extra (tests/test_docker.py checks both lists against pyproject.toml).
RUN pip install --no-cache-dir --no-deps /tmp/raybatch \
    && pip install --no-cache-dir --extra-index-url "${TORCH_INDEX_URL}" \
        "ray[data,default]==${RAY_VERSION}" \
        "pyarrow>=18" "fsspec>=2024.6" "s3fs>=2024.6" "numpy>=1.26" \
        "torch==${TORCH_VERSION}" "safetensors>=0.4" \
    && rm -rf /tmp/raybatch \
    && python -c "import importlib.metadata as m, sys; v = m.version('airflow-provider-raybatch'); sys.exit(0 if v == '${PROVIDER_VERSION}' else f'provider {v} != ${PROVIDER_VERSION}')" \
    && python -c "import airflow_provider_raybatch.pipeline.runner, airflow_provider_raybatch.predictors.torch, importlib.util, sys; sys.exit('airflow must not be needed' if importlib.util.find_spec('airflow') else 0)"
