#!/usr/bin/env bash
# The GPU check (docs/testing-and-measuring.md, "GPU checks"): the whole
# server built with CUDA on the lent GPU machine, its tests, a CUDA server
# under the end-to-end suites, and the CUDA benchmark, ending in one verdict.
#
#   scripts/gpu-check.sh --prepare      here: packs .deps/gpu-carry (scripts/gpu-carry.sh)
#   scripts/gpu-check.sh --dry-run [--require-carry]
#                                       here, no CUDA needed: checks this script's
#                                       lists against the tests and prints what a
#                                       run would do; exits 0 only when consistent
#   scripts/gpu-check.sh --check-carry  here: the carried CMake packages resolve
#                                       with the system's search paths turned off
#   scripts/gpu-check.sh OUT_DIR        on the GPU machine, .deps/gpu-carry carried
#
# The run exits non-zero on a failed build, any ctest failure (or a skip not
# for a missing CPU feature, scripts/ctest-skips.py), any pytest failure or
# error, any skipped GPU test, a test file that crashes or hangs (no JUnit
# report), a failed benchmark, or a machine without CUDA. Every step runs and
# its status is collected; the decision comes at the end. OUT_DIR gets
# summary.txt (the verdict and every count), logs.tar.gz (every log and JUnit
# report, the servers' own logs) and the benchmark's JSON: the device tool
# brings back eight files at most.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="${GPU_CARRY_DIR:-$ROOT/.deps/gpu-carry}"
TESTS_DIR="${GPU_CHECK_TESTS_DIR:-$ROOT/tests/python}"
BUILD="${GPU_CHECK_BUILD_DIR:-$ROOT/build-gpu}"

# Every test file that holds a @pytest.mark.gpu test; each runs with `-m gpu`
# in its own pytest process. --dry-run fails when a file with a GPU test is
# missing here, or a file here has none.
GPU_TEST_FILES=(
  test_paged_attention.py
  test_snapkv_reference.py
  test_snapkv_scores.py
  test_model_cuda.py
  test_server_cuda_e2e.py
  test_cuda_fused_kernels.py
)

# The end-to-end suites run against a server on CUDA in bfloat16 (the
# SNAPSERVE_TEST_SERVER_ARGS below, which every test server takes last) that
# serves scripts/gpu_check_model.py's random-weight model of the default
# model's shapes and tokenizer.
E2E_SERVER_ARGS="--device=cuda --dtype=bfloat16"
E2E_FILES=(
  test_server_e2e.py
  test_adaptive_e2e.py
  test_streaming_llm_e2e.py
  test_logprobs.py
  test_prefix_cache.py
)
# Tests of those files left out there, each with its reason ("id|reason").
# test_server_cuda_e2e.py checks greedy tokens, logprobs and chunked prefill
# on CUDA against transformers within stated bfloat16 bounds instead.
FLOAT32_TOKENS="compares float32 results with transformers token for token or within 1e-3"
FLOAT32_KV="sizes its KV cache for float32 entries (46080 bytes a token); on CUDA entries are bfloat16"
BATCH_BITS="asserts results bit-identical alone and batched, which only the CPU kernels promise (docs/kv-cache-and-scheduling.md)"
E2E_LEFT_OUT=(
  "test_server_e2e.py::test_greedy_matches_transformers|$FLOAT32_TOKENS"
  "test_server_e2e.py::test_model_info_reports_the_flags|asserts dtype float32 and a float32 KV capacity"
  "test_server_e2e.py::test_bad_request[larger_than_kv_cache]|$FLOAT32_KV"
  "test_server_e2e.py::test_bad_request[larger_than_kv_cache_uncompressed]|$FLOAT32_KV"
  "test_adaptive_e2e.py::test_server_matches_python_pipeline|$FLOAT32_TOKENS"
  "test_adaptive_e2e.py::test_pyramid_keeps_fewer_blocks_in_deep_layers|$FLOAT32_KV"
  "test_streaming_llm_e2e.py::test_reference_rule|checks the Python reference alone, no server"
  "test_streaming_llm_e2e.py::test_server_streaming_llm_matches_python_pipeline|$FLOAT32_TOKENS"
  "test_streaming_llm_e2e.py::test_model_info_reports_the_sink_default|$FLOAT32_KV"
  "test_streaming_llm_e2e.py::test_only_kept_entries_take_cache_room|$FLOAT32_KV"
  "test_logprobs.py::test_greedy_logprobs_match_transformers_unary_and_stream|$FLOAT32_TOKENS"
  "test_logprobs.py::test_sampled_logprobs_are_tempered_but_not_truncated|$FLOAT32_TOKENS"
  "test_logprobs.py::test_repetition_penalty_is_in_the_reported_distribution|$FLOAT32_TOKENS"
  "test_logprobs.py::test_logprobs_do_not_depend_on_the_batch|$BATCH_BITS"
  "test_prefix_cache.py::test_a_cached_prefix_computes_what_a_cold_prefill_computes|$BATCH_BITS (its hits run batched beside misses)"
)
# Suites not run there at all, with the reason.
E2E_FILES_LEFT_OUT=(
  "test_snapkv_e2e.py|every server test $FLOAT32_TOKENS (the SnapKV pipeline on real weights); the CUDA selection is checked against the CPU's in test_snapkv_reference.py"
  "test_batching_invariance.py|$BATCH_BITS"
  "test_openai_http.py|drives the server with the openai package, which that machine's image lacks (with pydantic and jiter); the HTTP front door hands requests to the same engine as gRPC"
)
# ctest cases left out there ("regex|reason").
CTEST_LEFT_OUT=(
  "^GgufFileTest\.RealSmolLm2File$|reads the real 98 MB GGUF, which does not travel"
  "^fuzz_harnesses$|the libFuzzer harnesses (SNAPSERVE_FUZZ_TESTS=OFF here) test parsers that are the same on every machine; make test runs them"
)

