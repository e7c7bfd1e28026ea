# syntax=docker/dockerfile:1
# histoserve: KServe predictor image for AOTInductor .pt2 tile encoders (CUDA, non-root).
#
#   docker build -t ghcr.io/histoserve/histoserve:0.1.0 .
#   docker build --target export -t ghcr.io/histoserve/histoserve:0.1.0-export .
#
# The default target is the serving image (no compiler, no export extra). The
# `export` target is the chart's model.build init container: the same torch and
# CUDA (checked while building), a C++ compiler and the CUDA toolkit from the
# base's -devel twin, and the `export` extra (timm, safetensors).
#
# The base is pinned by version; pin it by digest for reproducible builds:
#   docker build --build-arg BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime@sha256:<digest> .
# Its torch is the version the test suite runs (Makefile TORCH_SPEC); the
# package's runtime dependencies come from pyproject.toml: the base (client)
# dependencies, the `server` extra, and the `slides` extra so that the same
# image runs `histoserve embed` (the charts/histoserve-embed Job). No test,
# bench or export extras.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime
ARG EXPORT_BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-devel

# ---- builder: build the histoserve wheel (build tools never reach the runtime stage)
FROM ${BASE_IMAGE} AS builder
WORKDIR /src
COPY pyproject.toml README.md ./
COPY histoserve/ histoserve/
COPY predictor/ predictor/
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .
# The serving base's build (torch, CUDA): the export image must match it exactly,
# or the server refuses every package it writes.
RUN python -c "import torch; print(torch.__version__, torch.version.cuda)" > /wheels/serving-build.txt

# ---- export: `docker build --target export` (the chart's model.build image)
FROM ${EXPORT_BASE_IMAGE} AS export
# The runtime stage's user and paths, written again: a stage has one base, and
# this one is the -devel twin (tests/chart/test_dockerfile.py holds the two equal).
ARG HISTOSERVE_UID=10001
ARG HISTOSERVE_GID=10001
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/histoserve \
    USER=histoserve \
    TMPDIR=/tmp \
    XDG_CACHE_HOME=/var/cache/histoserve \
    TORCHINDUCTOR_CACHE_DIR=/var/cache/histoserve/torchinductor \
    TRITON_CACHE_DIR=/var/cache/histoserve/triton \
    CUDA_CACHE_PATH=/var/cache/histoserve/nv \
    TORCH_HOME=/var/cache/histoserve/torch
RUN groupadd --gid "${HISTOSERVE_GID}" histoserve \
 && useradd --uid "${HISTOSERVE_UID}" --gid "${HISTOSERVE_GID}" --no-log-init \
      --home-dir /home/histoserve --create-home --shell /usr/sbin/nologin histoserve \
 && mkdir -p /opt/ml/model /var/cache/histoserve \
 && chown "${HISTOSERVE_UID}:${HISTOSERVE_GID}" /home/histoserve /var/cache/histoserve
COPY --from=builder /wheels /wheels
RUN g++ --version && nvcc --version \
 && python -c "import torch; print(torch.__version__, torch.version.cuda)" > /tmp/export-build.txt \
 && cmp /wheels/serving-build.txt /tmp/export-build.txt \
 && python -m pip list --format=freeze \
      | grep -iE '^(torch|triton|nvidia-[a-z0-9-]+)==' > /tmp/base-constraints.txt \
 && wheel=$(echo /wheels/histoserve-*.whl) \
 && python -m pip install --no-cache-dir --constraint /tmp/base-constraints.txt "${wheel}[server,slides,export]" \
 && python -m pip check \
 && rm -rf /wheels /tmp/base-constraints.txt /tmp/export-build.txt
WORKDIR /home/histoserve
USER ${HISTOSERVE_UID}:${HISTOSERVE_GID}
ENTRYPOINT ["python", "-m", "predictor.export"]
CMD []

# ---- runtime
FROM ${BASE_IMAGE} AS runtime
# Must match the chart's podSecurityContext/securityContext (runAsUser/runAsGroup/fsGroup).
ARG HISTOSERVE_UID=10001
ARG HISTOSERVE_GID=10001

LABEL org.opencontainers.image.title="histoserve" \
      org.opencontainers.image.description="KServe predictor serving histopathology foundation models from AOTInductor .pt2 packages" \
      org.opencontainers.image.source="https://github.com/histoserve/histoserve" \
      org.opencontainers.image.licenses="Apache-2.0"

# The chart mounts the root filesystem read-only and emptyDirs at these paths.
# aoti_load_package extracts packages under TMPDIR; torch._inductor writes its
# CPU-ISA probes and kernel cache under TORCHINDUCTOR_CACHE_DIR. Expandable
# segments let the CUDA allocator grow one mapping instead of caching a block
# per batch shape (variable batch sizes fragment it; docs/deployment.md).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/histoserve \
    USER=histoserve \
    TMPDIR=/tmp \
    XDG_CACHE_HOME=/var/cache/histoserve \
    TORCHINDUCTOR_CACHE_DIR=/var/cache/histoserve/torchinductor \
    TRITON_CACHE_DIR=/var/cache/histoserve/triton \
    CUDA_CACHE_PATH=/var/cache/histoserve/nv \
    TORCH_HOME=/var/cache/histoserve/torch \
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

RUN groupadd --gid "${HISTOSERVE_GID}" histoserve \
 && useradd --uid "${HISTOSERVE_UID}" --gid "${HISTOSERVE_GID}" --no-log-init \
      --home-dir /home/histoserve --create-home --shell /usr/sbin/nologin histoserve \
 && mkdir -p /opt/ml/model /var/cache/histoserve \
 && chown "${HISTOSERVE_UID}:${HISTOSERVE_GID}" /home/histoserve /var/cache/histoserve

# Install the wheel with the `server` and `slides` extras only
# (no test/bench/export extras). The base image's torch, triton and CUDA wheels are held as constraints
# so pip never swaps them for other builds.
COPY --from=builder /wheels /wheels
RUN python -m pip list --format=freeze \
      | grep -iE '^(torch|triton|nvidia-[a-z0-9-]+)==' > /tmp/base-constraints.txt \
 && wheel=$(echo /wheels/histoserve-*.whl) \
 && python -m pip install --no-cache-dir --constraint /tmp/base-constraints.txt "${wheel}[server,slides]" \
 && python -m pip check \
 && rm -rf /wheels /tmp/base-constraints.txt

WORKDIR /home/histoserve
USER ${HISTOSERVE_UID}:${HISTOSERVE_GID}

# Checkpoints (.pt2 packages) are mounted here read-only (--model_dir default).
# 8080: HTTP (V1/V2 REST, /metrics, probes); 8081: V2 gRPC.
EXPOSE 8080 8081

ENTRYPOINT ["python", "-m", "predictor"]
CMD []
