#!/bin/sh
# The whole GPU check, on a machine with an NVIDIA GPU (sm_80+): builds kpt (release, no cmocka
# needed), runs the full pattern matrix and the example Lua scripts against the CPU reference,
# then compute-sanitizer memcheck and racecheck on a representative subset. Logs go to $OUT
# (default ./gpu-logs).
#
#   tests/gpu/run.sh [--quick-only] [--checks-only | --sanitizers-only] [gpu_check options...]
#
# The whole run takes longer than the device's 10 minutes a call: --checks-only and
# --sanitizers-only split it in two.
# A GPU machine without Lua builds without the Lua front end (the scripts are then skipped);
# KPT_GPU_BIN=DIR uses a gpu_check built elsewhere (with Lua linked statically) and builds nothing:
#   here:  meson setup build-gpu -Dtests=false --buildtype=release && ninja -C build-gpu
#   there: KPT_GPU_BIN=build-gpu/tests/gpu sh tests/gpu/run.sh
set -u
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
BUILD=${KPT_GPU_BUILD:-build-gpu}
QUICK_ONLY=0
PART=all
while [ $# -gt 0 ]; do
    case "$1" in
    --quick-only) QUICK_ONLY=1; shift ;;
    --checks-only) PART=checks; shift ;;
    --sanitizers-only) PART=sanitizers; shift ;;
    *) break ;; # gpu_check's options
    esac
done

if [ -n "${KPT_GPU_BIN:-}" ]; then
    CHECK="$KPT_GPU_BIN/gpu_check"
else
    if [ ! -f "$BUILD/build.ninja" ]; then
        meson setup "$BUILD" -Dtests=false --buildtype=release >"$OUT/meson.log" 2>&1 ||
            { cat "$OUT/meson.log"; exit 1; }
    fi
    ninja -C "$BUILD" >"$OUT/ninja.log" 2>&1 || { tail -50 "$OUT/ninja.log"; exit 1; }
    CHECK="$BUILD/tests/gpu/gpu_check"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

# LOG CMD [ARGS]: CMD --shard K/4 ARGS in four processes, their outputs in LOG in order; fails
# when a shard fails (the long matrices: their CPU references and NVRTC's compiles set the time)
sharded() {
    log=$1
    shift
    pids=""
    for k in 0 1 2 3; do
        "$@" --shard "$k/4" >"$log.$k" 2>&1 &
        pids="$pids $!"
    done
    rc=0
    for p in $pids; do wait "$p" || rc=1; done
    cat "$log.0" "$log.1" "$log.2" "$log.3" >"$log"
    rm -f "$log.0" "$log.1" "$log.2" "$log.3"
    return $rc
}

