"""Serving benchmark: kpt's paged kernels (decode, speculative decode) beside SDPA's cuDNN and
FLASH backends on the same tensors, in one process, and FlashInfer's paged wrappers where the
flashinfer package imports (on the paged cache of the first --pages size: fi_dec is
BatchDecodeWithPagedKVCacheWrapper on CUDA cores, one query token only; fi_tc the same on tensor
cores, and for Sq > 1 BatchPrefillWithPagedKVCacheWrapper with its fa2 backend, not causal, as
kpt's `full`). Reports GB/s of K+V read (burst: one call after an L2 flush; sustained: many calls
back to back; the bursts of a case's variants interleaved) and the fraction of the device's
measured copy bandwidth; checks agreement first; checks a CUDA graph capture and replay.

    python3 bench/bench_paged.py --lib build/libkpt.so [--quick] [--out FILE.json]
"""
import argparse
import json
import os
import random
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))


def load_kpt(lib):
    os.environ["KPT_LIB"] = lib
    from kpt import _capi
    return _capi


FLUSH = None
FLEX = []
FI_WORKSPACE = []


def load_flashinfer():
    try:
        import flashinfer
    except Exception as e:  # not installed: the peers are left out, and the output says so
        print(f"flashinfer: not available ({str(e).splitlines()[0][:100]})", flush=True)
        return None
    print(f"flashinfer {flashinfer.__version__}", flush=True)
    return flashinfer


def flush_l2():
    global FLUSH
    if FLUSH is None:
        FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    FLUSH.zero_()


