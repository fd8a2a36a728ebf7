#!/usr/bin/env python3
"""Checks the benchmark's torch definitions of every case (bench/cases.py: FlexAttention's
score_mod / mask_mod, SDPA's dense mask and bias, the kept fraction) against kpt itself: kpt's
CPU backend runs the same pattern on the same inputs, and the two outputs must agree. Needs torch
(CPU is enough), not a GPU; run it after changing a case or an example script:

    python3 bench/check_cases.py --lib build/libkpt.so [CASE...]
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import kpt  # noqa: E402
import cases  # noqa: E402


def torch_attention(case, q, k, v):
    """Dense attention in float64 from the case's score_mod and mask_mod (broadcast indices)."""
    B, Hq, S, D = q.shape
    rep = Hq // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) / D ** 0.5
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(Hq).view(1, Hq, 1, 1)
    qi = torch.arange(S).view(1, 1, S, 1)
    ki = torch.arange(S).view(1, 1, 1, S)
    if case.score_mod is not None:
        s = case.score_mod(s, b, h, qi, ki).to(torch.float64)
    if case.mask_mod is not None:
        s = s.masked_fill(~case.mask_mod(b, h, qi, ki).expand_as(s), float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v, case


# Cases whose canvas needs another length than the default 2048 (a power of 4, a square).
LENGTHS = {"lua:natten_morton": 4096, "lua:sliding_tile": 4096, "lua:sliding_tile_3d": 4096}


def check(name, S=None, B=2, H=2, D=16):
    S = S or LENGTHS.get(name, 2048)
    case = cases.make_case(name, B, S, H, dev="cpu")
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, case.hq, S, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, case.hkv, S, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, case.hkv, S, D, generator=g, dtype=torch.float64)
    want, _ = torch_attention(case, q, k, v)
    q32, k32, v32 = q.float(), k.float(), v.float()
    o = torch.full_like(q32, float("nan"))
    with kpt.Context(backend="cpu", flags=kpt.NO_DISK_CACHE) as ctx:
        pat = case.pattern(kpt)
        ctx.kernel(pat, "f32", D)(q32, k32, v32, o, scalars=case.scalars, aux=case.aux)
    err = ((o.double() - want).abs().max() / want.abs().max()).item()
    notes = []
    if case.sdpa == "mask":  # SDPA's materialised mask must say the same
        m = cases.dense_mask(case, S, dev="cpu")
        ref = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, attn_mask=m)
        notes.append(f"sdpa mask {((ref - o).abs().max() / o.abs().max()).item():.1e}")
    if case.sdpa == "bias":
        bias = cases.dense_bias(case, S, case.hq, torch.float32, dev="cpu")
        ref = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, attn_mask=bias)
        notes.append(f"sdpa bias {((ref - o).abs().max() / o.abs().max()).item():.1e}")
    kept = cases.kept_fraction(case, B, S, dev="cpu")
    ok = err < 1e-4 and all(float(n.split()[-1]) < 1e-4 for n in notes)
    print(f"{'ok  ' if ok else 'FAIL'} {name:24s} max rel diff {err:.1e}  kept {kept:.3f}  "
          + "  ".join(notes), flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    kpt.library(a.lib)
    names = a.names or cases.BUILTIN + ["lua:" + n for n in cases.LUA]
    bad = [n for n in names if not check(n)]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
