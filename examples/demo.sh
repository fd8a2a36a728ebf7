#!/bin/sh
# The README's demo: the mask-drawing demo, the embedding example (runtime API), then kptc.
set -eu
build=${1:-build}
python=${2:-}
run() { printf '\n$ %s\n' "$*"; "$@"; }
run "$build/examples/kpt-demo"
run "$build/examples/kpt-embedding"   # the runtime API: best backend here, checked against the reference
run "$build/kptc" patterns
run "$build/kptc" emit --emit ir 'sliding_window($w=256)+softcap(30)'
run "$build/kptc" check 'document+causal+softcap(30)' --backend cpu --shape 2,8,2,1024,1024,128
run "$build/kptc" check examples/patterns/longformer.lua --shape 1,4,2,512,512,64 --param window=32
# serving: a ragged batch (decode, speculative and chunked prefill) over a paged KV cache, with sinks
run "$build/kptc" check 'sliding_window(256)+softcap(30)' --page-size 16 --sinks --shape 1,32,8,1,1,128
if [ -n "$python" ]; then
    run "$python" examples/python/numpy_example.py   # the Python package, installed by pip
fi
