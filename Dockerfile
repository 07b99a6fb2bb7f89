# syntax=docker/dockerfile:1
#
# snapserve image: build with the repository's own scripts/setup.sh + `make build`
# in a CUDA 13 devel image, then ship only the binary and the shared libraries it
# loads on top of the matching CUDA runtime image.
#
#   docker build -t snapserve:dev .                        # model mounted at /models
#   docker build -t snapserve:dev --build-arg BAKE_MODEL=1 .  # model baked into /models
#
# Two bases, chosen by build arguments (README, "Container image"):
#  - production (default): NVIDIA's CUDA devel image to build, its runtime image to run;
#  - CPU: a plain Debian 12 image for both stages, e.g. the one `make image` makes
#    with mmdebstrap (scripts/image.sh), for machines that cannot pull from other
#    registries or have no GPU:
#      --build-arg BUILDER_IMAGE=localhost/snapserve-base:bookworm
#      --build-arg RUNTIME_IMAGE=localhost/snapserve-base:bookworm
#    With no nvcc in the builder, CMake builds without the CUDA kernels
#    (SNAPSERVE_WITH_CUDA=AUTO) and the server runs on the CPU.
#
# Why both stages use /opt/snapserve: the binary finds LibTorch (.venv/.../torch/lib)
# and prometheus-cpp (.deps/prometheus-cpp) through an absolute RPATH written at link
# time (README "Binaries find every shared library ... through RPATH"). Copying them to
# the same absolute paths in the runtime stage keeps that RPATH valid with no
# LD_LIBRARY_PATH and no patchelf.
#
# No secrets are used or stored: setup.sh reads only public Debian mirrors and PyPI.

ARG CUDA_VERSION=13.0.2
ARG UBUNTU=ubuntu24.04
ARG BUILDER_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU}
ARG RUNTIME_IMAGE=nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}

############################ builder ############################
FROM ${BUILDER_IMAGE} AS builder

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /opt/snapserve