def timed_all(fns, burst_reps=20, sustained_reps=200):
    """Median burst and sustained times (ms) of several calls of one case, their bursts
    interleaved (a round of one call each, after an L2 flush, twenty rounds, each in its own
    order): the card's clocks drift with what ran before (a sustained loop leaves it hot), and
    measured one after the other the first call of a case paid for the last one's loop.
    Sustained loops follow, one call after the other."""
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    bursts = {n: [] for n in fns}
    order = random.Random(1)
    for _ in range(burst_reps):
        names = list(fns)
        # a shuffled order each round: in one fixed order kpt's contiguous run, always right
        # after FlashInfer's, read 1642 GB/s burst at 1 x 16 x 32k against 2449 for its page-16
        # twin; shuffled, 2469 and 2424 (H200, 2026-11-29)
        order.shuffle(names)
        for n in names:
            fn = fns[n]
            flush_l2()
            # the GPU spins ~100 us while this thread records the start and submits the call, so
            # a burst times the GPU's work, not the host's: on a slow host FlashInfer's and
            # SDPA's Python paths outlasted the flush, and their bursts read 2-4x too slow
            torch.cuda._sleep(200_000)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            bursts[n].append(a.elapsed_time(b))
    out = {}
    for n, fn in fns.items():
        t = sorted(bursts[n])
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(sustained_reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        out[n] = (t[len(t) // 2], a.elapsed_time(b) / sustained_reps)
    return out


def capture(fn, calls):
    """A CUDA graph of `calls` calls of fn back to back, or None where fn cannot be captured."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture, as torch asks
            fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
        g.replay()
        torch.cuda.synchronize()
        return g
    except Exception:  # noqa: BLE001 (a peer that does not capture: reported as n/a)
        torch.cuda.synchronize()
        return None


def graph_times(fns, calls=20, replays=5, rounds=3):
    """Time (ms) a call of each of fns in a CUDA graph of `calls` calls, replayed `replays`
    times: sustained with no host in the way (what a server that captures its steps sees); None
    where a call cannot be captured. The median of `rounds` rounds, each in its own order, as
    the bursts (measured once each, kpt first, kpt's contiguous runs read up to 10 % below their
    page-16 twins in three cases where the loops had them level)."""
    graphs = {n: capture(fn, calls) for n, fn in fns.items()}
    times = {n: [] for n, g in graphs.items() if g}
    order = random.Random(2)
    for _ in range(rounds):
        names = list(times)
        order.shuffle(names)
        for n in names:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(replays):
                graphs[n].replay()
            b.record()
            torch.cuda.synchronize()
            times[n].append(a.elapsed_time(b) / (calls * replays))
    return {n: sorted(times[n])[len(times[n]) // 2] if n in times else None for n in fns}


def timed(fn, burst_reps=20, sustained_reps=200):
    """Median burst time (ms, one call after an L2 flush) and sustained time (ms a call)."""
    return timed_all({"": fn}, burst_reps, sustained_reps)[""]


def copy_bandwidth():
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    burst, sus = timed(lambda: y.copy_(x), 5, 20)
    return 2 * x.numel() / (min(burst, sus) * 1e-3) / 1e9  # read + write


class Case:
    def __init__(self, capi, ctx, kern, B, Sq, Skv, hq=32, hkv=8, d=128, page=0, dtype=torch.bfloat16,
                 page_order="random"):
        self.B, self.Sq, self.Skv, self.hq, self.hkv, self.d, self.page = B, Sq, Skv, hq, hkv, d, page
        dev = "cuda"
        self.q = torch.randn(B * Sq, hq, d, dtype=dtype, device=dev)
        self.o = torch.empty_like(self.q)
        self.lse = torch.empty(B * Sq, hq, dtype=torch.float32, device=dev)
        # the dense cache, [B, Skv, Hkv, D]: SDPA reads it as [B, Hkv, Skv, D] views
        self.kd = torch.randn(B, Skv, hkv, d, dtype=dtype, device=dev)
        self.vd = torch.randn(B, Skv, hkv, d, dtype=dtype, device=dev)
        self.cu = torch.arange(0, B * Sq + 1, Sq, dtype=torch.int32, device=dev)
        self.kvl = torch.full((B,), Skv, dtype=torch.int32, device=dev)
        self.pt = None
        if page:
            npg = Skv // page
            # random: pages anywhere in the cache, as a server's allocator leaves them after a
            # while; linear: each sequence's pages in order, one after another
            perm = (torch.randperm(B * npg, device=dev) if page_order == "random"
                    else torch.arange(B * npg, device=dev))
            self.pt = perm.view(B, npg).to(torch.int32).contiguous()
            self.kp = torch.empty(B * npg, page, hkv, d, dtype=dtype, device=dev)
            self.vp = torch.empty_like(self.kp)
            self.kp[self.pt.view(-1).long()] = self.kd.view(B * npg, page, hkv, d)
            self.vp[self.pt.view(-1).long()] = self.vd.view(B * npg, page, hkv, d)
        else:
            self.kp, self.vp = self.kd, self.vd
        self.capi, self.kern = capi, kern
        self.plan = kern.paged_plan(hq, hkv, cu_seqlens_q=list(range(0, B * Sq + 1, Sq)),
                                    kv_lens=[Skv] * B)
        self.ws = torch.empty(max(1, self.plan.workspace_bytes), dtype=torch.uint8, device=dev)

    def kpt(self):
        # the current stream at each call: a graph's capture runs on its own
        self.kern.paged(self.plan, self.q, self.kp, self.vp, self.o, self.cu, self.kvl,
                        page_table=self.pt, lse=self.lse, workspace=self.ws,
                        stream=torch.cuda.current_stream().cuda_stream)
        return self.o

    def sdpa(self, backend):
        q = self.q.view(self.B, self.Sq, self.hq, self.d).transpose(1, 2)
        k, v = self.kd.transpose(1, 2), self.vd.transpose(1, 2)
        from torch.nn.attention import sdpa_kernel
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2)

    def flex(self):
        q = self.q.view(self.B, self.Sq, self.hq, self.d).transpose(1, 2)
        return FLEX[0](q, self.kd.transpose(1, 2), self.vd.transpose(1, 2),
                       enable_gqa=True).transpose(1, 2)

    def fi_plan(self, fi, kind):
        """A FlashInfer wrapper planned for this paged case: returns its run as a closure."""
        if not FI_WORKSPACE:
            FI_WORKSPACE.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        B, npg = self.B, self.pt.shape[1]
        dev = "cuda"
        indptr = torch.arange(0, B * npg + 1, npg, dtype=torch.int32, device=dev)
        indices = self.pt.reshape(-1).contiguous()
        last = torch.full((B,), self.Skv - (npg - 1) * self.page, dtype=torch.int32, device=dev)
        kv = (self.kp, self.vp)
        if kind == "fi_dec" or (kind == "fi_tc" and self.Sq == 1):
            w = fi.BatchDecodeWithPagedKVCacheWrapper(FI_WORKSPACE[0], "NHD",
                                                      use_tensor_cores=kind == "fi_tc")
            w.plan(indptr, indices, last, self.hq, self.hkv, self.d, self.page,
                   q_data_type=self.q.dtype, kv_data_type=self.kp.dtype)
        else:
            w = fi.BatchPrefillWithPagedKVCacheWrapper(FI_WORKSPACE[0], "NHD", backend="fa2")
            qo = torch.arange(0, B * self.Sq + 1, self.Sq, dtype=torch.int32, device=dev)
            w.plan(qo, indptr, indices, last, self.hq, self.hkv, self.d, self.page, causal=False,
                   q_data_type=self.q.dtype, kv_data_type=self.kp.dtype)
        return lambda: w.run(self.q, kv)

    def kv_bytes(self):
        return 2 * self.B * self.Skv * self.hkv * self.d * self.q.element_size()


def peer_setup(c, fi_case, fi, b):
    """A function that returns the call of peer `b` on case c, or None where the peer has no call
    for it (fi_case: c's paged twin, which FlashInfer reads; its wrappers are planned there,
    outside the timings)."""
    if b is None:
        return lambda: c.flex
    if isinstance(b, str):  # FlashInfer
        return lambda: None if b == "fi_dec" and c.Sq > 1 else fi_case.fi_plan(fi, b)
    return lambda: (lambda: c.sdpa(b))


def agree(a, b):
    a, b = a.float().reshape(-1), b.float().reshape(-1)
    return ((a - b).norm() / b.norm()).item()


def graph_check(capi, kern):
    """Capture one paged run in a CUDA graph, change the lengths on the device, replay, compare
    with an eager run."""
    B, hq, hkv, d, page = 4, 32, 8, 128, 16
    dev = "cuda"
    kvl = torch.tensor([3000, 17, 1000, 2500], dtype=torch.int32, device=dev)
    cu = torch.tensor([0, 1, 3, 7, 8], dtype=torch.int32, device=dev)
    npg = 4096 // page
    pt = torch.randperm(B * npg, device=dev).view(B, npg).to(torch.int32).contiguous()
    kc = torch.randn(B * npg, page, hkv, d, dtype=torch.bfloat16, device=dev)
    vc = torch.randn_like(kc)
    q = torch.randn(8, hq, d, dtype=torch.bfloat16, device=dev)
    o = torch.empty_like(q)
    plan = kern.paged_plan(hq, hkv, batch=B, max_q=4, max_kv=4096)
    ws = torch.empty(max(1, plan.workspace_bytes), dtype=torch.uint8, device=dev)
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        kern.paged(plan, q, kc, vc, o, cu, kvl, page_table=pt, workspace=ws, stream=s.cuda_stream)
        s.synchronize()
        with torch.cuda.graph(g, stream=s):
            kern.paged(plan, q, kc, vc, o, cu, kvl, page_table=pt, workspace=ws,
                       stream=s.cuda_stream)
    kvl.copy_(torch.tensor([4096, 500, 4, 2049], dtype=torch.int32))
    cu.copy_(torch.tensor([0, 4, 5, 7, 8], dtype=torch.int32))
    o.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    got = o.clone()
    ref = torch.empty_like(o)
    kern.paged(plan, q, kc, vc, ref, cu, kvl, page_table=pt, workspace=ws,
               stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    same = bool(torch.equal(got, ref))
    return {"graph_replay_equal": same, "nan": bool(got.isnan().any())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--pages", default="16", help="page sizes of the paged variants (comma list)")
    ap.add_argument("--flex", action="store_true", help="FlexAttention too (compiled per shape)")
    ap.add_argument("--only", help="B,Sq,Skv cases only (any sizes), e.g. 8,1,32768;9,4,32768")
    ap.add_argument("--page-order", choices=["random", "linear"], default="random",
                    help="where the paged variants' pages lie in the cache")
    ap.add_argument("--dim", type=int, default=128, help="head dim (Dqk = Dv)")
    ap.add_argument("--heads", default="32:8", help="query heads:kv heads")
    ap.add_argument("--graph", action="store_true",
                    help="also time each call in a replayed CUDA graph (sustained, no host)")
    args = ap.parse_args()
    D = args.dim
    HQ, HKV = (int(x) for x in args.heads.split(":"))
    capi = load_kpt(args.lib)
    ctx = capi.Context("cuda")
    from torch.nn.attention import SDPBackend
    out = {"device": torch.cuda.get_device_name(), "kpt_target": ctx.target, "rows": []}
    kern = ctx.kernel(capi.Pattern("full"), "bf16", D, paged=True)
    out["dim"], out["heads"] = D, [HQ, HKV]
    out["graph"] = graph_check(capi, ctx.kernel(capi.Pattern("full"), "bf16", 128, paged=True))
    print("graph:", out["graph"], flush=True)
    bw = copy_bandwidth()
    out["copy_GBps"] = bw
    print(f"device: {out['device']}  copy bandwidth {bw:.0f} GB/s (read+write)", flush=True)
    Bs = [1, 8] if args.quick else [1, 8, 64]
    Sqs = [1, 4] if args.quick else [1, 4, 16]
    Skvs = [4096, 32768]
    peers = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    fi = load_flashinfer()
    if fi is not None:
        out["flashinfer"] = fi.__version__
        peers.update({"fi_dec": "fi_dec", "fi_tc": "fi_tc"})
    if args.flex:
        from torch.nn.attention.flex_attention import flex_attention
        FLEX.append(torch.compile(flex_attention, dynamic=False))
        peers["flex"] = None
    only = [tuple(int(x) for x in c.split(",")) for c in args.only.split(";")] if args.only else None
    pages = [int(x) for x in args.pages.split(",")]
    print(f"{'B':>3} {'Sq':>3} {'Skv':>6} | {'kpt':>14} " + " ".join(f"{'kpt p%d' % p:>14}" for p in pages) + " | "
          + " ".join(f"{n:>14}" for n in peers) + " | ratio  frac  (GB/s burst/sustained)")
    # --only: its cases in its order (any B, Sq and Skv); else the grid
    cases = only or [(B, Sq, Skv) for B in Bs for Sq in Sqs for Skv in Skvs]
    for B, Sq, Skv in cases:
        c = Case(capi, ctx, kern, B, Sq, Skv, hq=HQ, hkv=HKV, d=D)
        # the paged variant over the same data
        paged = {}
        for ps in pages:
            cp = Case(capi, ctx, kern, B, Sq, Skv, hq=HQ, hkv=HKV, d=D, page=ps,
                      page_order=args.page_order)
            cp.q.copy_(c.q)
            cp.kp[cp.pt.view(-1).long()] = c.kd.view(-1, ps, HKV, D)
            cp.vp[cp.pt.view(-1).long()] = c.vd.view(-1, ps, HKV, D)
            paged[f"kpt_p{ps}"] = cp
        row = {"B": B, "Sq": Sq, "Skv": Skv}
        ref = c.sdpa(SDPBackend.MATH) if B * Skv <= 8 * 32768 else None
        res, fns = {}, {}
        fi_case = paged[f"kpt_p{pages[0]}"]
        setups = [("kpt", lambda: c.kpt)] + \
            [(n, lambda x=x: x.kpt) for n, x in paged.items()] + \
            [(n, peer_setup(c, fi_case, fi, b)) for n, b in peers.items()]
        for name, setup in setups:
            try:  # a peer's setup may refuse the shape too
                fn = setup()
                if fn is None:
                    continue
                o = fn()
                torch.cuda.synchronize()
            except Exception as e:  # a backend that refuses the shape
                res[name] = None
                row[name + "_error"] = str(e).splitlines()[0][:120]
                continue
            if ref is not None:
                flat = name.startswith("kpt") or name.startswith("fi_")
                o2 = o.view(B, Sq, HQ, D) if flat else o
                row[name + "_err"] = agree(o2, ref)
            fns[name] = fn
        for name, (burst, sus) in timed_all(fns).items():
            res[name] = (c.kv_bytes() / burst / 1e6, c.kv_bytes() / sus / 1e6)
        row.update({k: v for k, v in res.items()})
        best = max((v[0] for n, v in res.items() if n in peers and v), default=None)
        fmt = lambda v: f"{v[0]:6.0f}/{v[1]:6.0f}" if v else f"{'n/a':>14}"
        ratio = res["kpt"][0] / best if best and res.get("kpt") else float("nan")
        frac = res["kpt"][0] / bw if res.get("kpt") else float("nan")
        row["ratio_best_peer"], row["frac_copy"] = ratio, frac
        print(f"{B:>3} {Sq:>3} {Skv:>6} | {fmt(res.get('kpt'))} "
              + " ".join(fmt(res.get(n)) for n in paged) + " | "
              + " ".join(fmt(res.get(n)) for n in peers)
              + f" | {ratio:5.2f} {frac:5.2f}", flush=True)
        if args.graph:
            g = graph_times(fns)
            row.update({n + "_graph": c.kv_bytes() / t / 1e6 for n, t in g.items() if t})
            print("      graph GB/s: " + ", ".join(
                f"{n} {c.kv_bytes() / t / 1e6:.0f}" if t else f"{n} n/a"
                for n, t in g.items()), flush=True)
        errs = {k: round(v, 4) for k, v in row.items() if k.endswith("_err")}
        if errs:
            print("      agreement (rel to SDPA math):", errs, flush=True)
        out["rows"].append(row)
        del c, paged, cp
        torch.cuda.empty_cache()
    # a sliding window decode: time follows the window, not the cache
    win = ctx.kernel(capi.Pattern("sliding_window(1024)"), "bf16", D, paged=True)
    for Skv in [4096, 32768]:
        c = Case(capi, ctx, win, 8, 1, Skv, hq=HQ, hkv=HKV, d=D, page=16)
        burst, sus = timed(c.kpt)
        out["rows"].append({"window": 1024, "B": 8, "Sq": 1, "Skv": Skv, "burst_ms": burst,
                            "sustained_ms": sus})
        print(f"sliding_window(1024) B=8 Sq=1 Skv={Skv} page 16: {burst * 1e3:.1f} us burst, "
              f"{sus * 1e3:.1f} us sustained", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
