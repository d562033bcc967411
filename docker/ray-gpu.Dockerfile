# Ray GPU workers (CUDA) with the provider's pipeline module and the `vllm` extra.
# Build from the repository root:
#   docker build -f docker/ray-gpu.Dockerfile -t raybatch-ray-gpu:0.1.0 .
# vLLM brings its own CUDA build of torch (2.14 for vllm 0.33), so no CPU index here.
ARG RAY_VERSION=2.60.0
FROM rayproject/ray:${RAY_VERSION}-py311-gpu

ARG RAY_VERSION
# Must equal airflow_provider_raybatch.__version__ (tests/test_docker.py checks it; the build checks it too).
ARG PROVIDER_VERSION=0.1.0

COPY --chown=ray:users pyproject.toml README.md /tmp/raybatch/
COPY --chown=ray:users airflow_provider_raybatch /tmp/raybatch/airflow_provider_raybatch

# --no-deps: the provider's own dependencies include Airflow, so the pipeline's are listed here:
# the core ones the cluster needs (not Airflow nor its Jobs API client), the `torch` extra
# (TorchPredictor) whose torch comes with vLLM, and the `vllm` extra (tests/test_docker.py
# checks these lists against pyproject.toml).
RUN pip install --no-cache-dir --no-deps /tmp/raybatch \
    && pip install --no-cache-dir \
        "ray[data,default]==${RAY_VERSION}" \
        "pyarrow>=18" "fsspec>=2024.6" "s3fs>=2024.6" "numpy>=1.26" \
        "safetensors>=0.4" \
        "vllm>=0.33" \
    && rm -rf /tmp/raybatch \
    && python -c "import importlib.metadata as m, sys; v = m.version('airflow-provider-raybatch'); sys.exit(0 if v == '${PROVIDER_VERSION}' else f'provider {v} != ${PROVIDER_VERSION}')"
