#!/usr/bin/env bash
# GPU checks on the lent GPU machine (docs/testing-and-measuring.md, "GPU
# checks"): builds kernels + engine + their tests with
# SNAPSERVE_BUILD_SERVER=OFF against that machine's own PyTorch, runs the GPU
# tests (CUDA path vs CPU path) and writes results to the folder named by $1.
# That machine has no network, no gRPC, no GoogleTest and no nlohmann-json, so
# run `scripts/gpu-check.sh --prepare` here first: it copies Debian's
# header-only nlohmann-json and GoogleTest sources into .deps/gpu-carry (an
# ignored folder the device tool can carry).
#
#   scripts/gpu-check.sh --prepare          # on a dev machine
#   scripts/gpu-check.sh OUT_DIR            # on the GPU machine; < 8 minutes
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/.deps/gpu-carry"

if [ "${1:-}" = "--prepare" ]; then
  mkdir -p "$CARRY/include" "$CARRY/share/cmake"
  cp -r /usr/include/nlohmann "$CARRY/include/"
  cp -r /usr/share/cmake/nlohmann_json "$CARRY/share/cmake/"
  cp -r /usr/src/googletest "$CARRY/googletest"
  echo "[gpu-check] carry prepared in $CARRY ($(du -sh "$CARRY" | cut -f1))"
  exit 0
fi

OUT="${1:?usage: scripts/gpu-check.sh OUT_DIR (or --prepare)}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
[ -d "$CARRY" ] || { echo "[gpu-check] $CARRY missing: run scripts/gpu-check.sh --prepare and carry .deps/gpu-carry"; exit 2; }
"$PY" - <<'PYEOF' > "$OUT/machine.json"
import json, platform, os, torch
print(json.dumps({"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                  "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))
PYEOF
TORCH_DIR="$("$PY" -c 'import torch;print(torch.utils.cmake_prefix_path)')/Torch"
BUILD="$ROOT/build-gpu"
start=$(date +%s)
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSNAPSERVE_BUILD_SERVER=OFF -DSNAPSERVE_WITH_CUDA=ON \
  -DTorch_DIR="$TORCH_DIR" -DCMAKE_PREFIX_PATH="$CARRY" \
  -DSNAPSERVE_GTEST_SOURCE="$CARRY/googletest" 2>&1 | tail -5
cmake --build "$BUILD" -j "$(nproc)" 2>&1 | tail -5
# On the 2026-12-04 H200 image, PyTorch's libtorch.so exports its own
# std::filesystem symbols and the test binaries found them before
# libstdc++'s (a segfault in std::filesystem::remove_all; see
# docs/testing-and-measuring.md, "First run on a GPU"). Preloading libstdc++
# puts its symbols first in every process below. Not yet verified there.
export LD_PRELOAD="$(g++ -print-file-name=libstdc++.so.6)${LD_PRELOAD:+:$LD_PRELOAD}"
(cd "$BUILD" && ctest -j "$(nproc)" --output-on-failure --output-junit "$BUILD/ctest.xml") > "$OUT/ctest.log" 2>&1 || true
tail -15 "$OUT/ctest.log"
# One pytest run per file, each with its whole log: a crash in one (a
# segfault ends the interpreter) neither hides the others nor cuts the
# traceback that names the test.
for f in test_snapkv_reference test_paged_attention test_model_cuda; do
  SNAPSERVE_BUILD_DIR="$BUILD" "$PY" -X faulthandler -m pytest -m gpu -v -rs \
    "tests/python/$f.py" > "$OUT/pytest-$f.log" 2>&1 || true
  tail -8 "$OUT/pytest-$f.log"
done
echo "{\"wall_s\": $(( $(date +%s) - start ))}" > "$OUT/timing.json"
