# syntax=docker/dockerfile:1
# One image for every role of lora-epp: `epp serve` (the endpoint picker), `epp sim`
# (the vLLM-compatible simulator), `epp controller` and `epp sidecar`. Pick the role with
# the container args, e.g. `args: ["serve", "--pool-name", "vllm-llama3-8b"]`.
#
# Reproducible build (same sources + same args → same files in the image):
#   docker build --build-arg SOURCE_DATE_EPOCH="$(git log -1 --format=%ct)" -t lora-epp:dev .
# With BuildKit ≥ 0.13 add `--output type=docker,rewrite-timestamp=true` to also clamp the
# layer timestamps. Pin the base by digest for production (`--build-arg PYTHON_IMAGE=...@sha256:...`).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ARG SOURCE_DATE_EPOCH=0
ENV SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH} \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_COMPILE=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY constraints.txt /src/constraints.txt
# Build tools come from the constraints file, not from build isolation, so the wheel is
# built by the same pinned setuptools every time.
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --constraint /src/constraints.txt setuptools grpcio-tools
COPY . /src
# Dependencies resolve against the constraints file only: every package gets its pinned
# version (the offline checks fail when the file misses one the code needs).
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels /src \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install --constraint /src/constraints.txt /wheels/*.whl \
 && /opt/venv/bin/pip check \
 && /opt/venv/bin/pip uninstall --yes pip \
 && find /opt/venv -name '__pycache__' -prune -exec rm -rf {} + \
 && /opt/venv/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/venv/lib

FROM ${PYTHON_IMAGE}
ARG SOURCE_DATE_EPOCH=0
LABEL org.opencontainers.image.title="lora-epp" \
      org.opencontainers.image.description="LoRA-aware Endpoint Picker for the Gateway API Inference Extension" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=builder /opt/venv /opt/venv
# 65532 is the conventional "nonroot" uid of distroless images; the manifests set
# runAsNonRoot and a read-only root filesystem, which this image is built to allow.
USER 65532:65532
WORKDIR /tmp
# 9002 ext_proc gRPC, 9003 gRPC health, 9090 Prometheus metrics, 8000 simulator HTTP.
EXPOSE 9002 9003 9090 8000
ENTRYPOINT ["epp"]
CMD ["serve", "--help"]
