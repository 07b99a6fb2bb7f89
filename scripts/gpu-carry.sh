#!/usr/bin/env bash
# Packs what the GPU machine lacks for a full server build and its tests
# into .deps/gpu-carry, an ignored folder the device tool carries (called by
# `scripts/gpu-check.sh --prepare`; docs/testing-and-measuring.md, "GPU
# checks"). That machine (Ubuntu 24.04, PyTorch, nvcc, CMake, ninja) has no
# network and no gRPC, protobuf, abseil, spdlog, fmt, nlohmann-json,
# GoogleTest or SentencePiece development files, so this takes Debian 12's
# (this machine's release) with `apt-get download` and unpacks them with
# `dpkg -x`. Their run-time needs outside the carry are glibc, libstdc++,
# libgcc, zlib and OpenSSL 3, which that machine has (checked below with
# ldd); libcurl is carried only because prometheus-cpp's CMake config asks
# for it, and nothing loads it.
#
# The folder holds:
#   prefix.tar.xz  usr/: the unpacked packages and prometheus-cpp (from
#                  .deps/prometheus-cpp), without docs, man pages and the
#                  static libraries no CMake config names; sysdev/include:
#                  zlib's and OpenSSL's headers, used there only where the
#                  machine has no development files of its own. Packed: the
#                  device tool carries 64 MiB at most, and unpacked it is 43 MiB
#   env.sh         `source env.sh UNPACKED_DIR`: PATH, LD_LIBRARY_PATH and
#                  CMAKE_PREFIX_PATH with the carried packages first
#   wheels/        Python 3.12 wheels the tests need there: grpcio,
#                  grpcio-tools, grpcio-health-checking and protobuf at
#                  requirements-test.txt's versions, and gguf (transformers'
#                  GGUF loader and scripts/gpu_check_model.py)
#   model/         the default model's GGUF metadata (its tokenizer included)
#                  and tensor table, without the weights: the 98 MB GGUF does
#                  not fit, so scripts/gpu_check_model.py writes a model of the
#                  same shapes with seeded random weights there
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="${GPU_CARRY_DIR:-$ROOT/.deps/gpu-carry}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
MODEL="${SNAPSERVE_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
TRIPLET=x86_64-linux-gnu

PACKAGES=(
  # gRPC C++ and its code generator
  libgrpc++-dev libgrpc++1.51 libgrpc29 libgrpc-dev protobuf-compiler-grpc
  # protobuf
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler
  # gRPC's own needs
  libabsl-dev libabsl20220623 libre2-dev libre2-9 libc-ares-dev libc-ares2
  # logging, JSON, tests
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 nlohmann-json3-dev
  googletest libgtest-dev libgmock-dev
  # tokenizer.model support, required by the server build
  libsentencepiece-dev libsentencepiece0
  # the OpenAI HTTP API's Boost.Beast/Asio (headers only). libcurl's run-time
  # dependencies are not carried: the GPU build leaves the OTLP exporter out
  # (gpu-check.sh, -DSNAPSERVE_OTLP_EXPORT=OFF)
  libboost1.74-dev
  # named by prometheus-cpp's CMake config (pull and push), never linked
  libcivetweb-dev libcivetweb1 civetweb libcurl4-openssl-dev libcurl4
)
SYSTEM_DEV=(zlib1g-dev libssl-dev)
WHEELS=(grpcio grpcio-tools grpcio-health-checking protobuf gguf)

