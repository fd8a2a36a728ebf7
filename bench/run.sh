#!/bin/sh
# Builds kpt on a GPU machine (or reuses $KPT_GPU_BUILD) and runs the comparison against PyTorch
# SDPA and FlexAttention; results to $OUT (default ./bench-out): bench.log and bench.json.
#
#   bench/run.sh [bench.py options...]
set -u
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
BUILD=${KPT_GPU_BUILD:-build-gpu}
if [ ! -f "$BUILD/build.ninja" ]; then
    meson setup "$BUILD" -Dtests=false --buildtype=release >"$OUT/meson.log" 2>&1 ||
        { cat "$OUT/meson.log"; exit 1; }
fi
ninja -C "$BUILD" >"$OUT/ninja.log" 2>&1 || { tail -50 "$OUT/ninja.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONUNBUFFERED=1 python3 bench/bench.py --lib "$BUILD/bench/libkpt_bench.so" \
    --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
