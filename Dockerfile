# shardwise on GPU nodes: the CUDA stack (torch 2.13.0, fbgemm-gpu 1.8.0, torchrec 1.8.0) and shardwise.
# Every pipeline step and the MLflow server in manifests/ run this image.
#   docker build -t ghcr.io/shardwise/shardwise:0.1.0 .
# torch's CUDA wheels bundle the CUDA user-space libraries, so the small `base` CUDA image (driver
# compatibility and NVIDIA container settings) is enough; no toolkit is needed at run time.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04

FROM ${CUDA_IMAGE} AS build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# dependencies first: this layer is reused until requirements change
COPY requirements/cuda.txt requirements/torchrec.txt requirements/
RUN pip install -r requirements/cuda.txt \
    && pip install --no-deps -r requirements/torchrec.txt
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-deps .

FROM ${CUDA_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 shardwise
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 MPLCONFIGDIR=/tmp/matplotlib
# numeric, so Kubernetes' runAsNonRoot can verify it
USER 10001
WORKDIR /home/shardwise
# smoke check without a GPU (build hosts have none): the package and its CLI load
RUN shardwise --version
ENTRYPOINT []
CMD ["shardwise", "--help"]
