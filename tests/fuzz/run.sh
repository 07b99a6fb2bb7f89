#!/usr/bin/env bash
# Builds and runs the libFuzzer harnesses (README.md, "Fuzzing").
#   run.sh probe                         exit 0 when clang++ can build a libFuzzer binary
#   run.sh build  BUILD_DIR [OPT]        configure (clang++) and build every harness (OPT: -O1)
#   run.sh check  BUILD_DIR TARGET       the corpus, then a bounded 10 s run (ctest)
#   run.sh fuzz   BUILD_DIR TARGET SECS  a longer run; new inputs kept in BUILD_DIR/corpus
# A crash, sanitizer report, leak, timeout or out-of-memory fails the run and
# leaves the input in BUILD_DIR/artifacts/TARGET/; commit it to
# tests/fuzz/corpus/TARGET/ as crash-<what> once the parser is fixed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CXX_FUZZ="${SNAPSERVE_FUZZ_CXX:-clang++}"
mode="${1:-}"

case "$mode" in
  probe)
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$tmp/p.cc"
    "$CXX_FUZZ" -fsanitize=fuzzer,address,undefined "$tmp/p.cc" -o "$tmp/p" >/dev/null 2>&1
    ;;
  build)
    build="$2"
    opt="${3:--O1}"
    if [ ! -f "$build/build.ninja" ]; then
      CXX="$CXX_FUZZ" cmake -S "$HERE" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=None \
        -DSNAPSERVE_FUZZ_OPT="$opt" >/dev/null
    fi
    cmake --build "$build" -j "${JOBS:-$(nproc)}"
    ;;
  check | fuzz)
    build="$2"
    target="$3"
    seconds="${4:-10}"
    binary="$build/${target}_fuzzer"
    [ -x "$binary" ] || { echo "no $binary: run '$0 build $build' first" >&2; exit 2; }
    artifacts="$build/artifacts/$target"
    mkdir -p "$artifacts"
    if [ "$mode" = check ]; then
      # New inputs go to a scratch folder, never into the committed corpus.
      work="$(mktemp -d)"
      trap 'rm -rf "$work"' EXIT
      seconds=10
    else
      work="$build/corpus/$target"
      mkdir -p "$work"
    fi
    args=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
          -artifact_prefix="$artifacts/")
    [ -f "$HERE/dict/$target.dict" ] && args+=(-dict="$HERE/dict/$target.dict")
    # The first folder receives new inputs; the committed corpus is read only.
    "$binary" "${args[@]}" "$work" "$HERE/corpus/$target"
    ;;
  *)
    sed -n '2,9p' "$0" >&2
    exit 2
    ;;
esac
