#!/usr/bin/env python3
"""The backward pass: kpt against SDPA (FLASH, cuDNN) and FlexAttention, in one process, on the
same tensors. kpt runs its forward (with LSE) and backward kernels through the public C API
(the kpt package's C layer, python/kpt/_capi.py); the peers through torch.autograd.

    python3 bench/bench_backward.py --lib build-gpu/libkpt.so --json bwd.json [options]

For every case the gradients are compared first: kpt's dq, dk, dv (poisoned with NaN before)
against each peer's (max |a - b| / max |b|). Then, per implementation:
  bwd        the backward alone (for peers: autograd.grad on a retained graph);
  fwd+bwd    the forward, then the backward;
each timed two ways: burst, the median of --reps single runs with the L2 cache flushed before
each; sustained, the mean of --sustain runs back to back (the card then sits at its power
limit). Implementations take turns over --rounds rounds (bursts first); figures are medians.
TFLOP/s: the forward's FLOPs are 4·B·Hq·S·S·D times the fraction of pairs kept, the backward's
2.5 times that (FlashAttention's convention), fwd+bwd 3.5 times.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (Timer (burst and sustained), max_rel, sdpa_peers, meta, setup_peers)
import cases  # noqa: E402
from bench import kpt  # noqa: E402

CASES = ["full", "causal", "gqa_causal", "sliding_window", "alibi+causal", "softcap+causal",
         "prefix_lm", "document"]


def run_case(args, ctx, timer, flex, name, S, D, dtype):
    H = 2048 // D
    B = max(1, args.tokens // S)
    case = cases.make_case(name, B, S, H)
    hq, hkv = case.hq, case.hkv
    torch.manual_seed(S + D)
    mk = lambda h: torch.randn(B, h, S, D, device="cuda", dtype=dtype)
    q, k, v, dout = mk(hq), mk(hkv), mk(hkv), mk(hq)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, hq, S), float("nan"), device="cuda", dtype=torch.float32)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    kept = cases.kept_fraction(case, B, S)
    fwd_flops = 4.0 * B * hq * S * S * D * kept
    row = {"pattern": name, "kpt": case.kpt, "S": S, "B": B, "Hq": hq, "Hkv": hkv, "D": D,
           "dtype": args.dtype, "kept": kept, "fwd_flops": fwd_flops}

    pat = case.pattern(kpt)
    t0 = time.perf_counter()
    fk = ctx.kernel(pat, args.dtype, D)
    bk = ctx.kernel(pat, args.dtype, D, backward=True)
    row["compile_ms"] = (time.perf_counter() - t0) * 1e3
    stream = torch.cuda.current_stream().cuda_stream
    sc, aux = case.scalars, case.aux
    fmap = fk.blockmap(q, k, v, o, scalars=sc, aux=aux, stream=stream) if fk.needs_blockmap else None
    bmap = bk.blockmap(q, k, v, o, scalars=sc, aux=aux, stream=stream) if bk.needs_blockmap else None
    ws = torch.empty(bk.workspace_bytes(q, k, v, o, lse, dout, dq, dk, dv, scalars=sc, aux=aux),
                     dtype=torch.uint8, device="cuda")

    def kpt_fwd():
        fk(q, k, v, o, lse=lse, scalars=sc, aux=aux, blockmap=fmap, stream=stream)

    def kpt_bwd(det=False):
        bk.backward(q, k, v, o, lse, dout, dq, dk, dv, scalars=sc, aux=aux, blockmap=bmap,
                    workspace=ws, stream=stream, deterministic=det)

    def kpt_both():
        kpt_fwd()
        kpt_bwd()
    kpt_both()
    torch.cuda.synchronize()
    row["kpt_nan"] = any(bool(torch.isnan(t).any()) for t in (dq, dk, dv))
    ours = [t.clone() for t in (dq, dk, dv)]

    # peers: autograd through SDPA's backends and FlexAttention
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    wanted = args.peers.split(",") if args.peers else []
    peers = bench.sdpa_peers(case, qg, kg, vg, S, hq, dtype) if not args.no_sdpa else {}
    peers = {n: f for n, f in peers.items() if n in ("flash", "cudnn") and n in wanted}
    bmask = None
    if case.mask_mod is not None and "flex" in wanted:
        bmask = create_block_mask(case.mask_mod, B if case.mask_uses_batch else None, None, S, S,
                                  device="cuda")
    if "flex" in wanted:
        peers["flex"] = lambda: flex(qg, kg, vg, score_mod=case.score_mod, block_mask=bmask,
                                     enable_gqa=hq != hkv)
    impls = {"kpt": (kpt_bwd, kpt_both)}
    if "kpt_det" in wanted:  # kpt's deterministic mode, as if a peer
        for t in (dq, dk, dv):
            t.fill_(float("nan"))
        kpt_fwd()
        kpt_bwd(True)
        torch.cuda.synchronize()
        row["kpt_det_err"] = max(bench.max_rel(a, b) for a, b in zip((dq, dk, dv), ours))
        impls["kpt_det"] = (lambda: kpt_bwd(True), lambda: (kpt_fwd(), kpt_bwd(True)))
    for pname, fwd in peers.items():
        try:
            out = fwd()
            grads = torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)
            row[pname + "_err"] = max(bench.max_rel(a, b) for a, b in zip(ours, grads))
            impls[pname] = (
                lambda out=out: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True),
                lambda fwd=fwd: torch.autograd.grad(fwd(), (qg, kg, vg), dout))
        except Exception as e:  # a backend that refuses this case says why
            row[pname + "_error"] = str(e).strip().splitlines()[0][:160]
    row["peers"] = [p for p in impls if p != "kpt"]
    # Every implementation takes its turn (bench.Timer.in_turns): the card's clocks drift by up
    # to 10 % over a case (H100), and timing one implementation after the other gave the later
    # ones a hotter card. Each figure is the median over the rounds.
    mults = {"bwd": 2.5, "fwdbwd": 3.5}
    fns = {(i, what): fn for i, (bwd, both) in impls.items()
           for what, fn in (("bwd", bwd), ("fwdbwd", both))}
    for (iname, what), (burst, sus) in timer.in_turns(fns, args.rounds, args.sustain).items():
        burst, sus, mult = statistics.median(burst), statistics.median(sus), mults[what]
        row[f"{iname}_{what}_ms"] = burst
        row[f"{iname}_{what}_sus_ms"] = sus
        row[f"{iname}_{what}_tflops"] = mult * fwd_flops / (burst * 1e-3) / 1e12
        row[f"{iname}_{what}_sus_tflops"] = mult * fwd_flops / (sus * 1e-3) / 1e12
    bad = [p for p in row["peers"] if row.get(p + "_err", 0) > bench.AGREE[args.dtype]]
    row["agree"] = not bad and not row["kpt_nan"]
    return row


def print_row(r):
    def part(p):
        if p + "_bwd_tflops" not in r:
            return f"{p} refused"
        s = (f"{p} bwd {r[p + '_bwd_tflops']:.0f}/{r[p + '_bwd_sus_tflops']:.0f} fwd+bwd "
             f"{r[p + '_fwdbwd_tflops']:.0f}/{r[p + '_fwdbwd_sus_tflops']:.0f}")
        if p != "kpt":
            s += (f" (kpt x{r['kpt_bwd_tflops'] / r[p + '_bwd_tflops']:.2f} bwd, "
                  f"x{r['kpt_fwdbwd_tflops'] / r[p + '_fwdbwd_tflops']:.2f} fwd+bwd, "
                  f"err {r[p + '_err']:.1e})")
        return s
    print(f"{r['dtype']} D={r['D']} {r['pattern']:15s} S={r['S']:6d} B={r['B']:2d} kept "
          f"{r['kept']:.3f} | " + " | ".join(part(p) for p in ["kpt"] + r["peers"])
          + ("" if r["agree"] else "  ** DISAGREE **"), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib")
    ap.add_argument("--json")
    ap.add_argument("--patterns", default=",".join(CASES))
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--dims", default="128")
    ap.add_argument("--tokens", type=int, default=16384, help="B = tokens / S")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="turns of every implementation, medians")
    ap.add_argument("--sustain", type=int, default=30)
    ap.add_argument("--no-sdpa", action="store_true")
    ap.add_argument("--peers", default="kpt_det,flash,cudnn,flex",
                    help="peers to run, comma-separated (empty: kpt alone; kpt_det: kpt's "
                         "deterministic mode)")
    ap.add_argument("--time-limit", type=float, default=500)
    args = ap.parse_args()
    t_start = time.time()
    flex = bench.setup_peers(args.lib)
    timer = bench.Timer(args.reps, warmup=2)
    info = bench.meta(args)
    info["what"] = "backward"
    print(f"# {info['device']}, driver {info['driver']}, torch {info['torch']}, cuDNN "
          f"{info['cudnn']}, kpt {info['kpt_commit']}; TFLOP/s burst/sustained", flush=True)
    results, skipped = [], []
    dtype = bench.DTYPES[args.dtype]
    todo = [(p, S, D) for D in bench.ints(args.dims) for p in args.patterns.split(",")
            for S in bench.ints(args.seqs)]
    with kpt.Context(backend="cuda") as ctx:
        for i, (p, S, D) in enumerate(todo):
            if time.time() - t_start > args.time_limit:
                skipped = todo[i:]
                print(f"# time limit reached: {len(skipped)} cases skipped", flush=True)
                break
            try:
                r = run_case(args, ctx, timer, flex, p, S, D, dtype)
                results.append(r)
                print_row(r)
            except Exception as e:
                results.append({"pattern": p, "S": S, "D": D, "error": str(e)[:300]})
                print(f"{p} S={S} D={D}: ERROR {e}", flush=True)
            torch.cuda.empty_cache()
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"meta": info, "results": results, "skipped": skipped}, f, indent=1)
    print(f"# {len(results)} cases in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