MODE="${1:-}"
DRY=0
REQUIRE_CARRY=0
case "$MODE" in
  --prepare) exec bash "$ROOT/scripts/gpu-carry.sh" ;;
  --dry-run) DRY=1; [ "${2:-}" = "--require-carry" ] && REQUIRE_CARRY=1 ;;
  --check-carry) ;;
  ""|-*) echo "usage: scripts/gpu-check.sh OUT_DIR | --prepare | --dry-run [--require-carry] | --check-carry"
         exit 2 ;;
esac

# ---------------------------------------------------------------- helpers --
say() { echo "[gpu-check] $*"; }
# Prints a command, then runs it unless this is a dry run; returns its status.
run() {
  echo "+ $*"
  [ "$DRY" = 1 ] && return 0
  "$@"
}
# A command with its output into a log file (printed as `cmd > log`).
run_logged() {
  local log="$1"; shift
  echo "+ $* > $log 2>&1"
  [ "$DRY" = 1 ] && return 0
  "$@" > "$log" 2>&1
}
left_out_ids() {  # the node ids of E2E_LEFT_OUT that belong to file $1
  local entry
  for entry in "${E2E_LEFT_OUT[@]}"; do
    case "$entry" in "$1::"*) echo "${entry%%|*}" ;; esac
  done
}

# Links the build to zlib's and OpenSSL's development files: the machine's
# own where it has them, else the carried headers with links to the
# machine's run-time libraries. Prints the CMake arguments.
system_dev_args() {
  local dir="$1" triplet=x86_64-linux-gnu so args=()
  find_runtime() {  # the machine's copy of soname $1
    local d
    for d in "/usr/lib/$triplet" "/lib/$triplet" /usr/lib64 /lib64 /usr/lib; do
      [ -e "$d/$1" ] && { echo "$d/$1"; return 0; }
    done
    ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n {print $NF; exit}'
  }
  mkdir -p "$dir/lib"
  if [ ! -e /usr/include/zlib.h ] || [ -z "$(find_runtime libz.so)" ]; then
    so="$(find_runtime libz.so.1)"
    ln -sf "$so" "$dir/lib/libz.so"
    args+=("-DZLIB_INCLUDE_DIR=$GPU_CARRY_SYSDEV/include" "-DZLIB_LIBRARY=$dir/lib/libz.so")
  fi
  if [ ! -e /usr/include/openssl/ssl.h ] || [ -z "$(find_runtime libssl.so)" ]; then
    ln -sf "$(find_runtime libssl.so.3)" "$dir/lib/libssl.so"
    ln -sf "$(find_runtime libcrypto.so.3)" "$dir/lib/libcrypto.so"
    args+=("-DOPENSSL_INCLUDE_DIR=$GPU_CARRY_SYSDEV/include"
           "-DOPENSSL_SSL_LIBRARY=$dir/lib/libssl.so" "-DOPENSSL_CRYPTO_LIBRARY=$dir/lib/libcrypto.so")
  fi
  echo "${args[@]}"
}

