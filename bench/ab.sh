#!/bin/sh
# A/B timing of several libkpt builds on the same cases, one bench.py process per build (each
# with SDPA and FlexAttention measured beside it, so run-to-run drift shows), for kernel work:
#
#   bench/ab.sh DIR1 DIR2 ... [-- bench.py options]
#
# Each DIR holds a libkpt.so (a build dir, or a copy of one). The default cases are the headline
# ones: bf16, D = 128, S = 16k, full, causal, sliding window, alibi+causal, softcap+causal.
# Logs and JSON go to $OUT (default ./ab-out); the last lines printed are one table of kpt's
# TFLOP/s per build and case.
set -eu
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/ab-out}
mkdir -p "$OUT"
libs=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do libs="$libs $1"; shift; done
[ "${1:-}" = "--" ] && shift
[ -n "$libs" ] || { echo "usage: bench/ab.sh DIR... [-- bench.py options]" >&2; exit 2; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TORCHINDUCTOR_CACHE_DIR="$scratch/inductor" TRITON_CACHE_DIR="$scratch/triton"
export PYTHONUNBUFFERED=1
n=0
for d in $libs; do
    n=$((n + 1))
    python3 bench/bench.py --lib "$d/libkpt.so" --json "$OUT/ab$n.json" \
        --patterns full,causal,sliding_window,alibi+causal,softcap+causal --seqs 16384 \
        --long-seqs '' --lua '' --dtypes bf16 --dims 128 --reps 20 "$@" \
        >"$OUT/ab$n.log" 2>&1 || { tail -20 "$OUT/ab$n.log"; exit 1; }
done
python3 - "$OUT" $libs <<'PY'
import json, sys
out, libs = sys.argv[1], sys.argv[2:]
runs = [json.load(open(f"{out}/ab{i + 1}.json"))["results"] for i in range(len(libs))]
keys = [(r["pattern"], r["S"], r["dtype"], r["D"]) for r in runs[0] if "kpt_tflops" in r]
print("%-28s" % "case" + "".join("%14s" % l[-14:] for l in libs) + "%10s%10s" % ("flash", "flex"))
for k in keys:
    row = [next((r for r in rs if (r["pattern"], r["S"], r["dtype"], r["D"]) == k), {})
           for rs in runs]
    print("%-28s" % ("%s S=%d %s D=%d" % k)
          + "".join("%14.1f" % r.get("kpt_tflops", float("nan")) for r in row)
          + "%10.1f%10.1f" % (row[-1].get("flash_tflops", float("nan")),
                              row[-1].get("flex_tflops", float("nan"))))
PY
