#!/bin/sh
# The benchmark, on a GPU machine with PyTorch: builds libkpt (or reuses $KPT_GPU_BUILD, a build
# made elsewhere), runs bench/bench.py and leaves in $OUT (default ./bench-out) bench.log and
# bench.json; `python3 bench/report.py $OUT/bench.json` then rewrites docs/BENCHMARKS.md.
#
#   bench/run.sh [bench.py options...]       (bench/bench.py --help lists them)
set -eu
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
if [ -n "${KPT_GPU_BUILD:-}" ]; then   # built elsewhere (Lua linked statically): use as it is
    BUILD=$KPT_GPU_BUILD
else
    BUILD=build-gpu
    if [ ! -f "$BUILD/build.ninja" ]; then
        meson setup "$BUILD" -Dtests=false --buildtype=release >"$OUT/meson.log" 2>&1 ||
            { cat "$OUT/meson.log"; exit 1; }
    fi
    ninja -C "$BUILD" >"$OUT/ninja.log" 2>&1 || { tail -50 "$OUT/ninja.log"; exit 1; }
fi
[ -f "$BUILD/libkpt.so" ] || { echo "bench/run.sh: no $BUILD/libkpt.so" >&2; exit 1; }
# FlexAttention's first calls are timed: start Inductor and Triton with empty caches, as kpt's
# cold compiles start with an empty kernel cache
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TORCHINDUCTOR_CACHE_DIR="$scratch/inductor" TRITON_CACHE_DIR="$scratch/triton"
KPT_COMMIT=${KPT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
KPT_BENCH_COMMAND="bench/run.sh $*"
export KPT_COMMIT KPT_BENCH_COMMAND PYTHONUNBUFFERED=1
python3 bench/bench.py --lib "$BUILD/libkpt.so" --json "$OUT/bench.json" "$@" 2>&1 |
    tee "$OUT/bench.log"
