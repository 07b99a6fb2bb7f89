#!/usr/bin/env bash
# The server built with AddressSanitizer + UndefinedBehaviorSanitizer, under
# the end-to-end tests (README, "Sanitizers"). Too slow for `make test`.
#
#   scripts/sanitize-e2e.sh [pytest args...]
#
# Builds only the server into BUILD_DIR (default build-asan; no CUDA kernels,
# no unit tests), runs the tests that drive a real server process against it,
# and fails if any sanitizer wrote a report, even when every test passed
# (reports go to files: a server's stderr is not always read by its test).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build-asan}"
REPORTS="$BUILD/sanitizer-reports"
# The tests that start `snapserve` (or snapserve-cli) and talk to it over gRPC
# and HTTP; the others drive the C++ code in-process through the torch-ops
# library, which the sanitized build does not make.
E2E_TESTS=(
  test_server_foundation.py test_server_e2e.py test_server_faults.py
  test_metrics_endpoint.py test_auth.py test_tls.py
  test_gguf_bad_files.py::test_corrupt_model_file_fails_the_start
  test_gguf_bad_files.py::test_extra_unknown_tensor_fails_the_start
  test_logprobs.py test_streaming_llm_e2e.py test_prefill_interleaving.py
)

make -C "$ROOT" --no-print-directory configure BUILD_DIR="$BUILD" \
  CMAKE_ARGS="-DSNAPSERVE_SANITIZE=address,undefined -DBUILD_TESTING=OFF -DSNAPSERVE_WITH_CUDA=OFF"
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target snapserve snapserve-cli

rm -rf "$REPORTS"
mkdir -p "$REPORTS"
# log_path: one file per process that reports (<prefix>.<pid>).
# allocator_may_return_null: a failed allocation returns null (then
# std::bad_alloc) as it does without ASan, instead of ASan ending the process;
# test_server_faults.py caps the server's address space to check that a
# prefill that cannot allocate ends its request with INTERNAL.
export ASAN_OPTIONS="log_path=$REPORTS/asan:detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="log_path=$REPORTS/ubsan:print_stacktrace=1"

cd "$ROOT"
status=0
SNAPSERVE_BUILD_DIR="$BUILD" SNAPSERVE_MODEL="${MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}" \
  .venv/bin/python -m pytest -q -rfEs "${E2E_TESTS[@]/#/tests/python/}" "$@" || status=$?

if compgen -G "$REPORTS/*" >/dev/null; then
  echo "sanitizer reports in $REPORTS:" >&2
  for f in "$REPORTS"/*; do echo "== $f" >&2; head -40 "$f" >&2; done
  exit 1
fi
echo "no sanitizer report ($REPORTS is empty)"
exit "$status"
