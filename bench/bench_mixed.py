"""Mixed-batch serving benchmark: one launch of kpt's serving kernel over sequences of different
query and key counts (chunked prefill beside decode, ragged decode, speculative decode of ragged
lengths), `causal` in logical positions (bottom-right), beside the peers that take such a batch
in one call: PyTorch's variable-length FlashAttention (torch.nn.attention.varlen.varlen_attn, on
packed contiguous K and V) and FlashInfer's BatchPrefillWithPagedKVCacheWrapper (on kpt's
page-16 cache, where the flashinfer package imports), SDPA called once per sequence (FLASH or,
for lower-right causal masks, memory-efficient attention: what a user of SDPA alone writes) and,
with --flex, FlexAttention over the packed batch with a block mask of the sequences. Checks agreement first (each output against kpt's
contiguous run, whose output was poisoned with NaN); reports time (burst: one call after an L2
flush; sustained: many calls back to back), GB/s of K+V read and TFLOP/s of the pairs the mask
keeps.

    python3 bench/bench_mixed.py --lib build/libkpt.so [--cases NAMES] [--out FILE.json]

`--cpu` checks the script itself without a GPU: kpt's CPU backend against SDPA (math) once per
sequence (and FlexAttention with --flex), lengths divided by 32, nothing timed.
"""
import argparse
import json
import math
import os
import random
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import bench_paged as bp  # noqa: E402  (timing, L2 flush, copy bandwidth, FlashInfer loader)


