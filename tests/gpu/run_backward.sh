#!/bin/sh
# The backward matrix on a CUDA GPU: `kptc check --backward --backend cuda` over the built-in
# patterns and compositions, the example Lua scripts, f16/bf16, D 64/128/256, MHA/GQA, odd lengths
# and the BSHD layout. Each run compares dq, dk and dv of the backward kernels (outputs poisoned
# first), and the aux gradients of the scripts' learnable parameters, with the CPU reference's,
# and runs the backward twice: the bits must repeat. Then
# compute-sanitizer memcheck, racecheck and synccheck on a quick subset. Logs go to $OUT.
#
#   here:  meson setup build-gpu -Dtests=false --buildtype=release && ninja -C build-gpu
#   there: KPTC=build-gpu/kptc sh tests/gpu/run_backward.sh [--jobs N] [--no-sanitizer]
#
# The matrix runs in N processes (default 4) on the one GPU, each taking every N-th check
# (`--shard K/N` runs one of them alone): the CPU reference of the long cases sets the time,
# so one process took more than the device's 10 minutes a call on the H200.
set -u
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
KPTC=${KPTC:-build-gpu/kptc}
JOBS=4
SHARD=""
SANITIZE=1
while [ $# -gt 0 ]; do
    case "$1" in
    --jobs) JOBS=$2; shift 2 ;;
    --shard) SHARD=$2; shift 2 ;;
    --no-sanitizer) SANITIZE=0; shift ;;
    *) echo "run_backward.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
if [ -z "$SHARD" ] && [ "$JOBS" -gt 1 ]; then
    # the shards in parallel, then their logs in order and the sanitizer runs once
    pids=""
    k=0
    while [ $k -lt "$JOBS" ]; do
        OUT="$OUT/shard$k" sh "$0" --shard "$k/$JOBS" --no-sanitizer >"$OUT/shard$k.out" 2>&1 &
        pids="$pids $!"
        k=$((k + 1))
    done
    status=0
    for p in $pids; do wait "$p" || status=1; done
    : >"$OUT/backward.log"
    pass=0
    fail=0
    k=0
    while [ $k -lt "$JOBS" ]; do
        cat "$OUT/shard$k/backward.log" >>"$OUT/backward.log"
        grep "^FAIL" "$OUT/shard$k.out"
        set -- $(sed -n 's/^backward matrix: \([0-9]*\) passed, \([0-9]*\) failed.*/\1 \2/p' \
            "$OUT/shard$k.out")
        [ $# = 2 ] || { echo "shard $k/$JOBS did not finish"; status=1; set -- 0 0; }
        pass=$((pass + $1))
        fail=$((fail + $2))
        k=$((k + 1))
    done
    echo "backward matrix: $pass passed, $fail failed ($JOBS shards)"
    grep -m3 "backward on" "$OUT/backward.log"
    [ $fail = 0 ] || status=1
    if [ $SANITIZE = 1 ]; then
        OUT="$OUT/sanitizer" sh "$0" --jobs 1 --shard sanitizer || status=1
    fi
    exit $status
fi
mkdir -p "$OUT"
LOG="$OUT/backward.log"
: >"$LOG"
pass=0
fail=0
index=0
case "$SHARD" in
sanitizer) ONLY=-1; EVERY=1 ;; # no checks: the sanitizer runs alone
*/*) ONLY=${SHARD%/*}; EVERY=${SHARD#*/} ;;
"") ONLY=0; EVERY=1 ;;
*) echo "run_backward.sh: --shard K/N" >&2; exit 2 ;;
esac
check() {
    index=$((index + 1))
    [ $(((index - 1) % EVERY)) = "$ONLY" ] || return 0
    if "$KPTC" check --backward --backend cuda "$@" >>"$LOG" 2>&1; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: $*" | tee -a "$LOG"
    fi
}
PATTERNS="full causal causal_bottom_right sliding_window(100) local(64,32) chunked(128)
prefix_lm(100) document document+causal alibi alibi+causal softcap(30) softcap(30)+causal
causal+softcap(\$c=20) sliding_window(\$w=64)+alibi"
for pat in $PATTERNS; do
    for dt in bf16 f16; do
        check "$pat" --dtype $dt --shape 2,4,2,1000,1000,64
        check "$pat" --dtype $dt --shape 1,4,4,777,1000,128
    done
done
for pat in causal document+causal alibi+causal; do
    check "$pat" --shape 1,2,1,1,17,128
    check "$pat" --shape 1,2,2,17,17,64 --layout bshd
    check "$pat" --shape 1,8,2,4133,4133,128
done
# the default mode's dq summed in kpt_bwd_dkdv (sm_90a) where the runtime would take kpt_bwd_dq
# (runtime/backward_grid.h: at these sizes the grid has fewer CTAs than SMs)
export KPT_CUDA_DQ_SUMS=1
for pat in full causal document+causal 'alibi+softcap(20)' 'sliding_window($w=64)+alibi'; do
    check "$pat" --shape 2,4,2,1000,1000,64
    check "$pat" --shape 1,4,4,777,1000,128 --dtype f16