# setup.sh's prometheus/kustomize steps verify Debian 13 package lists with the
# Debian archive keyring, which Ubuntu does not install by default. The version
# floats with the Ubuntu 24.04 archive on purpose (keyring updates are wanted).
# hadolint ignore=DL3008
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends debian-archive-keyring ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# Dependencies first (their own cached layers): the same script `make` runs.
# `all` also fetches kustomize and the default model; the model is only copied
# into the final image with BAKE_MODEL=1.
COPY scripts/setup.sh scripts/setup.sh
COPY requirements.txt requirements-test.txt ./
# EXTRA_CA_CERTS: a CA bundle for pip on networks whose egress re-signs TLS (a
# path inside the build, bound in by the builder, never copied into a layer:
# scripts/image.sh passes the host's PIP_CERT this way).
ARG EXTRA_CA_CERTS=""
RUN if [ -n "${EXTRA_CA_CERTS}" ]; then export PIP_CERT="${EXTRA_CA_CERTS}"; fi \
 && bash scripts/setup.sh all && rm -rf /var/lib/apt/lists/* /root/.cache/pip

# Then the sources and the same `make build` as everywhere else. The CUDA kernels
# are compiled for the GPUs the EKS overlay schedules on: A100 (80), A10G (86),
# L4/L40S (89), H100/H200 (90).
COPY . .
# (The Makefile passes CMAKE_ARGS to the shell unquoted: the inner quotes keep the ';'.)
ARG CUDA_ARCHS="80;86;89;90"
ARG TORCH_ARCHS="8.0;8.6;8.9;9.0"
ARG JOBS=""
RUN make build BUILD_DIR=/opt/snapserve/build \
      JOBS="${JOBS:-$(nproc)}" \
      CMAKE_ARGS="-DBUILD_TESTING=OFF -DCMAKE_CUDA_ARCHITECTURES='${CUDA_ARCHS}' -DTORCH_CUDA_ARCH_LIST='${TORCH_ARCHS}'" \
 && ./build/server/snapserve --help >/dev/null

# Stage exactly what the runtime needs under /stage, at the same absolute paths:
#  - the binary and the SentencePiece module it dlopen()s
#    (build/engine/libsnapserve_sentencepiece.so, engine/tokenizer/sentencepiece_shim.h);
#  - LibTorch's libraries and the pip CUDA libraries it finds next to it (RPATH
#    $ORIGIN/../../nvidia/...); the whole folders, because torch and cuDNN dlopen()
#    parts of them lazily, which ldd cannot see;
#  - prometheus-cpp from .deps;
#  - every other shared library ldd resolves outside /opt/snapserve (gRPC, protobuf,
#    abseil, spdlog, fmt, sentencepiece, libcudart, ...) except glibc/libstdc++,
#    which the runtime base already has, into /opt/snapserve/syslib (ld.so.conf.d).
ARG BAKE_MODEL=0
RUN set -eux; \
    site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
    mkdir -p /stage/etc/ld.so.conf.d /stage/opt/snapserve/syslib /stage/models; \
    cp -a --parents build/server/snapserve build/engine/libsnapserve_sentencepiece.so /stage/opt/snapserve/; \
    cp -a --parents "${site#/opt/snapserve/}/torch/lib" /stage/opt/snapserve/; \
    cp -a --parents "${site#/opt/snapserve/}/nvidia" /stage/opt/snapserve/; \
    cp -a --parents .deps/prometheus-cpp/usr/lib /stage/opt/snapserve/; \
    ldd build/server/snapserve build/engine/libsnapserve_sentencepiece.so \
      | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u \
      | grep -v '^/opt/snapserve/' \
      | grep -Ev '/(ld-linux[^/]*|lib(c|m|dl|rt|pthread|resolv|gcc_s|stdc\+\+)\.so[^/]*)$' \
      | xargs -r -I{} cp -L {} /stage/opt/snapserve/syslib/; \
    echo /opt/snapserve/syslib > /stage/etc/ld.so.conf.d/zz-snapserve.conf; \
    if [ "${BAKE_MODEL}" = "1" ]; then cp models/SmolLM2-135M-Instruct.Q4_1.gguf /stage/models/; fi

############################ runtime ############################
FROM ${RUNTIME_IMAGE} AS runtime

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/snapserve

COPY --from=builder /stage/ /

# The binary's RPATH names /usr/local/cuda/lib (the devel image's layout); point it at
# the runtime image's CUDA libraries as well (the CPU base has no /usr/local/cuda).
# Then refuse to produce an image whose binary cannot resolve a library or does not
# start.
RUN { [ ! -d /usr/local/cuda ] || [ -e /usr/local/cuda/lib ] || ln -s lib64 /usr/local/cuda/lib; } \
 && ldconfig \
 && { ! ldd /opt/snapserve/build/server/snapserve | grep 'not found'; } \
 && /opt/snapserve/build/server/snapserve --help >/dev/null \
 && groupadd --system --gid 10001 snapserve \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin snapserve

# Defaults; the Kubernetes ConfigMap overrides them (SNAPSERVE_<FLAG>,
# docs/architecture.md, "Configuration").
ENV SNAPSERVE_MODEL=/models/SmolLM2-135M-Instruct.Q4_1.gguf \
    SNAPSERVE_HOST=0.0.0.0 \
    SNAPSERVE_PORT=50051 \
    SNAPSERVE_METRICS_PORT=9464

# The model is mounted at /models (Kubernetes: a read-only volume), or was baked in
# with BAKE_MODEL=1. No VOLUME instruction: it would shadow a baked model with an
# anonymous volume under some runtimes.
EXPOSE 50051 9464

# Numeric, so Kubernetes runAsNonRoot can verify it.
USER 10001:10001

# Health is grpc.health.v1 on the gRPC port; Kubernetes probes it natively (no
# HEALTHCHECK: Docker has no built-in gRPC check and the image carries no client).
ENTRYPOINT ["/opt/snapserve/build/server/snapserve"]
