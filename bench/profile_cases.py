#!/usr/bin/env python3
"""Runs a few benchmark cases a handful of times each, for a profiler to capture (Nsight
Compute, compute-sanitizer): kpt's kernel and, where SDPA has it, a peer's beside it
(FLASH_ATTENTION's, or cuDNN's with --peer cudnn); with --backward, kpt's forward and backward
kernels (no peer).

    ncu --clock-control none -k regex:'kpt_attention|flash_fwd' --launch-skip 2 \\
        --launch-count 4 python3 bench/profile_cases.py --lib build-gpu/libkpt.so full causal
    ncu --clock-control none -k kpt_bwd_dkdv --launch-skip 1 --launch-count 1 \\
        python3 bench/profile_cases.py --lib build-gpu/libkpt.so --backward full

Cases are bench/cases.py's (bf16, 16k tokens, H = 2048 / D).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import cases  # noqa: E402
import kpt  # noqa: E402


def backward(ctx, case, fk, fmap, q, k, v, o, stream, reps, det):
    """The forward once (for O and LSE), then the backward reps times."""
    B, H, S, _ = q.shape
    bk = ctx.kernel(case.pattern(kpt), "bf16", q.shape[-1], backward=True)
    sc, aux = case.scalars, case.aux
    lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
    dout = torch.randn_like(q)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    bmap = bk.blockmap(q, k, v, o, scalars=sc, aux=aux, stream=stream) if bk.needs_blockmap else None
    ws = torch.empty(bk.workspace_bytes(q, k, v, o, lse, dout, dq, dk, dv, scalars=sc, aux=aux,
                                        deterministic=det), dtype=torch.uint8, device="cuda")
    fk(q, k, v, o, lse=lse, scalars=sc, aux=aux, blockmap=fmap, stream=stream)
    for _ in range(reps):
        bk.backward(q, k, v, o, lse, dout, dq, dk, dv, scalars=sc, aux=aux, blockmap=bmap,
                    workspace=ws, stream=stream, deterministic=det)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peer", choices=("flash", "cudnn", "none"), default="flash",
                    help="SDPA's backend run beside kpt's forward (default flash)")
    ap.add_argument("--backward", action="store_true", help="kpt's backward (default mode)")
    ap.add_argument("--deterministic", action="store_true", help="the backward's deterministic mode")
    ap.add_argument("patterns", nargs="+")
    args = ap.parse_args()
    kpt.library(args.lib)
    ctx = kpt.Context(backend="cuda")
    S, D = args.seq, args.dim
    peer = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}.get(args.peer)
    B, H = max(1, 16384 // S), 2048 // D
    for name in args.patterns:
        case = cases.make_case(name, B, S, H)
        q = torch.randn(B, case.hq, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, case.hkv, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, case.hkv, S, D, device="cuda", dtype=torch.bfloat16)
        o = torch.empty_like(q)
        ker = ctx.kernel(case.pattern(kpt), "bf16", D)
        stream = torch.cuda.current_stream().cuda_stream
        bm = None
        if ker.needs_blockmap:
            bm = ker.blockmap(q, k, v, o, scalars=case.scalars, aux=case.aux, stream=stream)
        if args.backward:
            backward(ctx, case, ker, bm, q, k, v, o, stream, args.reps, args.deterministic)
            torch.cuda.synchronize()
            print(f"{name}: {args.reps} backward runs of kpt")
            continue
        for _ in range(args.reps):
            ker(q, k, v, o, scalars=case.scalars, aux=case.aux, blockmap=bm, stream=stream)
        ran_peer = peer is not None and case.sdpa in ("plain", "causal")
        if ran_peer:
            with sdpa_kernel([peer]):
                for _ in range(args.reps):
                    F.scaled_dot_product_attention(q, k, v, is_causal=case.sdpa == "causal",
                                                   enable_gqa=case.hq != case.hkv)
        torch.cuda.synchronize()
        print(f"{name}: {args.reps} runs of kpt" + (f" and {args.peer}" if ran_peer else ""))


if __name__ == "__main__":
    main()