status=0
KPTC=${KPTC:-"$(dirname "$CHECK")/../../kptc"}
if [ $PART != sanitizers ]; then
    if [ $QUICK_ONLY = 0 ]; then
        sharded "$OUT/gpu_check.log" "$CHECK" --scripts examples/patterns "$@" || status=1
        grep -E "FAIL|^    |passed|skipped|device:|SKIP" "$OUT/gpu_check.log" | head -60
    fi

    # the sm_90a forward's persistent grid with many work items on each CTA (three CTAs): item
    # hand-over, Q and tile-class slots, the ring across items (cuda_device.c, forward_ctas)
    KPT_CUDA_PERSISTENT=3 "$CHECK" --quick --scripts examples/patterns \
        >"$OUT/gpu_check_p3.log" 2>&1 || status=1
    echo "persistent on 3 CTAs: $(tail -1 "$OUT/gpu_check_p3.log")"

    # the tall variant (192-row q tiles) of masked head-dim-64 kernels at every size, which the
    # runtime takes only from 3k queries (runtime/forward_grid.h, kpt_forward_tall_pays)
    KPT_CUDA_TALL=1 "$CHECK" --quick --scripts examples/patterns \
        >"$OUT/gpu_check_tall.log" 2>&1 || status=1
    echo "tall q tiles: $(tail -1 "$OUT/gpu_check_tall.log")"

    # masks of bit operations (tests/bit_masks.lua): the tile classifier's interval and known-bits
    # rules must be sound in the CUDA kernels too (CI runs the same masks on lavapipe); both kernel
    # generations where the device has wgmma
    if [ -x "$KPTC" ]; then
        : >"$OUT/bit_masks.log"
        for i in 1 2 3 4 5 6 7 8; do
            for wgmma in 1 0; do
                KPT_CUDA_WGMMA=$wgmma "$KPTC" check tests/bit_masks.lua --param which=$i \
                    --backend cuda --shape 1,2,1,300,333,64 >>"$OUT/bit_masks.log" 2>&1 ||
                    { status=1; echo "bit_masks.lua which=$i (KPT_CUDA_WGMMA=$wgmma): FAILED"; }
            done
        done
        echo "bit masks: $(grep -c 'cuda       cuda' "$OUT/bit_masks.log") of 16 checks ran"
        # the sm_90a forward's stored keep bits, with 64 map rows whose shares of slots run out at
        # the eleventh q tile (tests/mask_bits.lua): bits and the fallback in one launch
        "$KPTC" check tests/mask_bits.lua --backend cuda --shape 4,16,16,1500,1531,64 \
            >"$OUT/mask_bits.log" 2>&1 || { status=1; echo "mask_bits.lua: FAILED"; }
        tail -1 "$OUT/mask_bits.log"
    fi

    # the runtime API end to end: caches, bundles, block maps, threads
    RTCHECK="$(dirname "$CHECK")/runtime_check"
    "$RTCHECK" >"$OUT/runtime_check.log" 2>&1 || status=1
    cat "$OUT/runtime_check.log" | tail -20
    # the backward through the public API: workspace, block map, CUDA graph capture and replay
    "$(dirname "$CHECK")/backward_check" >"$OUT/backward_check.log" 2>&1 || status=1
    tail -3 "$OUT/backward_check.log"
    # the serving kernels: patterns x page sizes x GQA x ragged lengths x sinks, against the
    # serving reference (docs/serving.md), in four processes
    sharded "$OUT/paged_check.log" "$(dirname "$CHECK")/paged_check" || status=1
    grep -E "FAIL|passed" "$OUT/paged_check.log"
    # and with every split of the 16-row kernel combined in a thread block cluster (sm_90), which
    # the runtime takes for pairs only (runtime/cuda_device.c, cluster_combine)
    export KPT_CUDA_CLUSTER=1
    sharded "$OUT/paged_check_cluster.log" "$(dirname "$CHECK")/paged_check" --quick || status=1
    unset KPT_CUDA_CLUSTER
    grep -E "FAIL|passed" "$OUT/paged_check_cluster.log"
    # the embedding example (a Lua script when Lua is built in, else a pattern string)
    EMBED="$(dirname "$CHECK")/../../examples/kpt-embedding"
    if [ -x "$EMBED" ]; then
        "$EMBED" examples/patterns/longformer.lua window=64 >"$OUT/embed.log" 2>&1 ||
            "$EMBED" 'document+causal' >>"$OUT/embed.log" 2>&1 || status=1
        tail -4 "$OUT/embed.log"
    fi

    # the Python package on torch tensors, where PyTorch is installed: kpt.attention against SDPA,
    # autograd, torch.compile, CUDA graphs, a short training run (tests/gpu/test_torch.py), the
    # CPU-side pytest suite with torch, and the C layer's example
    LIBKPT="$(dirname "$CHECK")/../../libkpt.so"
    if [ -f "$LIBKPT" ] && python3 -c "import torch" >/dev/null 2>&1; then
        KPT_LIB="$LIBKPT" python3 tests/gpu/test_torch.py >"$OUT/test_torch.log" 2>&1 || status=1
        grep -E "^FAIL|passed|FAILED" "$OUT/test_torch.log"
        # tensors past 2^31 elements and a million tokens (tests/gpu/test_large.py; skips
        # itself under 60 GiB), on the sm_90a kernels and again on the mma.sync ones
        for wg in 1 0; do
            KPT_CUDA_WGMMA=$wg KPT_LIB="$LIBKPT" python3 tests/gpu/test_large.py \
                >"$OUT/test_large_wgmma$wg.log" 2>&1
            rc=$?
            [ $rc = 0 ] || [ $rc = 77 ] || status=1
            echo "test_large.py (KPT_CUDA_WGMMA=$wg): $(tail -1 "$OUT/test_large_wgmma$wg.log")"
        done
        if python3 -c "import pytest" >/dev/null 2>&1; then
            KPT_LIB="$LIBKPT" KPT_TORCH_TESTS=1 python3 -m pytest -q -p no:cacheprovider \
                tests/python >"$OUT/pytest.log" 2>&1 || status=1
            tail -1 "$OUT/pytest.log"
        fi
        KPT_LIB="$LIBKPT" python3 examples/python/torch_example.py \
            >"$OUT/torch_example.log" 2>&1 || status=1
        tail -3 "$OUT/torch_example.log"
    fi
