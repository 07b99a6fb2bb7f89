#!/usr/bin/env bash
# Builds and tries the container image without a Docker daemon (README,
# "Container image"): buildah builds the Dockerfile, podman runs it.
#
#   scripts/image.sh base    a Debian 12 base image made here with mmdebstrap
#                            (localhost/snapserve-base:bookworm), for machines that
#                            cannot pull from other registries
#   scripts/image.sh build   the Dockerfile, on IMAGE_BASE (default: that Debian
#                            base; IMAGE_BASE=cuda builds on NVIDIA's CUDA images)
#   scripts/image.sh test    runs the image with the host's models/ mounted at
#                            /models, probes grpc.health.v1, one Generate and
#                            /metrics from the host, then stops it
#
# Timings and sizes go to build/image/*.json (the README quotes them).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_IMAGE="localhost/snapserve-base:bookworm"
IMAGE="${IMAGE:-localhost/snapserve:cpu}"
IMAGE_BASE="${IMAGE_BASE:-debian}"
OUT="$ROOT/build/image"
say() { printf '[image] %s\n' "$*"; }

need_tools() {
  local missing=()
  for tool in "$@"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [ ${#missing[@]} -eq 0 ] && return
  say "installing ${missing[*]} (Debian packages)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}" uidmap
}

step_base() {
  need_tools buildah mmdebstrap
  if buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
    say "$BASE_IMAGE: already present"; return
  fi
  local tmp container mount
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  say "$BASE_IMAGE: mmdebstrap --variant=minbase bookworm"
  mmdebstrap --variant=minbase bookworm "$tmp/rootfs.tar" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
  container="$(buildah from scratch)"
  mount="$(buildah mount "$container")"
  tar -C "$mount" -xf "$tmp/rootfs.tar"
  buildah umount "$container" >/dev/null
  buildah config --cmd /bin/bash "$container"
  buildah commit -q "$container" "$BASE_IMAGE" >/dev/null
  buildah rm "$container" >/dev/null
  say "$BASE_IMAGE: made"
}

step_build() {
  need_tools buildah
  local args=()
  if [ "$IMAGE_BASE" = debian ]; then
    step_base
    args+=(--pull=never --build-arg "BUILDER_IMAGE=$BASE_IMAGE" --build-arg "RUNTIME_IMAGE=$BASE_IMAGE")
  elif [ "$IMAGE_BASE" != cuda ]; then
    say "IMAGE_BASE must be debian or cuda, not '$IMAGE_BASE'"; exit 2
  fi
  # Behind an egress that re-signs TLS, pip needs the host's CA bundle: bind it
  # in for the RUN steps only (PIP_CERT, as pip reads it; never in a layer).
  local host_ca="${PIP_CERT:-$(pip3 config get global.cert 2>/dev/null || true)}"
  if [ -n "$host_ca" ] && [ -f "$host_ca" ]; then
    args+=(-v "$host_ca:/run/host-ca.crt:ro" --build-arg EXTRA_CA_CERTS=/run/host-ca.crt)
  fi
  mkdir -p "$OUT"
  say "building $IMAGE on $IMAGE_BASE (the whole project is compiled inside: tens of minutes on 2 cores)"
  local start end
  start="$(date +%s)"
  # chroot isolation: no daemon, no nested user namespace; RUN steps share the
  # host's network, which the build needs for Debian and PyPI.
  buildah bud --isolation chroot --layers --format docker "${args[@]}" \
    --build-arg "JOBS=${JOBS:-$(nproc)}" -t "$IMAGE" -f "$ROOT/Dockerfile" "$ROOT"
  end="$(date +%s)"
  local size
  size="$(podman image inspect --format '{{.Size}}' "$IMAGE")"
  printf '{"image": "%s", "base": "%s", "build_seconds": %d, "size_bytes": %s}\n' \
    "$IMAGE" "$IMAGE_BASE" "$((end - start))" "$size" | tee "$OUT/build.json"
}

step_test() {
  need_tools podman runc
  [ -f "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" ] || bash "$ROOT/scripts/setup.sh" model
  mkdir -p "$OUT"
  exec "$ROOT/.venv/bin/python" "$ROOT/scripts/image_probe.py" --image "$IMAGE" \
    --models "$ROOT/models" --out "$OUT/test.json"
}

case "${1:-}" in
  base) step_base ;;
  build) step_build ;;
  test) step_test ;;
  *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
