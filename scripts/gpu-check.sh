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
# The system compiler, whose libstdc++.so.6 is the one PyTorch, the CUDA
# libraries and libsentencepiece load. The H200 machine's image sets CXX,
# CC and CUDAHOSTCXX to /opt/gcc/bin/g++, a wrapper that links libstdc++
# statically (the executables held their own std::locale code), so a second
# copy of libstdc++ ran beside the shared one. CXX is therefore not read
# here; GPU_CHECK_CXX and GPU_CHECK_CC override.
CXX="${GPU_CHECK_CXX:-$(command -v /usr/bin/g++ || command -v g++)}"
CC="${GPU_CHECK_CC:-$(command -v /usr/bin/gcc || command -v gcc)}"
echo "[gpu-check] compilers: $CXX ($("$CXX" -dumpfullversion)), libstdc++: $("$CXX" -print-file-name=libstdc++.so)"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_C_COMPILER="$CC" -DCMAKE_CUDA_HOST_COMPILER="$CXX" \
  -DSNAPSERVE_BUILD_SERVER=OFF -DSNAPSERVE_WITH_CUDA=ON \
  -DTorch_DIR="$TORCH_DIR" -DCMAKE_PREFIX_PATH="$CARRY" \
  -DSNAPSERVE_GTEST_SOURCE="$CARRY/googletest" 2>&1 | tail -5
cmake --build "$BUILD" -j "$(nproc)" 2>&1 | tail -5
# That image's libtorch.so exports its own copy of std::filesystem, and the
# executables (libtorch ahead of libstdc++ among their needed libraries)
# bound to it and crashed in std::filesystem::remove_all, whichever compiler
# built them. Preloading libstdc++ puts its symbols ahead of every library's,
# in every process below (docs/testing-and-measuring.md, "GPU checks").
export LD_PRELOAD="$("$CXX" -print-file-name=libstdc++.so.6)${LD_PRELOAD:+:$LD_PRELOAD}"
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
# The forward's speed on the GPU, models of real shapes with random bf16
# weights (bench/synthetic_decode.py --device=cuda): prefill, batch-1 and
# batch-16 decode steps; for the presets in GPU_PROFILE_PRESETS (default the
# 1B), the kernels of short decode runs and their time per step against the
# measured step (--profile, in bench-synthetic.log; about 30 s per preset).
# GPU_BENCH_PRESETS= (empty) skips it. Profiled runs are 10 steps and the
# 1B only: profiling both presets over 64-step runs takes longer than a cold
# machine's 570 s limit leaves.
presets="${GPU_BENCH_PRESETS-llama-3.2-1b,llama-3.1-8b}"
if [ -n "$presets" ]; then
  SNAPSERVE_BUILD_DIR="$BUILD" "$PY" bench/synthetic_decode.py --device cuda \
    --presets "$presets" --formats bf16 --threads "$(nproc)" --prefill-tokens 2048 \
    --prompt-tokens 512 --decode-steps 64 --batch-prompt 512 --batch-steps 32 \
    --profile "${GPU_PROFILE_PRESETS-llama-3.2-1b}" \
    --out synthetic_decode_cuda.json > "$OUT/bench-synthetic.log" 2>&1 || true
  cp bench/results/synthetic_decode_cuda.json "$OUT/" 2>/dev/null || true
  tail -6 "$OUT/bench-synthetic.log"
fi
# The wall time goes into machine.json: the device tool brings back at most
# eight files, and the seven above plus the caller's own log fill them.
"$PY" - "$OUT/machine.json" "$(( $(date +%s) - start ))" <<'PYEOF'
import json, sys
path, wall = sys.argv[1], int(sys.argv[2])
info = json.load(open(path))
info["wall_s"] = wall
json.dump(info, open(path, "w"))
PYEOF