fi

if [ $PART = checks ]; then
    : # the sanitizers in a call of their own (--sanitizers-only)
elif command -v compute-sanitizer >/dev/null 2>&1; then
    for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 3 "$CHECK" --quick \
            >"$OUT/sanitizer-$tool.log" 2>&1
        rc=$?
        echo "compute-sanitizer $tool: exit $rc" \
            "($(grep -c pass "$OUT/sanitizer-$tool.log") cases passed)"
        tail -3 "$OUT/sanitizer-$tool.log"
        [ $rc = 0 ] || status=1
        compute-sanitizer --tool $tool --error-exitcode 3 "$(dirname "$CHECK")/paged_check" \
            --quick --filter "page 16" >"$OUT/sanitizer-paged-$tool.log" 2>&1 || status=1
        echo "compute-sanitizer $tool (serving): $(tail -1 "$OUT/sanitizer-paged-$tool.log")"
        KPT_CUDA_CLUSTER=1 compute-sanitizer --tool $tool --error-exitcode 3 \
            "$(dirname "$CHECK")/paged_check" --quick --filter "q0 1 kv0" \
            >"$OUT/sanitizer-cluster-$tool.log" 2>&1 || status=1
        echo "compute-sanitizer $tool (cluster combine):" \
            "$(tail -1 "$OUT/sanitizer-cluster-$tool.log")"
    done
    # synccheck on the sm_90a forward's barriers, many items a CTA (the turns that run on across
    # items, the two slots of live tiles)
    if [ -x "$KPTC" ]; then
        for c in "causal_bottom_right 1,2,2,700,300,128" "document+causal 1,2,2,700,700,128" \
            "full 1,2,2,700,700,128"; do
            set -- $c
            KPT_CUDA_PERSISTENT=3 compute-sanitizer --tool synccheck --error-exitcode 3 \
                "$KPTC" check --backend cuda "$1" --shape "$2" >"$OUT/sanitizer-sync.log" 2>&1 ||
                { status=1; echo "compute-sanitizer synccheck: FAILED on $1"; }
            echo "compute-sanitizer synccheck ($1): $(tail -1 "$OUT/sanitizer-sync.log")"
        done
        # and on the backward's producer/consumer rings (kpt_bwd_dkdv, kpt_bwd_dq)
        for c in "full 1,2,2,300,300,128" "document+causal 1,4,2,333,400,128"; do
            set -- $c
            compute-sanitizer --tool synccheck --error-exitcode 3 "$KPTC" check --backend cuda \
                --backward "$1" --shape "$2" >"$OUT/sanitizer-sync.log" 2>&1 ||
                { status=1; echo "compute-sanitizer synccheck: FAILED on the backward of $1"; }
            echo "compute-sanitizer synccheck (backward, $1): $(tail -1 "$OUT/sanitizer-sync.log")"
        done
    fi
    # the serving kernels (on sm_90a the 64-row kernel's products are a warpgroup's)
    compute-sanitizer --tool synccheck --error-exitcode 3 "$(dirname "$CHECK")/paged_check" \
        --quick --filter "page 16" >"$OUT/sanitizer-paged-sync.log" 2>&1 || status=1
    echo "compute-sanitizer synccheck (serving): $(tail -1 "$OUT/sanitizer-paged-sync.log")"
else
    echo "compute-sanitizer not found: sanitizer runs skipped"
fi
exit $status
