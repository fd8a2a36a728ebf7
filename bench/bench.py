#!/usr/bin/env python3
"""kpt against PyTorch SDPA (each backend forced) and FlexAttention, in one process, on the same
tensors. Also the PyTorch interop example: kpt runs on torch tensors' device pointers and torch's
current stream through libkpt_bench (bench/kpt_bench.c) loaded with ctypes.

    python3 bench/bench.py --lib build-gpu/bench/libkpt_bench.so [--quick] [--json FILE]

Each case first checks agreement (max relative error of each peer against kpt), then times with
CUDA events after warm-up, the median of many runs, with the L2 cache flushed before every run.
TFLOP/s follow DESIGN.md §8: 4·B·H·Sq·Skv·D times the exact kept fraction of the mask.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

# kpt_dtype values (include/kpt/tensor.h)
KPT_DTYPE = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.int32: 5, torch.bool: 6}


class Kpt:
    """A kpt kernel for one pattern and shape class, callable on torch tensors."""

    def __init__(self, lib, pattern, dtype, dqk, dv):
        self.lib, self.pattern = lib, pattern
        err = ctypes.create_string_buffer(2048)
        t0 = time.perf_counter()
        self.h = lib.kptb_kernel_create(pattern.encode(), int(dtype == torch.bfloat16), dqk, dv,
                                        err, len(err))
        self.wall_ms = (time.perf_counter() - t0) * 1e3
        if not self.h:
            raise RuntimeError(f"kpt: {pattern}: {err.value.decode()}")
        self.compile_ms = lib.kptb_compile_ms(self.h)

    def _args(self, q, k, v, o, aux):
        i64 = ctypes.c_int64
        ptrs = (ctypes.c_uint64 * 5)(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), 0)
        shapes = (i64 * 16)(*[s for t in (q, k, v, o) for s in t.shape])
        strides = (i64 * 16)(*[s for t in (q, k, v, o) for s in t.stride()])
        lse = (i64 * 3)(0, 0, 0)
        names = [n.encode() for n in aux]
        ts = list(aux.values())
        na = len(ts)
        anames = (ctypes.c_char_p * max(na, 1))(*names)
        aptrs = (ctypes.c_uint64 * max(na, 1))(*[t.data_ptr() for t in ts])
        adt = (ctypes.c_int * max(na, 1))(*[KPT_DTYPE[t.dtype] for t in ts])
        ark = (ctypes.c_int * max(na, 1))(*[t.dim() for t in ts])
        ash = (i64 * max(3 * na, 1))(*[x for t in ts for x in (list(t.shape) + [1, 1, 1])[:3]])
        ast = (i64 * max(3 * na, 1))(*[x for t in ts for x in (list(t.stride()) + [0, 0, 0])[:3]])
        return (self.h, ptrs, shapes, strides, lse, ctypes.c_double(0.0), None, None, 0,
                anames, aptrs, adt, ark, ash, ast, na)

    def __call__(self, q, k, v, o, aux={}, blockmap=None):
        err = ctypes.create_string_buffer(2048)
        bm = blockmap.data_ptr() if blockmap is not None else 0
        rc = self.lib.kptb_attention(*self._args(q, k, v, o, aux), ctypes.c_uint64(bm),
                                     ctypes.c_uint64(torch.cuda.current_stream().cuda_stream),
                                     err, len(err))
        if rc:
            raise RuntimeError(f"kpt: {err.value.decode()}")
        return o

    def blockmap(self, q, k, v, o, aux):
        """A block map for these aux tensors (None when the pattern needs none)."""
        err = ctypes.create_string_buffer(2048)
        n = self.lib.kptb_blockmap_size(*self._args(q, k, v, o, aux), err, len(err))
        if n < 0:
            raise RuntimeError(f"kpt: {err.value.decode()}")
        return torch.empty(n, dtype=torch.uint8, device=q.device) if n else None

    def build_blockmap(self, bm, q, k, v, o, aux):
        err = ctypes.create_string_buffer(2048)
        rc = self.lib.kptb_blockmap_build(*self._args(q, k, v, o, aux), ctypes.c_uint64(bm.data_ptr()),
                                          ctypes.c_uint64(torch.cuda.current_stream().cuda_stream),
                                          err, len(err))
        if rc:
            raise RuntimeError(f"kpt: {err.value.decode()}")


def load_lib(path):
    lib = ctypes.CDLL(path)
    lib.kptb_kernel_create.restype = ctypes.c_void_p
    lib.kptb_kernel_create.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                       ctypes.c_char_p, ctypes.c_int]
    lib.kptb_compile_ms.restype = ctypes.c_double
    lib.kptb_compile_ms.argtypes = [ctypes.c_void_p]
    lib.kptb_ptxas_info.restype = ctypes.c_char_p
    lib.kptb_ptxas_info.argtypes = [ctypes.c_void_p]
    lib.kptb_blockmap_size.restype = ctypes.c_longlong
    for f in (lib.kptb_attention, lib.kptb_blockmap_size, lib.kptb_blockmap_build):
        f.argtypes = None
    return lib


# ---- patterns: kpt string, FlexAttention mods, a dense mask/bias for SDPA ----------------------

def alibi_slopes(h):
    # the ALiBi paper's slopes for any head count (same rule as kpt's builtin)
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(h).is_integer():
        return pow2(h)
    c = 2 ** math.floor(math.log2(h))
    return pow2(c) + pow2(2 * c)[0::2][: h - c]


def make_pattern(name, S, H, B, dev):
    """Returns (kpt pattern, aux dict, score_mod, mask_mod, dense mask fn or None)."""
    if name == "full":
        return "full", {}, None, None, None
    if name == "causal":
        return "causal", {}, None, lambda b, h, q, k: q >= k, None
    if name == "sliding_window":
        W = 1024
        return (f"sliding_window({W})", {}, None,
                lambda b, h, q, k: (q >= k) & (q - k < W), None)
    if name == "alibi+causal":
        slopes = torch.tensor(alibi_slopes(H), device=dev, dtype=torch.float32)
        return ("alibi+causal", {}, lambda s, b, h, q, k: s + slopes[h] * (k - q),
                lambda b, h, q, k: q >= k, None)
    if name == "softcap+causal":
        C = 50.0
        return ("softcap(50)+causal", {}, lambda s, b, h, q, k: C * torch.tanh(s / C),
                lambda b, h, q, k: q >= k, None)
    if name == "document":
        g = torch.Generator().manual_seed(S)
        cuts = sorted(torch.randint(1, S, (3,), generator=g).tolist())
        ids = torch.zeros(S, dtype=torch.int32)
        for c in cuts:
            ids[c:] += 1
        ids = ids.to(dev).unsqueeze(0).expand(B, S).contiguous()
        return ("document", {"doc_q": ids, "doc_kv": ids}, None,
                lambda b, h, q, k: ids[b, q] == ids[b, k], None)
    raise ValueError(name)


def dense_mask(mask_mod, B, S, dev):
    """The boolean mask [B, 1, S, S] of a mask_mod (and its kept fraction)."""
    q = torch.arange(S, device=dev).view(1, 1, S, 1)
    k = torch.arange(S, device=dev).view(1, 1, 1, S)
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    m = mask_mod(b, 0, q, k)
    return m.expand(B, 1, S, S)


# ---- timing --------------------------------------------------------------------------------------

_flush = None


def bench(fn, reps):
    """Median ms of fn() over reps runs, L2 flushed (a 512 MB write) before each."""
    global _flush
    if _flush is None:
        _flush = torch.empty(128 * 1024 * 1024, dtype=torch.int32, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        _flush.zero_()
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_case(lib, pattern, S, D, dtype, tokens, H, reps, results, flex_cache):
    dev = "cuda"
    B = max(1, tokens // S)
    torch.manual_seed(S * 7 + D)
    q = torch.randn(B, H, S, D, device=dev, dtype=dtype)
    k = torch.randn(B, H, S, D, device=dev, dtype=dtype)
    v = torch.randn(B, H, S, D, device=dev, dtype=dtype)
    o = torch.empty_like(q)
    kpat, aux, score_mod, mask_mod, _ = make_pattern(pattern, S, H, B, dev)
    kern = Kpt(lib, kpat, dtype, D, D)
    if mask_mod is not None:
        m = dense_mask(mask_mod, B, S, dev)
        kept = m.float().mean().item()
    else:
        m, kept = None, 1.0
    flops = 4.0 * B * H * S * S * D * kept
    row = {"pattern": pattern, "S": S, "B": B, "H": H, "D": D, "dtype": str(dtype).split(".")[-1],
           "kept": kept, "kpt_compile_ms": kern.compile_ms}

    # kpt (block map built inside the call when the pattern needs one), and the block map alone
    kern(q, k, v, o, aux)
    ref = o.clone()
    bm = kern.blockmap(q, k, v, o, aux)
    if bm is not None:
        row["kpt_blockmap_ms"] = bench(lambda: kern.build_blockmap(bm, q, k, v, o, aux), reps)
    row["kpt_ms"] = bench(lambda: kern(q, k, v, o, aux), reps)

    peers = {}
    if pattern in ("full", "causal"):
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def f(be=be):
                with sdpa_kernel([be]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=pattern == "causal")
            peers[name] = f
    elif score_mod is None and m is not None:
        def f():
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        peers["efficient+mask"] = f

    # FlexAttention: compiled once per process; its block mask timed apart
    if "fn" not in flex_cache:
        flex_cache["fn"] = torch.compile(flex_attention, dynamic=False)
    flex = flex_cache["fn"]
    bmask = None
    if mask_mod is not None:
        t0 = time.perf_counter()
        bmask = create_block_mask(mask_mod, B, None, S, S, device=dev)
        torch.cuda.synchronize()
        row["flex_blockmask_first_ms"] = (time.perf_counter() - t0) * 1e3
        row["flex_blockmask_ms"] = bench(lambda: create_block_mask(mask_mod, B, None, S, S, device=dev),
                                         max(3, reps // 4))
    t0 = time.perf_counter()
    flex(q, k, v, score_mod=score_mod, block_mask=bmask)
    torch.cuda.synchronize()
    row["flex_first_call_ms"] = (time.perf_counter() - t0) * 1e3
    peers["flex"] = lambda: flex(q, k, v, score_mod=score_mod, block_mask=bmask)

    for name, f in peers.items():
        try:
            out = f()
            row[f"{name}_err"] = rel_err(ref, out)
            row[f"{name}_ms"] = bench(f, reps)
        except Exception as e:  # a backend that does not apply to this case
            row[f"{name}_error"] = str(e).splitlines()[0][:120]
    for key in list(row):
        if key.endswith("_ms") and not key.startswith(("kpt_compile", "flex_first", "flex_blockmask", "kpt_blockmap")):
            row[key.replace("_ms", "_tflops")] = flops / (row[key] * 1e-3) / 1e12
    kern_info = lib.kptb_ptxas_info(kern.h).decode().strip().replace("\n", " ")
    row["kpt_ptxas"] = " ".join(kern_info.split())
    results.append(row)
    peers_txt = "  ".join(f"{n} {row.get(n + '_tflops', float('nan')):6.1f} (x{row['kpt_tflops'] / row[n + '_tflops']:.2f}, err {row[n + '_err']:.1e})"
                          for n in peers if n + "_tflops" in row)
    print(f"{pattern:16s} S={S:6d} B={B:3d} D={D} {row['dtype']:8s} kept {kept:5.3f}  "
          f"kpt {row['kpt_tflops']:6.1f} TFLOP/s ({row['kpt_ms']:.3f} ms)  {peers_txt}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--patterns", default="full,causal,sliding_window,alibi+causal,softcap+causal,document")
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    lib = load_lib(a.lib)
    # FlexAttention recompiles per shape; keep dynamo from falling back to eager after 8.
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 4096)
    seqs = [int(s) for s in a.seqs.split(",")]
    if a.quick:
        seqs = [seqs[-1]]
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"bf16, D={a.dim}, H={a.heads}, B*S=16k", flush=True)
    results, flex_cache = [], {}
    for p in a.patterns.split(","):
        for S in seqs:
            try:
                run_case(lib, p, S, a.dim, torch.bfloat16, 16384, a.heads, a.reps, results, flex_cache)
            except Exception as e:
                print(f"{p} S={S}: ERROR {e}", flush=True)
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": props.name, "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "results": results}, f, indent=1)
    print("\n| pattern | S | kpt TFLOP/s | flash | cudnn | flex | kpt/flex | kpt/flash |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        def g(n):
            x = r.get(n + "_tflops")
            return f"{x:.0f}" if x else "-"
        ratio = lambda n: f"{r['kpt_tflops'] / r[n + '_tflops']:.2f}" if r.get(n + "_tflops") else "-"
        print(f"| {r['pattern']} | {r['S']} | {r['kpt_tflops']:.0f} | {g('flash')} | {g('cudnn')} | "
              f"{g('flex')} | {ratio('flex')} | {ratio('flash')} |")


if __name__ == "__main__":
    main()
