#!/usr/bin/env bash
# Runs every snapserve benchmark; each writes JSON under bench/results/.
#   bash bench/run.sh [BUILD_DIR]          quick runs (a few minutes each)
#   BENCH_FULL=1 bash bench/run.sh build   complete grids (--full; hours on 2 cores)
# One failing benchmark does not stop the others; the exit status is non-zero
# when any failed. Benchmarks run one after another (one server at a time).
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="$(cd "${1:-$ROOT/build}" && pwd)"
export SNAPSERVE_BUILD_DIR="$BUILD_DIR"
export SNAPSERVE_MODEL="${SNAPSERVE_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || PY="$(command -v python3)"
FULL=()
[ "${BENCH_FULL:-0}" = "1" ] && FULL=(--full)
mkdir -p "$ROOT/bench/results"

failed=()
run() {  # run NAME ARGS... : one guarded benchmark
  local name="$1"; shift
  local script="$ROOT/bench/$name"
  if [ ! -f "$script" ]; then
    echo "== $name: not present, skipped"
    return
  fi
  echo "== $name $* ($(date -u +%H:%M:%S))"
  local t0=$SECONDS
  if (cd "$ROOT" && "$PY" "$script" "$@"); then
    echo "== $name: ok in $((SECONDS - t0)) s"
  else
    echo "== $name: FAILED (rc=$?) after $((SECONDS - t0)) s"
    failed+=("$name")
  fi
}

run engine_throughput.py "${FULL[@]}"
run snapkv_perf.py "${FULL[@]}"
run server_load.py "${FULL[@]}"
run synthetic_decode.py "${FULL[@]}"
# Peer comparisons, when present (they take their own flags; no --full).
run model_vs_hf.py
run snapkv_quality.py

if [ "${#failed[@]}" -gt 0 ]; then
  echo "benchmarks failed: ${failed[*]}"
  exit 1
fi
echo "all benchmarks done; results in bench/results/"