done
check tests/gpu/learned_params.lua --shape 1,8,2,1000,1000,128
check tests/mask_bits.lua --shape 1,4,2,777,1000,128
unset KPT_CUDA_DQ_SUMS
# the sm_90a kv tile order under a block map (kpt_bwd_kv_tile): 2 x 16 x 33 = 1056 CTAs, the
# rows in the grid's last wave by decreasing work, the others in order
check document --shape 2,16,16,4133,4133,64
for s in examples/patterns/*.lua; do
    check "$s" --shape 2,4,2,300,300,64
done
# head dim 256 (and Dqk != Dv past 128): on sm_90a the warpgroup-MMA kernels with split columns
# (64 x 64 tiles; Dv = 64 keeps the sm_80 kernels), elsewhere and with KPT_CUDA_WGMMA=0 the sm_80
# kernels in two column parts
for pat in causal document+causal 'alibi+softcap(20)' 'sliding_window(100)'; do
    check "$pat" --shape 1,4,2,777,1000,256
done
check causal --shape 2,4,4,300,300,256 --dtype f16
check causal --shape 1,4,2,300,333,256,128
check alibi+causal --shape 1,4,2,300,333,128,256
check full --shape 1,2,1,130,200,256,64
check causal --shape 1,2,2,17,17,256 --layout bshd
check causal --shape 1,8,2,4133,4133,256
check tests/mask_bits.lua --shape 1,4,2,777,1000,256
check causal --shape 1,2,1,1,17,256
check causal_bottom_right --shape 1,2,2,200,64,256
# kpt_bwd_dq's CTAs of two q tiles there (no block map): one q tile, an odd count, BSHD
check full --shape 1,2,2,64,64,256
check causal --shape 1,2,2,129,129,256
check causal --shape 1,2,1,192,500,256 --layout bshd
check document --shape 2,4,2,1000,1000,256
export KPT_CUDA_WGMMA=0
for pat in causal document+causal; do
    check "$pat" --shape 1,4,2,777,1000,256
done
unset KPT_CUDA_WGMMA
# sinks on the dense shape, their gradient (kpt_bwd_dsinks) too, at every kernel family's dims
for shape in 2,4,2,1000,1000,64 1,8,2,777,1000,128 1,4,2,777,1000,256; do
    check 'causal+softcap(30)' --sinks --shape $shape
done
check causal_bottom_right --sinks --shape 1,4,4,300,200,128 --dtype f16
# keep bits (sm_90a): both of the backward's layouts, with 64 map rows whose shares of slots run
# out (tests/mask_bits.lua: the last kv tiles and q tiles evaluate their masks instead)
check tests/mask_bits.lua --shape 4,16,16,1500,1531,64
check tests/mask_bits.lua --shape 1,4,2,777,1000,128 --dtype f16
# aux gradients: a per-head parameter (summed in the CTA's table), one the derivative scales by s,
# reads out of range; f16/bf16, D 64/128, GQA, long
P=tests/gpu/learned_params.lua
check $P --shape 2,4,2,300,300,64
check $P --shape 1,8,2,1000,1000,128 --dtype f16
check $P --shape 1,4,4,777,1000,64 --layout bshd
check $P --shape 1,4,1,4133,4133,128
check $P --shape 1,4,2,300,300,256
status=0
if [ "$SHARD" != sanitizer ]; then
    echo "backward matrix: $pass passed, $fail failed" | tee -a "$LOG"
    grep -m3 "backward on" "$LOG"
    [ $fail = 0 ] || status=1
fi
if [ $SANITIZE = 0 ]; then
    exit $status
fi
if command -v compute-sanitizer >/dev/null 2>&1; then
    for tool in memcheck racecheck synccheck; do
        for pat in document+causal 'alibi+softcap(20)' tests/gpu/learned_params.lua \
            tests/mask_bits.lua; do
            compute-sanitizer --tool $tool --error-exitcode 3 "$KPTC" check --backward \
                --backend cuda "$pat" --shape 1,2,1,130,200,64 >"$OUT/san_$tool.log" 2>&1 ||
                { status=1; echo "compute-sanitizer $tool: FAILED on $pat"; tail -20 "$OUT/san_$tool.log"; }
        done
        # head dim 128 with a tanh a score: both kernels' consumers take turns (named barriers)
        compute-sanitizer --tool $tool --error-exitcode 3 "$KPTC" check --backward \
            --backend cuda 'softcap(30)+causal' --shape 1,2,1,130,200,128 >"$OUT/san_$tool.log" 2>&1 ||
            { status=1; echo "compute-sanitizer $tool: FAILED on softcap (D 128)"; tail -20 "$OUT/san_$tool.log"; }
        for pat in document+causal tests/gpu/learned_params.lua causal; do # split columns
            compute-sanitizer --tool $tool --error-exitcode 3 "$KPTC" check --backward \
                --backend cuda "$pat" --shape 1,2,1,193,200,256 >"$OUT/san_$tool.log" 2>&1 ||
                { status=1; echo "compute-sanitizer $tool: FAILED on $pat (D 256)"; tail -20 "$OUT/san_$tool.log"; }
        done
        tail -1 "$OUT/san_$tool.log"
    done
fi
exit $status