unpack_carry() {  # unpacks the carry into $1 and puts it first on the search paths
  [ -f "$CARRY/prefix.tar.xz" ] || { say "$CARRY/prefix.tar.xz missing: run scripts/gpu-check.sh --prepare here and carry .deps/gpu-carry"; return 1; }
  rm -rf "$1" && mkdir -p "$1" &&
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
      "$CARRY/prefix.tar.xz" "$1" &&
    source "$CARRY/env.sh" "$1"
}

# ------------------------------------------------------------ --check-carry --
# The carried packages found by CMake in the GPU machine's search order (the
# carry first), each found path checked to lie in the carry: the system's
# own gRPC, protobuf and the rest, which this machine has, must not be the
# ones found. zlib and OpenSSL take the fallback the GPU machine takes when
# it lacks their development files (the carried headers, links to this
# machine's libraries); glibc's libdl is the system's.
if [ "$MODE" = "--check-carry" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  unpack_carry "$tmp/carry" || exit 1
  cat > "$tmp/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.22)
project(carry_probe CXX)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(spdlog REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_path(SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h REQUIRED)
find_library(SENTENCEPIECE_LIBRARY sentencepiece REQUIRED)
foreach(v Protobuf_INCLUDE_DIR Protobuf_LIBRARY Protobuf_PROTOC_EXECUTABLE gRPC_DIR absl_DIR re2_DIR
          c-ares_INCLUDE_DIR c-ares_LIBRARY spdlog_DIR fmt_DIR prometheus-cpp_DIR civetweb_DIR
          CURL_INCLUDE_DIR nlohmann_json_DIR GTest_DIR GRPC_CPP_PLUGIN SENTENCEPIECE_INCLUDE_DIR
          SENTENCEPIECE_LIBRARY ZLIB_LIBRARY OPENSSL_SSL_LIBRARY OPENSSL_INCLUDE_DIR)
  message(STATUS "probe ${v}=${${v}}")
endforeach()
add_executable(probe probe.cc)
target_link_libraries(probe PRIVATE gRPC::grpc++ gRPC::grpc++_reflection prometheus-cpp::core
                      spdlog::spdlog nlohmann_json::nlohmann_json GTest::gtest)
EOF
  cat > "$tmp/probe.cc" <<'EOF'
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
int main() { return grpc::Version().empty() ? 1 : 0; }
EOF
  mkdir -p "$tmp/sysdev/lib"
  for so in libz.so.1:libz.so libssl.so.3:libssl.so libcrypto.so.3:libcrypto.so; do
    ln -sf "$(ldconfig -p | awk -v n="${so%%:*}" '$1 == n {print $NF; exit}')" "$tmp/sysdev/lib/${so##*:}"
  done
  dev=("-DZLIB_INCLUDE_DIR=$GPU_CARRY_SYSDEV/include" "-DZLIB_LIBRARY=$tmp/sysdev/lib/libz.so"
       "-DOPENSSL_INCLUDE_DIR=$GPU_CARRY_SYSDEV/include"
       "-DOPENSSL_SSL_LIBRARY=$tmp/sysdev/lib/libssl.so"
       "-DOPENSSL_CRYPTO_LIBRARY=$tmp/sysdev/lib/libcrypto.so")
  say "configuring a probe against the carry"
  if ! cmake -S "$tmp" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$GPU_CARRY_PREFIX" "${dev[@]}" \
      > "$tmp/configure.log" 2>&1; then
    cat "$tmp/configure.log"; say "FAIL: the carried packages do not configure"; exit 1
  fi
  grep 'probe ' "$tmp/configure.log"
  outside="$(grep 'probe ' "$tmp/configure.log" | grep -v "=$tmp" | grep -v '=$' || true)"
  [ -z "$outside" ] || { say "FAIL: found outside the carry:"; echo "$outside"; exit 1; }
  if ! cmake --build "$tmp/build" > "$tmp/build.log" 2>&1 ||
     ! env -i LD_LIBRARY_PATH="$GPU_CARRY_PREFIX/lib/x86_64-linux-gnu" "$tmp/build/probe"; then
    cat "$tmp/build.log"; say "FAIL: a program linked against the carry does not build or run"; exit 1
  fi
  libs="$(env -i LD_LIBRARY_PATH="$GPU_CARRY_PREFIX/lib/x86_64-linux-gnu" ldd "$tmp/build/probe")"
  if echo "$libs" | grep -E 'grpc|protobuf|absl|spdlog|fmt|prometheus|cares|re2' | grep -qv "$tmp"; then
    echo "$libs"; say "FAIL: the probe loads a system copy of a carried library"; exit 1
  fi
  say "carry OK: every package resolves inside it; a gRPC + prometheus-cpp + spdlog +"
  say "GoogleTest program links and runs on the carried libraries alone"
  exit 0
fi

# ---------------------------------------------------------------- dry run --
# Collects the tests with the marker `gpu` (pytest, whose collection is what
# the run uses) and compares the files they are in with GPU_TEST_FILES; checks
# that every left-out id and file exists.
if [ "$DRY" = 1 ]; then
  PY="${PYTHON:-$ROOT/.venv/bin/python}"
  bad=0
  collected="$(cd "$ROOT" && PYTHONPATH="$ROOT" "$PY" -m pytest --collect-only -q -m gpu \
               -p no:cacheprovider "$TESTS_DIR" 2>&1)"
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "$collected" | tail -30
    say "FAIL: collecting the gpu tests in $TESTS_DIR failed (pytest exit $rc)"
    exit 1
  fi
  gpu_ids="$(echo "$collected" | grep '::')"
  mapfile -t found < <(echo "$gpu_ids" | sed 's/::.*//' | xargs -n1 basename | sort -u)
  say "gpu tests collected in $TESTS_DIR: $(echo "$gpu_ids" | grep -c .) in ${#found[@]} files: ${found[*]}"
  for f in "${found[@]}"; do
    if ! printf '%s\n' "${GPU_TEST_FILES[@]}" | grep -qx "$f"; then
      say "FAIL: $f holds @pytest.mark.gpu tests but is not in GPU_TEST_FILES"
      bad=1
    fi
  done
  for f in "${GPU_TEST_FILES[@]}"; do
    if ! printf '%s\n' "${found[@]}" | grep -qx "$f"; then
      say "FAIL: GPU_TEST_FILES names $f, which holds no @pytest.mark.gpu test"
      bad=1
    fi
  done
  e2e_paths=()
  for f in "${E2E_FILES[@]}"; do e2e_paths+=("$TESTS_DIR/$f"); done
  e2e_ids="$(cd "$ROOT" && PYTHONPATH="$ROOT" "$PY" -m pytest --collect-only -q -p no:cacheprovider \
             "${e2e_paths[@]}" 2>&1 | grep '::' | sed 's|.*/||')"
  for entry in "${E2E_LEFT_OUT[@]}"; do
    id="${entry%%|*}"
    # An id may name a whole parametrized test (its cases all left out).
    if ! echo "$e2e_ids" | grep -qF -e "$id" ; then
      say "FAIL: E2E_LEFT_OUT names $id, which is not collected"
      bad=1
    fi
  done
  for entry in "${E2E_FILES_LEFT_OUT[@]}"; do
    [ -f "$TESTS_DIR/${entry%%|*}" ] || { say "FAIL: E2E_FILES_LEFT_OUT names ${entry%%|*}, which does not exist"; bad=1; }
  done
  for f in scripts/ctest-skips.py scripts/gpu_check_junit.py scripts/gpu_check_model.py; do
    [ -f "$ROOT/$f" ] || { say "FAIL: $f missing"; bad=1; }
  done
  if [ -f "$CARRY/prefix.tar.xz" ]; then
    say "carry: $CARRY ($(du -sh "$CARRY" | cut -f1))"
  elif [ "$REQUIRE_CARRY" = 1 ]; then
    say "FAIL: $CARRY/prefix.tar.xz missing (run scripts/gpu-check.sh --prepare)"
    bad=1
  else
    say "carry: not prepared (scripts/gpu-check.sh --prepare)"
  fi
  say "the run would do:"
fi

# -------------------------------------------------------------------- run --
OUT="$(realpath -m -- "$MODE")"
cd "$ROOT" || exit 2
TESTS=tests/python  # relative: pytest's node ids are
[ "$DRY" = 1 ] && OUT="OUT_DIR"
PY="${GPU_CHECK_PYTHON:-python3}"
[ "$DRY" = 1 ] && PY="${PYTHON:-$ROOT/.venv/bin/python}"
# A rehearsal of the run's own plumbing on a machine without CUDA, never a
# PASS: GPU_CHECK_REHEARSAL=1 goes on without CUDA, takes the build in
# GPU_CHECK_BUILD_DIR as it is (no configure, no build, no wheels: that
# Python has its own packages), runs only the ctest cases that match
# GPU_CHECK_CTEST_REGEX and serves the end-to-end suites with
# GPU_CHECK_E2E_ARGS (e.g. "--device=cpu --dtype=bfloat16").
REHEARSAL="${GPU_CHECK_REHEARSAL:-0}"
# GPU_CHECK_E2E_FILES (names, space-separated) narrows the end-to-end suites.
[ -n "${GPU_CHECK_E2E_FILES:-}" ] && read -r -a E2E_FILES <<< "$GPU_CHECK_E2E_FILES"
E2E_SERVER_ARGS="${GPU_CHECK_E2E_ARGS:-$E2E_SERVER_ARGS}"
LOGS="$BUILD/gpu-check-logs"
JOBS="$(nproc)"
SITE="$BUILD/python-site"
E2E_MODEL="$BUILD/gpu-check-model.gguf"
declare -A status
problems=()
[ "$DRY" = 1 ] || { rm -rf "$LOGS"; mkdir -p "$OUT" "$LOGS"; }

# The machine; no CUDA is a failure, decided here.
run_logged "$LOGS/machine.json" "$PY" -c '
import json, os, platform, torch
ok = torch.cuda.is_available()
print(json.dumps({"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                  "cuda": torch.version.cuda, "cuda_available": ok,
                  "gpu": torch.cuda.get_device_name(0) if ok else None}))'
if [ "$DRY" = 0 ]; then
  cat "$LOGS/machine.json"
  if [ "$REHEARSAL" = 1 ]; then
    problems+=("a rehearsal, not a GPU check")
  elif ! grep -q '"cuda_available": true' "$LOGS/machine.json"; then
    echo "gpu-check: FAIL (torch.cuda.is_available() is false on this machine)" | tee "$OUT/summary.txt"
    exit 1
  fi
fi

finish() {  # writes the summary and the logs' tarball, prints the verdict, exits
  local verdict
  if [ ${#problems[@]} -eq 0 ]; then verdict="PASS"; else verdict="FAIL"; fi
  local counts="ctest ${status[ctest]:-not run}, gpu tests ${status[gpu]:-not run}, e2e on cuda ${status[e2e]:-not run}, bench ${status[bench]:-not run}"
  {
    echo "wall ${SECONDS}s; machine $(cat "$LOGS/machine.json" 2>/dev/null)"
    for p in "${problems[@]}"; do echo "problem: $p"; done
    cat "$LOGS/details.txt" 2>/dev/null
    if [ ${#problems[@]} -eq 0 ]; then
      echo "gpu-check: PASS ($counts)"
    else
      local joined
      joined="$(printf '%s; ' "${problems[@]}")"
      echo "gpu-check: FAIL ($counts; ${joined%; })"
    fi
  } > "$OUT/summary.txt"
  # The test servers' own logs, this run's only.
  find "$BUILD" -maxdepth 1 -name 'snapserve-*.log' -newer "$LOGS/machine.json" \
    -exec cp {} "$LOGS/" \;
  tar -C "$BUILD" -czf "$OUT/logs.tar.gz" gpu-check-logs
  tail -1 "$OUT/summary.txt"
  [ "$verdict" = PASS ]
  exit $?
}
# A line of the summary (printed too); a dry run has no results, only notes.
# summary.txt grows with every line, so that a run cut short by the device
# tool's limit still brings back what it found (without a verdict line).
detail() {
  [ "$DRY" = 1 ] && return 0
  echo "$*" >> "$LOGS/details.txt"; echo "$*"; cp "$LOGS/details.txt" "$OUT/summary.txt"
}
note() { echo "$*"; [ "$DRY" = 1 ] || { echo "$*" >> "$LOGS/details.txt"; cp "$LOGS/details.txt" "$OUT/summary.txt"; }; }

# The carried packages and Python wheels.
if ! { [ "$DRY" = 1 ] || unpack_carry "$BUILD/carry"; }; then
  problems+=("carry missing"); finish
fi
[ "$DRY" = 1 ] && { GPU_CARRY_PREFIX="$BUILD/carry/usr"; GPU_CARRY_SYSDEV="$BUILD/carry/sysdev"; echo "+ source $CARRY/env.sh $BUILD/carry"; }
if [ "$REHEARSAL" = 1 ]; then
  note "wheels: not installed (rehearsal)"
elif ! run_logged "$LOGS/pip.log" "$PY" -m pip install --no-index --no-deps --no-compile --upgrade \
     --target "$SITE" "$CARRY"/wheels/*.whl; then
  problems+=("wheels did not install"); finish
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
echo "+ export PYTHONPATH=$SITE"

# Configure and build: the system compiler, whose libstdc++.so.6 is the one
# PyTorch, the CUDA libraries and libsentencepiece load (the image's CXX is
# a wrapper that links libstdc++ statically, so a second copy would run
# beside the shared one); GPU_CHECK_CXX and GPU_CHECK_CC override.
CXX_BIN="${GPU_CHECK_CXX:-$(command -v /usr/bin/g++ || command -v g++)}"
CC_BIN="${GPU_CHECK_CC:-$(command -v /usr/bin/gcc || command -v gcc)}"
TORCH_DIR="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')/Torch"
if [ "$DRY" = 1 ]; then dev_args=("(zlib/OpenSSL: the machine's, else -DZLIB_*/-DOPENSSL_* to $GPU_CARRY_SYSDEV)")
else read -r -a dev_args <<< "$(system_dev_args "$BUILD/sysdev")"; fi
t0=$SECONDS
if [ "$REHEARSAL" = 1 ]; then
  note "build: $BUILD taken as it is (rehearsal)"
elif run_logged "$LOGS/configure.log" cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_CXX_COMPILER="$CXX_BIN" -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_CUDA_HOST_COMPILER="$CXX_BIN" \
     -DSNAPSERVE_BUILD_SERVER=ON -DSNAPSERVE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
     -DSNAPSERVE_FUZZ_TESTS=OFF -DSNAPSERVE_OTLP_EXPORT=OFF \
     -DTorch_DIR="$TORCH_DIR" -DCMAKE_PREFIX_PATH="$GPU_CARRY_PREFIX" "${dev_args[@]}" &&
   run_logged "$LOGS/build.log" cmake --build "$BUILD" -j "$JOBS"; then
  detail "build: ok ($((SECONDS - t0)) s)"
else
  detail "build: FAILED ($((SECONDS - t0)) s); last lines:"
  tail -25 "$LOGS/configure.log" "$LOGS/build.log" 2>/dev/null | tee -a "$LOGS/details.txt"
  problems+=("build failed"); finish
fi

# That image's libtorch.so exports its own copy of std::filesystem, and
# executables that list libtorch ahead of libstdc++ bound to it and crashed
# in std::filesystem::remove_all. Preloading libstdc++ puts its symbols
# ahead of every library's, in every process below.
LIBSTDCXX="$("$CXX_BIN" -print-file-name=libstdc++.so.6)"
export LD_PRELOAD="$LIBSTDCXX${LD_PRELOAD:+:$LD_PRELOAD}"
echo "+ export LD_PRELOAD=$LIBSTDCXX"

# ctest.
ctest_exclude="$(printf '%s\n' "${CTEST_LEFT_OUT[@]}" | cut -d'|' -f1 | paste -sd'|')"
for entry in "${CTEST_LEFT_OUT[@]}"; do note "ctest left out: ${entry%%|*} (${entry#*|})"; done
t0=$SECONDS
ctest_only=()
[ -n "${GPU_CHECK_CTEST_REGEX:-}" ] && ctest_only=(-R "$GPU_CHECK_CTEST_REGEX")
run_logged "$LOGS/ctest.log" ctest --test-dir "$BUILD" -j "$JOBS" --output-on-failure \
  --output-junit "$LOGS/ctest.xml" -E "$ctest_exclude" "${ctest_only[@]}"
ctest_rc=$?
if [ "$DRY" = 0 ]; then
  counts="$("$PY" "$ROOT/scripts/gpu_check_junit.py" "$LOGS/ctest.xml")"
  junit_rc=$?
  echo "$counts" > "$LOGS/ctest-summary.txt"
  first="$(echo "$counts" | head -1)"
  passed="$(echo "$first" | sed -n 's/.*passed=\([0-9]*\).*/\1/p')"
  total="$(echo "$first" | sed -n 's/.*total=\([0-9]*\).*/\1/p')"
  status[ctest]="${passed:-0}/${total:-?}"
  detail "ctest: ${status[ctest]} passed, exit $ctest_rc ($((SECONDS - t0)) s)"
  echo "$counts" | grep -v '^passed=' | tee -a "$LOGS/details.txt"
  [ $ctest_rc -eq 0 ] && [ $junit_rc -eq 0 ] || problems+=("ctest failed (exit $ctest_rc)")
  "$PY" "$ROOT/scripts/ctest-skips.py" "$LOGS/ctest.xml" > "$LOGS/ctest-skips.txt" 2>&1 ||
    problems+=("ctest skips not for a CPU feature")
  cat "$LOGS/ctest-skips.txt" >> "$LOGS/details.txt"
else
  echo "+ $PY scripts/gpu_check_junit.py $LOGS/ctest.xml; $PY scripts/ctest-skips.py $LOGS/ctest.xml"
fi

# The end-to-end model: the default model's shapes and tokenizer, random weights.
export SNAPSERVE_BUILD_DIR="$BUILD" SNAPSERVE_MODEL="$E2E_MODEL" HF_HUB_OFFLINE=1
echo "+ export SNAPSERVE_BUILD_DIR=$BUILD SNAPSERVE_MODEL=$E2E_MODEL HF_HUB_OFFLINE=1"
run_logged "$LOGS/model.log" "$PY" "$ROOT/scripts/gpu_check_model.py" write "$CARRY/model" "$E2E_MODEL" ||
  problems+=("the end-to-end model could not be written")

# One pytest process per file, with its own log and JUnit report: a crash in
# one (a segfault ends the interpreter, which then writes no report) neither
# hides the others nor cuts the traceback that names the test. A file may
# run for FILE_LIMIT_S seconds; faulthandler prints every thread's stack of
# a test stuck for 240 s.
FILE_LIMIT_S="${GPU_CHECK_FILE_LIMIT_S:-300}"
# Sets COUNTS to the file's first summary line (passed=... total=...).
pytest_file() {  # label, junit, log, pytest arguments...
  local label="$1" junit="$2" log="$3"; shift 3
  run_logged "$log" timeout -k 10 "$FILE_LIMIT_S" "$PY" -X faulthandler -m pytest -v -rs \
    -p no:cacheprovider -o faulthandler_timeout=240 --junitxml="$junit" "$@"
  local rc=$? report
  COUNTS="passed=0 failed=0 errors=0 skipped=0 total=0"
  [ "$DRY" = 1 ] && return 0
  if ! report="$("$PY" "$ROOT/scripts/gpu_check_junit.py" "$junit")"; then
    detail "$label: CRASHED or hung (pytest exit $rc, no JUnit report); last lines of its log:"
    tail -30 "$log" | tee -a "$LOGS/details.txt"
    problems+=("$label crashed (exit $rc)")
    return 0
  fi
  COUNTS="$(echo "$report" | head -1)"
  detail "$label: $COUNTS (pytest exit $rc)"
  echo "$report" | grep -v '^passed=' | tee -a "$LOGS/details.txt"
  [ $rc -eq 0 ] || problems+=("$label: pytest exit $rc")
}
count_of() { echo "$1" | sed -n "s/.*$2=\([0-9]*\).*/\1/p"; }

# The GPU tests: their list first, as pytest collects them.
gpu_paths=()
for f in "${GPU_TEST_FILES[@]}"; do gpu_paths+=("$TESTS/$f"); done
run_logged "$LOGS/gpu-tests.txt" "$PY" -m pytest --collect-only -q -m gpu -p no:cacheprovider "${gpu_paths[@]}"
collect_rc=$?
gpu_expected=0
if [ "$DRY" = 0 ]; then
  [ $collect_rc -eq 0 ] || problems+=("collecting the GPU tests failed (pytest exit $collect_rc)")
  gpu_expected="$(grep -c '::' "$LOGS/gpu-tests.txt")"
  detail "GPU tests ($gpu_expected):"
  grep '::' "$LOGS/gpu-tests.txt" | sed 's/^/  /' | tee -a "$LOGS/details.txt"
fi
gpu_passed=0
t0=$SECONDS
for f in "${GPU_TEST_FILES[@]}"; do
  pytest_file "$f" "$LOGS/pytest-${f%.py}.xml" "$LOGS/pytest-${f%.py}.log" -m gpu "$TESTS/$f"
  [ "$DRY" = 1 ] && continue
  gpu_passed=$((gpu_passed + $(count_of "$COUNTS" passed)))
  skipped="$(count_of "$COUNTS" skipped)"
  [ "${skipped:-0}" -eq 0 ] || problems+=("$f: $skipped GPU tests skipped")
done
if [ "$DRY" = 0 ]; then
  status[gpu]="$gpu_passed/$gpu_expected"
  [ "$gpu_passed" -eq "$gpu_expected" ] || problems+=("GPU tests: $gpu_passed of $gpu_expected passed")
  detail "GPU tests: ${status[gpu]} ($((SECONDS - t0)) s)"
fi

# The end-to-end suites against the CUDA server.
export SNAPSERVE_TEST_SERVER_ARGS="$E2E_SERVER_ARGS"
echo "+ export SNAPSERVE_TEST_SERVER_ARGS=\"$E2E_SERVER_ARGS\""
for entry in "${E2E_LEFT_OUT[@]}"; do note "e2e left out: ${entry%%|*} (${entry#*|})"; done
for entry in "${E2E_FILES_LEFT_OUT[@]}"; do note "e2e left out: ${entry%%|*} (${entry#*|})"; done
e2e_passed=0; e2e_total=0
t0=$SECONDS
for f in "${E2E_FILES[@]}"; do
  deselect=()
  # --deselect takes node-id prefixes, relative to the repository root.
  while read -r id; do [ -n "$id" ] && deselect+=(--deselect "$TESTS/$id"); done < <(left_out_ids "$f")
  pytest_file "e2e $f" "$LOGS/e2e-${f%.py}.xml" "$LOGS/e2e-${f%.py}.log" "${deselect[@]}" "$TESTS/$f"
  [ "$DRY" = 1 ] && continue
  e2e_passed=$((e2e_passed + $(count_of "$COUNTS" passed)))
  e2e_total=$((e2e_total + $(count_of "$COUNTS" total)))
  [ "$(count_of "$COUNTS" total)" -gt 0 ] || problems+=("e2e $f ran no test")
done
unset SNAPSERVE_TEST_SERVER_ARGS
if [ "$DRY" = 0 ]; then
  status[e2e]="$e2e_passed/$e2e_total"
  [ "$e2e_passed" -eq "$e2e_total" ] || problems+=("e2e on cuda: $e2e_passed of $e2e_total passed")
  detail "e2e on cuda: ${status[e2e]} ($((SECONDS - t0)) s)"
fi

# The forward's speed on the GPU (bench/synthetic_decode.py --device=cuda):
# models of real shapes with random bf16 weights, prefill and batch-1 and
# batch-16 decode steps. GPU_BENCH_PRESETS= (nothing after the =) leaves it
# out; GPU_PROFILE_PRESETS names presets to profile (about 30 s each).
# It starts only while the run is inside GPU_CHECK_BENCH_BEFORE_S (default
# 450 s), so that the whole run stays inside the device tool's 600 s.
presets="${GPU_BENCH_PRESETS-llama-3.2-1b,llama-3.1-8b}"
bench_before="${GPU_CHECK_BENCH_BEFORE_S:-450}"
if [ -n "$presets" ] && [ "$DRY" = 0 ] && [ "$SECONDS" -gt "$bench_before" ]; then
  status[bench]="left out (${SECONDS} s spent, GPU_CHECK_BENCH_BEFORE_S=$bench_before)"
  detail "bench: ${status[bench]}"
elif [ -n "$presets" ]; then
  t0=$SECONDS
  bench_args=(--device cuda --presets "$presets" --formats bf16 --threads "$JOBS" --prefill-tokens 2048
              --prompt-tokens 512 --decode-steps 64 --batch-prompt 512 --batch-steps 32
              --out runs/synthetic_decode_cuda.json)
  [ -n "${GPU_PROFILE_PRESETS:-}" ] && bench_args+=(--profile "$GPU_PROFILE_PRESETS")
  if run_logged "$LOGS/bench-synthetic.log" timeout -k 10 300 "$PY" "$ROOT/bench/synthetic_decode.py" "${bench_args[@]}"; then
    status[bench]="ok"
  else
    status[bench]="FAILED"; problems+=("bench/synthetic_decode.py failed")
  fi
  run cp "$ROOT/bench/results/runs/synthetic_decode_cuda.json" "$OUT/"
  [ "$DRY" = 1 ] || { detail "bench: ${status[bench]} ($((SECONDS - t0)) s)"; tail -6 "$LOGS/bench-synthetic.log" | tee -a "$LOGS/details.txt"; }
else
  status[bench]="left out (GPU_BENCH_PRESETS empty)"
fi

if [ "$DRY" = 1 ]; then
  echo "+ (summary.txt, logs.tar.gz and synthetic_decode_cuda.json into $OUT; the verdict line last)"
  if [ "$bad" = 0 ]; then say "dry run: consistent"; else say "dry run: FAIL"; fi
  exit "$bad"
fi
finish
