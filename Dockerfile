# shardwise on GPU nodes: the CUDA stack (torch 2.13.0, fbgemm-gpu 1.8.0, torchrec 1.8.0) and shardwise.
# Every pipeline step and the MLflow server in manifests/ run this image.
#   make image                                         (docker build -t ghcr.io/shardwise/shardwise:0.1.0 .)
#   make image BASE_IMAGE=shardwise-base:bookworm      (a base made locally by docker/make-base.sh)
#   make image-cpu                                     (STACK=cpu, tag ...:0.1.0-cpu: the CPU builds, for running
#                                                       the pipeline's steps in containers on a machine without a
#                                                       GPU: `shardwise pipeline run --local --containers`)
# torch's CUDA wheels (the package index's default Linux build) bundle the CUDA user-space libraries, so the
# small `base` CUDA image (driver compatibility and NVIDIA container settings) is enough; any Debian/Ubuntu image
# with python3 serves as well (a GPU node's container runtime injects the driver).
ARG BASE_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04
# which requirements/<STACK>.txt: cuda (GPU nodes) or cpu (torch's CPU wheel comes from .build/wheels/, which
# `make image-cpu` fills from this host's pip find-links: the package index's default torch is the CUDA build)
ARG STACK=cuda

FROM ${BASE_IMAGE} AS build
ARG STACK
# the build stage's image, which the classic builder leaves untagged: `make image` prunes it by this label
LABEL shardwise.stage=build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# certificates of the build host (a proxy's CA, where it has one; `make image` puts them here) and local wheels
# (`make image-cpu`): every pip of this stage uses them through /etc/pip.conf; the final stage copies only the venv
COPY .build/ca/ /usr/local/share/shardwise-build-ca/
COPY .build/wheels/ /usr/local/share/shardwise-build-wheels/
RUN printf '[global]\n' > /etc/pip.conf \
    && if [ -s /usr/local/share/shardwise-build-ca/ca.crt ]; then \
        printf 'cert = /usr/local/share/shardwise-build-ca/ca.crt\n' >> /etc/pip.conf; fi \
    && printf 'find-links = /usr/local/share/shardwise-build-wheels\n' >> /etc/pip.conf
# dependencies first: this layer is reused until requirements change
COPY requirements/${STACK}.txt requirements/torchrec.txt requirements/
RUN pip install -r requirements/${STACK}.txt \
    && pip install --no-deps -r requirements/torchrec.txt
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-deps .

FROM ${BASE_IMAGE}
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