wheel_pin() {  # the version requirements-test.txt pins (protobuf: the venv's)
  local name="$1" pin
  pin="$(grep -i "^$name==" "$ROOT/requirements-test.txt" | head -1 | cut -d= -f3)"
  if [ -z "$pin" ]; then
    pin="$("$PY" -c "import importlib.metadata as m; print(m.version('$name'))")"
  fi
  echo "$name==$pin"
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
stage="$work/stage"
P="$stage/usr"
lib="$P/lib/$TRIPLET"
mkdir -p "$work/debs" "$stage/sysdev" "$work/sys"

echo "[gpu-carry] apt-get download: ${PACKAGES[*]} ${SYSTEM_DEV[*]}"
(cd "$work/debs" && apt-get download "${PACKAGES[@]}" "${SYSTEM_DEV[@]}") > "$work/apt.log" 2>&1 ||
  { cat "$work/apt.log"; echo "[gpu-carry] FAIL: apt-get download"; exit 1; }
for p in "${PACKAGES[@]}"; do dpkg -x "$work/debs/${p}_"*.deb "$stage"; done
for p in "${SYSTEM_DEV[@]}"; do dpkg -x "$work/debs/${p}_"*.deb "$work/sys"; done
cp -a "$work/sys/usr/include" "$stage/sysdev/"
cp -a "$ROOT/.deps/prometheus-cpp/usr/." "$P/"

# Not needed to build or run: documentation, the GoogleTest sources (the
# prebuilt libgtest/libgmock are carried), SentencePiece's trainer, and every
# static library except GoogleTest's, which its CMake config names.
rm -rf "$P/share/doc" "$P/share/doc-base" "$P/share/man" "$P/share/lintian" "$P/src"
rm -f "$lib"/libsentencepiece_train.*
find "$P/lib" -name '*.a' ! -name 'libgtest*.a' ! -name 'libgmock*.a' -delete
# Debian 12's libre2-dev ships a pkg-config file and no CMake config, and
# gRPC's CMake config then needs pkg-config, which the GPU machine may lack:
# a config naming the carried library stands in.
mkdir -p "$lib/cmake/re2"
cat > "$lib/cmake/re2/re2Config.cmake" <<'EOF'
# re2::re2 for gRPC's CMake config; written by scripts/gpu-carry.sh.
get_filename_component(_re2_prefix "${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)
if(NOT TARGET re2::re2)
  add_library(re2::re2 SHARED IMPORTED)
  set_target_properties(re2::re2 PROPERTIES
    IMPORTED_LOCATION "${_re2_prefix}/lib/x86_64-linux-gnu/libre2.so.9"
    IMPORTED_SONAME "libre2.so.9"
    INTERFACE_INCLUDE_DIRECTORIES "${_re2_prefix}/include")
endif()
set(re2_FOUND TRUE)
EOF
# Every file a carried CMake config checks on import must exist (CMake
# refuses a config whose files are missing), and no link may dangle.
missing="$(grep -rhiE 'list\(APPEND _(cmake_)?import_check_files_for_' "$lib/cmake" "$P/share/cmake" |
           grep -oE '\$\{_IMPORT_PREFIX\}/[^"]+' | sed 's|${_IMPORT_PREFIX}|'"$P"'|' | sort -u |
           while read -r f; do [ -e "$f" ] || echo "$f"; done)"
[ -z "$missing" ] || { echo "[gpu-carry] FAIL: files named by CMake configs are missing:"; echo "$missing"; exit 1; }
dangling="$(find "$stage" -xtype l)"
[ -z "$dangling" ] || { echo "[gpu-carry] FAIL: dangling links:"; echo "$dangling"; exit 1; }

# The carried code generators run on the carry's libraries alone (the
# system's gRPC and protobuf kept out of the search path).
env -i LD_LIBRARY_PATH="$lib" "$P/bin/protoc" --version
env -i LD_LIBRARY_PATH="$lib" "$P/bin/protoc" --proto_path="$ROOT/proto" --cpp_out="$work" \
  --grpc_out="$work" --plugin=protoc-gen-grpc="$P/bin/grpc_cpp_plugin" \
  "$ROOT/proto/snapserve/v1/generation.proto"
[ -s "$work/snapserve/v1/generation.grpc.pb.cc" ] ||
  { echo "[gpu-carry] FAIL: grpc_cpp_plugin wrote nothing"; exit 1; }
echo "[gpu-carry] protoc and grpc_cpp_plugin run on the carried libraries alone"
# What the carried libraries and programs still need from the machine: only
# base libraries that Ubuntu 24.04 has. libcurl and prometheus-cpp's push
# library (which needs it) are left out: nothing loads them, snapserve links
# prometheus-cpp's core alone.
outside="$(find "$P/bin" "$lib" -maxdepth 1 -type f \( -name '*.so*' -o -perm -u+x \) \
  ! -name 'libcurl*' ! -name 'libprometheus-cpp-push*' \
  -exec env -i LD_LIBRARY_PATH="$lib" ldd {} \; 2>/dev/null |
  awk -v carry="$stage" '/=>/ && index($3, carry) != 1 {print $1}' | sort -u)"
echo "[gpu-carry] needed from the machine: $(echo $outside)"
base='^(libc|libm|libstdc\+\+|libgcc_s|libz|libssl|libcrypto|libpthread|libdl|librt)\.so'
unexpected="$(echo "$outside" | grep -vE "$base" || true)"
[ -z "$unexpected" ] || { echo "[gpu-carry] FAIL: needed, not carried, not a base library: $unexpected"; exit 1; }

rm -rf "$CARRY"
mkdir -p "$CARRY/wheels" "$CARRY/model"
echo "[gpu-carry] packing $(du -sh "$stage" | cut -f1) into prefix.tar.xz"
tar -C "$stage" -cJf "$CARRY/prefix.tar.xz" usr sysdev

cat > "$CARRY/env.sh" <<'EOF'
# `source env.sh DIR`, DIR holding prefix.tar.xz unpacked (scripts/gpu-check.sh
# on the GPU machine): the carried packages first on every search path.
# Written by scripts/gpu-carry.sh.
export GPU_CARRY_PREFIX="$1/usr"
export GPU_CARRY_SYSDEV="$1/sysdev"
export PATH="$GPU_CARRY_PREFIX/bin:$PATH"
export LD_LIBRARY_PATH="$GPU_CARRY_PREFIX/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CMAKE_PREFIX_PATH="$GPU_CARRY_PREFIX${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
EOF

echo "[gpu-carry] wheels for Python 3.12"
pins=()
for w in "${WHEELS[@]}"; do pins+=("$(wheel_pin "$w")"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$CARRY/wheels" "${pins[@]}"
[ "$(ls "$CARRY/wheels"/*.whl | wc -l)" -eq "${#WHEELS[@]}" ] ||
  { echo "[gpu-carry] FAIL: expected ${#WHEELS[@]} wheels (${pins[*]})"; exit 1; }

echo "[gpu-carry] model metadata of $MODEL"
"$PY" "$ROOT/scripts/gpu_check_model.py" extract "$MODEL" "$CARRY/model"

echo "[gpu-carry] carry ready: $CARRY ($(du -sh "$CARRY" | cut -f1): prefix.tar.xz" \
     "$(du -sh "$CARRY/prefix.tar.xz" | cut -f1), wheels $(du -sh "$CARRY/wheels" | cut -f1)," \
     "model $(du -sh "$CARRY/model" | cut -f1))"
