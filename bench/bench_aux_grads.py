#!/usr/bin/env python3
"""Training with learnable aux tensors: forward + backward of examples/patterns/graphormer_edges.lua
(Graphormer's edge encoding: edge [B, N, N, 4] features dotted with per-head weights w [H, 4], both
learnable), through the kpt package's torch op, beside FlexAttention with the same score_mod on
captured tensors that require grad.

    python3 bench/bench_aux_grads.py --lib build-gpu/libkpt.so [--seqs 1024,4096] [--sustain 10]

Gradients are compared first (dq, dk, dv, dedge, dw against FlexAttention's: max |a - b| / max
|b|). Times are milliseconds of one forward and backward: burst (the median of --reps runs, L2
flushed before each) and sustained (the mean of --sustain runs back to back); "kpt no aux grad"
is the same call with edge and w frozen, to show what the aux gradients cost.
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (Timer, setup_peers, max_rel)
from bench import kpt  # noqa: E402

SCRIPT = os.path.join(HERE, "..", "examples", "patterns", "graphormer_edges.lua")


def tensors(B, H, N, D):
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = [torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
           for _ in range(3)]
    edge = torch.rand(B, N, N, 4, device="cuda", generator=g) * 2 - 1
    w = torch.randn(H, 4, device="cuda", generator=g)
    return qkv, edge, w


def run(args, timer, flex, N):
    B, H, D = 1, 16, 128
    (q, k, v), edge, w = tensors(B, H, N, D)
    leaves = [t.requires_grad_() for t in (q, k, v, edge, w)]
    do = torch.randn_like(q)

    def kpt_step(aux_grad=True):
        def step():
            e, ww = (edge, w) if aux_grad else (edge.detach(), w.detach())
            o = kpt.attention(q, k, v, SCRIPT, aux={"edge": e, "w": ww})
            o.backward(do)
        return step

    def score_mod(s, b, h, qi, ki):
        bias = (edge[b, qi, ki, 0] * w[h, 0] + edge[b, qi, ki, 1] * w[h, 1] +
                edge[b, qi, ki, 2] * w[h, 2] + edge[b, qi, ki, 3] * w[h, 3])
        return s + bias * 0.25

    def flex_step():
        flex(q, k, v, score_mod=score_mod).backward(do)

    grads = {}
    steps = {"kpt": kpt_step(), "kpt no aux grad": kpt_step(False), "flex": flex_step}
    for name in ("kpt", "flex"):
        for t in leaves:
            t.grad = None
        try:
            steps[name]()
        except Exception as e:  # a peer that cannot run the case is reported, not fatal
            print(f"# {name}: {type(e).__name__}: {str(e)[:200]}")
            steps.pop(name)
            continue
        grads[name] = [t.grad.float().clone() for t in leaves]
    row = {"N": N, "err": float("nan")}
    if len(grads) == 2:
        row["err"] = max(bench.max_rel(a, b) for a, b in zip(grads["kpt"], grads["flex"]))
    for name, fn in steps.items():
        row[name] = (timer(fn), timer.sustained(fn, args.sustain))
    for t in leaves:
        t.grad = None
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=os.environ.get("KPT_LIB"))
    ap.add_argument("--seqs", default="1024,4096")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--sustain", type=int, default=10)
    args = ap.parse_args()
    flex = bench.setup_peers(args.lib)
    timer = bench.Timer(args.reps, 2)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, B 1, H 16, D 128")
    print("| N | kpt | kpt no aux grad | FlexAttention | kpt/Flex | max rel. diff. |")
    print("|---|---|---|---|---|---|")
    for N in (int(s) for s in args.seqs.split(",")):
        r = run(args, timer, flex, N)
        cells = " | ".join(f"{r[n][0]:.2f} / {r[n][1]:.2f}" if n in r else "-" for n in
                           ("kpt", "kpt no aux grad", "flex"))
        ratio = f"{r['flex'][0] / r['kpt'][0]:.2f}" if "flex" in r and "kpt" in r else "-"
        print(f"| {N} | {cells} | {ratio} | {r['err']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
