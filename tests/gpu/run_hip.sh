#!/bin/sh
# The HIP backend on a machine with an AMD Instinct GPU (gfx90a, gfx940, gfx942) and ROCm: builds
# kpt (release, no cmocka needed) unless KPT_GPU_BIN names a build, runs the whole api_check
# matrix (--full, with the example Lua scripts) against the CPU reference on the HIP backend,
# then --bench (full and causal, bf16, D = 128, 16k tokens). Logs go to $OUT (default
# ./gpu-logs).
#
#   tests/gpu/run_hip.sh [api_check options...]
#
# No AMD GPU has run this yet (docs/hip.md). What to look at first when it fails: hipRTC's
# version and the device's arch (printed below), then the first FAIL lines of api_check.log.
set -u
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
BUILD=${KPT_GPU_BUILD:-build-gpu}
if [ -n "${KPT_GPU_BIN:-}" ]; then
    BIN="$KPT_GPU_BIN"
else
    if [ ! -f "$BUILD/build.ninja" ]; then
        meson setup "$BUILD" -Dtests=false --buildtype=release >"$OUT/meson.log" 2>&1 ||
            { cat "$OUT/meson.log"; exit 1; }
    fi
    ninja -C "$BUILD" >"$OUT/ninja.log" 2>&1 || { tail -50 "$OUT/ninja.log"; exit 1; }
    BIN="$BUILD/tests/gpu"
fi
CHECK="$BIN/api_check"
[ -x "$CHECK" ] || { echo "run_hip.sh: no $CHECK" >&2; exit 1; }
if command -v rocminfo >/dev/null 2>&1; then
    rocminfo 2>&1 | grep -E "^ *(Marketing Name|Name): *gfx|Marketing Name" | head -4 |
        tee "$OUT/gpu.txt"
fi

status=0
"$CHECK" --backend hip --full --scripts examples/patterns "$@" >"$OUT/api_check.log" 2>&1
rc=$?
grep -E "^FAIL|api_check:" "$OUT/api_check.log" | head -40
[ $rc = 0 ] || status=1
if [ $rc = 0 ]; then
    "$CHECK" --backend hip --bench >"$OUT/hip_bench.log" 2>&1 || status=1
    cat "$OUT/hip_bench.log"
fi
exit $status