def log_uniform(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def case_lengths(name, rng):
    """(q_len, kv_len) per sequence; a sequence's queries are the last q_len of its kv_len keys."""
    if name == "prefill2k+decode63":  # a chunked prefill beside a decoding batch (vLLM's mix)
        return [(2048, 4096)] + [(1, 8192)] * 63
    if name == "prefill512x4+decode60":
        return [(512, 2048 * (i + 1)) for i in range(4)] + [(1, 32768)] * 60
    if name == "decode64-ragged":  # one token each, keys log-uniform in 1k..32k
        return [(1, log_uniform(rng, 1024, 32768)) for _ in range(64)]
    if name == "spec-ragged":  # 1 to 16 tokens each over 2k..32k keys
        return [(rng.randint(1, 16), log_uniform(rng, 2048, 32768)) for _ in range(32)]
    if name == "edges":  # lengths 0 and 1 among the rest
        return [(0, 0), (1, 1), (0, 700), (16, 16), (1, 5000), (300, 9000), (1, 64), (7, 32768)]
    raise ValueError(f"unknown case {name}")


CASES = ["prefill2k+decode63", "prefill512x4+decode60", "decode64-ragged", "spec-ragged", "edges"]


class Mixed:
    def __init__(self, capi, kern, lens, hq, hkv, d, page, dtype=torch.bfloat16, dev="cuda"):
        self.lens, self.hq, self.hkv, self.d, self.page = lens, hq, hkv, d, page
        self.B = B = len(lens)
        self.qlens = [q for q, _ in lens]
        self.kvlens = [k for _, k in lens]
        self.cu_q = [0]
        for q in self.qlens:
            self.cu_q.append(self.cu_q[-1] + q)
        self.cu_k = [0]
        for k in self.kvlens:
            self.cu_k.append(self.cu_k[-1] + k)
        T, Tk = self.cu_q[-1], self.cu_k[-1]
        self.max_q, self.max_kv = max(self.qlens), max(max(self.kvlens), 1)
        self.q = torch.randn(max(T, 1), hq, d, dtype=dtype, device=dev)
        # K and V packed, [Tk, Hkv, D]: the varlen peer's layout; the caches are copies
        self.kpk = torch.randn(max(Tk, 1), hkv, d, dtype=dtype, device=dev)
        self.vpk = torch.randn_like(self.kpk)
        # the contiguous cache: row b holds sequence b's keys
        self.kd = torch.zeros(B, self.max_kv, hkv, d, dtype=dtype, device=dev)
        self.vd = torch.zeros_like(self.kd)
        for b in range(B):
            a, z = self.cu_k[b], self.cu_k[b + 1]
            self.kd[b, : z - a] = self.kpk[a:z]
            self.vd[b, : z - a] = self.vpk[a:z]
        # the paged cache: each sequence's pages anywhere in it (a shuffled table)
        npg = [(k + page - 1) // page for k in self.kvlens]
        total = max(sum(npg), 1)
        perm = torch.randperm(total, device=dev).to(torch.int32)
        self.pt = torch.zeros(B, max(max(npg), 1), dtype=torch.int32, device=dev)
        self.kp = torch.zeros(total, page, hkv, d, dtype=dtype, device=dev)
        self.vp = torch.zeros_like(self.kp)
        at = 0
        for b in range(B):
            ids = perm[at: at + npg[b]]
            at += npg[b]
            self.pt[b, : npg[b]] = ids
            if npg[b]:
                pad = npg[b] * page
                kb = torch.zeros(pad, hkv, d, dtype=dtype, device=dev)
                vb = torch.zeros_like(kb)
                kb[: self.kvlens[b]] = self.kd[b, : self.kvlens[b]]
                vb[: self.kvlens[b]] = self.vd[b, : self.kvlens[b]]
                self.kp[ids.long()] = kb.view(npg[b], page, hkv, d)
                self.vp[ids.long()] = vb.view(npg[b], page, hkv, d)
        self.npg = npg
        self.cu_dev = torch.tensor(self.cu_q, dtype=torch.int32, device=dev)
        self.cuk_dev = torch.tensor(self.cu_k, dtype=torch.int32, device=dev)
        self.kvl_dev = torch.tensor(self.kvlens, dtype=torch.int32, device=dev)
        self.o = torch.empty_like(self.q)
        self.kern = kern
        self.plan = kern.paged_plan(hq, hkv, cu_seqlens_q=self.cu_q, kv_lens=self.kvlens)
        self.ws = torch.empty(max(1, self.plan.workspace_bytes), dtype=torch.uint8, device=dev)
        self.on_gpu = dev == "cuda"

    # kpt, one launch (two where the plan splits)
    def kpt(self, paged):
        k, v = (self.kp, self.vp) if paged else (self.kd, self.vd)
        # the current stream at each call: a graph's capture runs on its own
        stream = torch.cuda.current_stream().cuda_stream if self.on_gpu else None
        self.kern.paged(self.plan, self.q, k, v, self.o, self.cu_dev, self.kvl_dev,
                        page_table=self.pt if paged else None, workspace=self.ws,
                        stream=stream)
        return self.o

    def varlen_setup(self):
        """torch's varlen FlashAttention: bottom-right causal is FlashAttention's causal where
        queries are fewer than keys. GQA by enable_gqa where this torch has it, else K and V
        expanded to every query head (more bytes read: noted in the output)."""
        from torch.nn.attention.varlen import varlen_attn
        args = (self.q, self.kpk, self.vpk, self.cu_dev, self.cuk_dev, self.max_q, self.max_kv)
        k2, v2 = self.kpk, self.vpk
        extra = {}
        try:
            varlen_attn(*args, enable_gqa=True, window_size=(-1, 0))
            extra = {"enable_gqa": True, "window_size": (-1, 0)}
        except TypeError:
            g = self.hq // self.hkv
            k2 = self.kpk.repeat_interleave(g, dim=1)
            v2 = self.vpk.repeat_interleave(g, dim=1)
            try:
                varlen_attn(self.q, k2, v2, self.cu_dev, self.cuk_dev, self.max_q, self.max_kv,
                            window_size=(-1, 0))
                extra = {"window_size": (-1, 0)}
            except TypeError:
                extra = {"is_causal": True}
            self.varlen_expanded = True
        qs = self.q
        cuq, cuk, mq, mk = self.cu_dev, self.cuk_dev, self.max_q, self.max_kv
        return lambda: varlen_attn(qs, k2, v2, cuq, cuk, mq, mk, **extra)

    def sdpa_loop_setup(self, backends):
        """SDPA once per sequence (its queries against its keys, lower-right causal)."""
        from torch.nn.attention import sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right
        parts = []
        for b in range(self.B):
            qa, qz = self.cu_q[b], self.cu_q[b + 1]
            if qz == qa:
                continue
            ka, kz = self.cu_k[b], self.cu_k[b + 1]
            q = self.q[qa:qz].transpose(0, 1).unsqueeze(0)
            k = self.kpk[ka:kz].transpose(0, 1).unsqueeze(0)
            v = self.vpk[ka:kz].transpose(0, 1).unsqueeze(0)
            mask = None if qz - qa == 1 else causal_lower_right(qz - qa, kz - ka)
            parts.append((qa, qz, q, k, v, mask))
        out = torch.empty_like(self.q)

        def run():
            with sdpa_kernel(backends):
                for qa, qz, q, k, v, mask in parts:
                    out[qa:qz] = F.scaled_dot_product_attention(
                        q, k, v, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)
            return out
        return run

    def fi_setup(self, fi):
        """FlashInfer's paged prefill wrapper, causal (bottom-right), on the page-16 cache."""
        if not bp.FI_WORKSPACE:
            bp.FI_WORKSPACE.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        dev = "cuda"
        indptr, indices, last = [0], [], []
        for b in range(self.B):
            n = self.npg[b]
            indptr.append(indptr[-1] + n)
            indices += self.pt[b, :n].tolist()
            last.append(self.kvlens[b] - (n - 1) * self.page if n else 0)
        w = fi.BatchPrefillWithPagedKVCacheWrapper(bp.FI_WORKSPACE[0], "NHD", backend="fa2")
        w.plan(self.cu_dev, torch.tensor(indptr, dtype=torch.int32, device=dev),
               torch.tensor(indices or [0], dtype=torch.int32, device=dev),
               torch.tensor(last, dtype=torch.int32, device=dev), self.hq, self.hkv, self.d,
               self.page, causal=True, q_data_type=self.q.dtype, kv_data_type=self.kp.dtype)
        q, kv = self.q, (self.kp, self.vp)
        return lambda: w.run(q, kv)

    def flex_setup(self, flex):
        """FlexAttention over the packed batch: one sequence of Tq queries against Tk keys, a
        query keeping the keys of its own sequence up to its logical position (a block mask
        built once, outside the timings, as kpt's plan is)."""
        from torch.nn.attention.flex_attention import create_block_mask
        dev = self.q.device
        T, Tk = self.cu_q[-1], self.cu_k[-1]
        seq_q = torch.empty(T, dtype=torch.int32, device=dev)
        pos_q = torch.empty(T, dtype=torch.int32, device=dev)
        seq_k = torch.empty(max(Tk, 1), dtype=torch.int32, device=dev)
        pos_k = torch.empty(max(Tk, 1), dtype=torch.int32, device=dev)
        for b in range(self.B):
            qa, qz, ka, kz = self.cu_q[b], self.cu_q[b + 1], self.cu_k[b], self.cu_k[b + 1]
            seq_q[qa:qz] = b
            pos_q[qa:qz] = torch.arange(self.kvlens[b] - (qz - qa), self.kvlens[b], device=dev)
            seq_k[ka:kz] = b
            pos_k[ka:kz] = torch.arange(0, kz - ka, device=dev)

        def mask_mod(b, h, qi, ki):
            return (seq_q[qi] == seq_k[ki]) & (pos_k[ki] <= pos_q[qi])
        bm = create_block_mask(mask_mod, 1, None, T, Tk, device=str(dev))
        q = self.q[:T].transpose(0, 1).unsqueeze(0)
        k = self.kpk[:Tk].transpose(0, 1).unsqueeze(0)
        v = self.vpk[:Tk].transpose(0, 1).unsqueeze(0)
        return lambda: flex(q, k, v, block_mask=bm, enable_gqa=True)[0].transpose(0, 1)

    def kv_bytes(self):
        return 2 * sum(self.kvlens) * self.hkv * self.d * self.q.element_size()

    def flops(self):
        """4 Hq D per kept pair: query i of q_len sees kv_len - q_len + i + 1 keys."""
        pairs = sum(q * (k - q) + q * (q + 1) // 2 for q, k in self.lens)
        return 4 * self.hq * self.d * pairs


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def rel_err(a, b, rows):
    """Relative RMS difference over the rows that belong to sequences (rows past T are none)."""
    a, b = a[:rows].float(), b[:rows].float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of: " + ", ".join(CASES))
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", default="32:8", help="query heads:kv heads")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-loop", action="store_true", help="leave out SDPA once per sequence")
    ap.add_argument("--flex", action="store_true",
                    help="FlexAttention too (torch.compile'd, a compilation per case)")
    ap.add_argument("--cpu", action="store_true",
                    help="a check of the script without a GPU (kpt's CPU backend, SDPA math)")
    ap.add_argument("--graph", action="store_true",
                    help="also time each call in a replayed CUDA graph (sustained, no host)")
    ap.add_argument("--out")
    args = ap.parse_args()
    D = args.dim
    HQ, HKV = (int(x) for x in args.heads.split(":"))
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    capi = bp.load_kpt(args.lib)
    dev = "cpu" if args.cpu else "cuda"
    ctx = capi.Context(dev)
    kern = ctx.kernel(capi.Pattern("causal"), "bf16", D, paged=True)
    bw = 0.0 if args.cpu else bp.copy_bandwidth()
    from torch.nn.attention import SDPBackend
    fi = None if args.cpu else bp.load_flashinfer()
    flex = None
    if args.flex:
        from torch.nn.attention.flex_attention import flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    out = {"device": "cpu" if args.cpu else torch.cuda.get_device_name(), "copy_GBps": bw,
           "dim": D,
           "heads": [HQ, HKV], "page": args.page, "rows": []}
    if fi is not None:
        out["flashinfer"] = fi.__version__
    print(f"device: {out['device']}  copy bandwidth {bw:.0f} GB/s; bf16, D = {D}, "
          f"{HQ}:{HKV}, causal (bottom-right), page {args.page}", flush=True)
    print(f"{'case':>22} | {'name':>10} | {'us burst':>9} {'us sust':>9} | {'GB/s':>6} "
          f"{'TFLOP/s':>7} | {'t/t_kpt':>7} | agreement", flush=True)
    for name in args.cases.split(","):
        lens = case_lengths(name, rng)
        if args.cpu:  # small enough for the reference
            lens = [(min(q, max(k // 32, 1)) if q else 0, k // 32 if k >= 32 else k)
                    for q, k in lens]
        m = Mixed(capi, kern, lens, HQ, HKV, D, args.page, dev=dev)
        T = m.cu_q[-1]
        row = {"case": name, "lengths": lens, "splits": m.plan.splits, "res": {}}
        m.o.fill_(float("nan"))
        ref = m.kpt(False).clone()
        sync()
        row["kpt_nan_rows"] = int(ref[:T].isnan().any(dim=-1).any(dim=-1).sum().item())
        setups = [("kpt", lambda: (lambda: m.kpt(False))),
                  (f"kpt p{args.page}", lambda: (lambda: m.kpt(True)))]
        if not args.cpu:
            setups.append(("varlen", m.varlen_setup))
        if args.cpu:
            setups.append(("sdpa loop", lambda: m.sdpa_loop_setup([SDPBackend.MATH])))
        elif not args.no_loop:
            setups.append(("sdpa loop", lambda: m.sdpa_loop_setup(
                [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])))
        if fi is not None:
            setups.append(("flashinfer", lambda: m.fi_setup(fi)))
        if flex is not None:
            setups.append(("flex", lambda: m.flex_setup(flex)))
        fns = {}
        for n, setup in setups:
            try:
                fn = setup()
                o = fn()
                sync()
            except Exception as e:  # a peer that refuses the batch
                row["res"][n] = {"error": str(e).splitlines()[0][:160] if str(e) else repr(e)}
                continue
            if isinstance(o, tuple):
                o = o[0]
            row["res"][n] = {"err": rel_err(o.reshape(-1, HQ, D), ref, T)}
            fns[n] = fn
        if args.cpu:  # agreement only
            print(f"{name:>22} | " + ", ".join(
                f"{n}: {r['err']:.1e}" if "err" in r else f"{n}: {r['error']}"
                for n, r in row["res"].items()) + f" | NaN rows {row['kpt_nan_rows']}", flush=True)
            out["rows"].append(row)
            continue
        graph = bp.graph_times(fns, calls=5) if args.graph else {}
        for n, (burst, sus) in bp.timed_all(fns, 10, 50).items():
            r = row["res"][n]
            r.update({"burst_us": burst * 1e3, "sustained_us": sus * 1e3,
                      "GBps": m.kv_bytes() / burst / 1e6, "TFLOPs": m.flops() / burst / 1e9})
            if args.graph:
                r["graph_us"] = graph[n] * 1e3 if graph.get(n) else None
        kb = row["res"].get("kpt", {}).get("burst_us")
        for n, r in row["res"].items():
            if "error" in r:
                print(f"{name:>22} | {n:>10} | {r['error']}", flush=True)
                continue
            ratio = r["burst_us"] / kb if kb else float("nan")
            note = " (K, V expanded)" if n == "varlen" and getattr(m, "varlen_expanded", False) \
                else ""
            print(f"{name:>22} | {n:>10} | {r['burst_us']:9.1f} {r['sustained_us']:9.1f} | "
                  f"{r['GBps']:6.0f} {r['TFLOPs']:7.1f} | {ratio:7.2f} | {r['err']:.1e}{note}"
                  + (f" | graph {r['graph_us']:.1f} us" if r.get("graph_us") else
                     " | graph n/a" if args.graph else ""), flush=True)
        out["rows"].append(row)
        m = None  # the case's tensors go before the next case's
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
