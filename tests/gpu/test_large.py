#!/usr/bin/env python3
"""kpt on tensors past 32-bit element offsets and on a million-token sequence, where the small
matrices of gpu_check cannot reach: an index computed in 32 bits would wrap there and read or
write the wrong rows without failing anything smaller.

- forward and backward (default and deterministic) of q, k, v, o of more than 2^31 elements
  (causal at head dim 128, MHA; full at head dim 64, GQA 16:4, the three-consumer kernel);
- one sequence of 2^20 tokens (causal, head dim 128), forward and backward;
- serving: a page pool of more than 2^31 elements with the batch's pages at its end, and a
  contiguous cache of more than 2^31 elements;
- the launch limits: B = 65535 and Hq = 65535 (forward and backward), a decode batch of 2^20
  sequences.

Each output starts as NaN (torch's caching allocator hands back a freed NaN block), the whole
output must be finite, the forward must agree with SDPA everywhere (where SDPA runs), and
sampled (batch, head) slices - the last ones, whose offsets are the largest - must agree with
a float64 reference of the definition computed on the GPU. It takes up to 49 GiB of device
memory.

    KPT_LIB=build-gpu/libkpt.so python3 tests/gpu/test_large.py
    KPT_CUDA_WGMMA=0 KPT_LIB=... python3 tests/gpu/test_large.py   # the mma.sync kernels

Prints one line per check and exits 1 if any failed (77 without torch, a CUDA device or the
memory).
"""
import math
import sys

from gpu_checks import check, run, torch_or_skip

torch = torch_or_skip()
import torch.nn.functional as F  # noqa: E402
import kpt  # noqa: E402

NEED_GIB = 60  # the largest group peaks at 49 GiB allocated (H200, 2026-11-30)
if torch.cuda.get_device_properties(0).total_memory < NEED_GIB << 30:
    print(f"under {NEED_GIB} GiB of device memory: skipped")
    sys.exit(77)

dev, bf16 = "cuda", torch.bfloat16
BIG = (1 << 31) + (1 << 27)  # elements: past 2^31 by a sixteenth


def rel(a, b):
    """max |a - b| / max |b|; inf where a holds a NaN (an element never written). In slices of
    about 2^26 elements along the first dim: a whole tensor in float64 would take 17 GiB."""
    step = max(1, (1 << 26) // max(1, a[0].numel())) if a.dim() else 1
    num = den = 0.0
    for x, y in zip(a.split(step), b.split(step)) if a.dim() else [(a, b)]:
        x, y = x.double(), y.double()
        if x.isnan().any():
            return float("inf")
        num, den = max(num, (x - y).abs().max().item()), max(den, y.abs().max().item())
    return num / max(den, 1e-6)


def poison(elements):
    """Leaves a freed block of NaN in torch's cache, which the next allocations of about that
    size take: what kpt does not write stays NaN."""
    blob = torch.full((elements,), float("nan"), dtype=bf16, device=dev)
    del blob


def rand(*shape, grad=False):
    return torch.randn(*shape, device=dev, dtype=bf16).requires_grad_(grad)


def finite(name, *ts):
    bad = [i for i, t in enumerate(ts) if not bool(t.isfinite().all())]
    check(f"{name}: every element written and finite", float(len(bad)), 0)


def reference(q, k, v, do, keep, scale):
    """o, lse, dq, dk, dv of one (batch, head group) slice in float64: q [G, Sq, D] (the group's
    query heads), k and v [Skv, D], do [G, Sq, Dv], keep [Sq, Skv] or None."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = q @ k.T * scale
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.exp(s - lse[..., None]) @ v
    o.backward(do.double())
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def dense_case(name, pattern, B, Hq, Hkv, S, D, samples, sdpa_causal):
    """kpt.attention forward and backward on [B, H, S, D] tensors, against SDPA (forward, whole
    tensor) and the float64 reference on the sampled (b, kv head) slices, in both modes."""
    torch.manual_seed(0)
    q = rand(B, Hq, S, D, grad=True)
    k, v = rand(B, Hkv, S, D, grad=True), rand(B, Hkv, S, D, grad=True)
    do = rand(B, Hq, S, D)
    g, scale = Hq // Hkv, 1 / math.sqrt(D)
    print(f"     {name}: q {q.numel()} elements, k {k.numel()}", flush=True)
    poison(q.numel())
    o, lse = kpt.attention(q, k, v, pattern, return_lse=True)
    finite(f"{name} forward", o, lse)
    with torch.no_grad():  # (SDPA's fused kernels take no GQA: the heads repeated)
        kr, vr = (k, v) if g == 1 else (k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))
        want = F.scaled_dot_product_attention(q, kr, vr, is_causal=sdpa_causal)
        del kr, vr
    check(f"{name} forward: o against SDPA, whole tensor", rel(o, want), 2e-2)
    del want
    keep = torch.ones(S, S, dtype=torch.bool, device=dev).tril() if sdpa_causal else None
    refs = {}
    for b, hk in samples:
        hs = slice(hk * g, hk * g + g)
        refs[b, hk] = reference(q[b, hs], k[b, hk], v[b, hk], do[b, hs], keep, scale)
        ro, rl = refs[b, hk][:2]
        check(f"{name} forward (b {b}, kv head {hk}): o", rel(o[b, hs], ro), 2e-2)
        check(f"{name} forward (b {b}, kv head {hk}): lse", rel(lse[b, hs], rl), 1e-3)
    for det in (False, True):
        mode = "deterministic" if det else "default"
        for t in (q, k, v):
            t.grad = None
        poison(q.numel())
        torch.use_deterministic_algorithms(det)
        try:
            o.backward(do, retain_graph=True)
        finally:
            torch.use_deterministic_algorithms(False)
        finite(f"{name} backward ({mode})", q.grad, k.grad, v.grad)
        for (b, hk), (_, _, rq, rk, rv) in refs.items():
            hs = slice(hk * g, hk * g + g)
            for n, got, w in (("dq", q.grad[b, hs], rq), ("dk", k.grad[b, hk], rk),
                              ("dv", v.grad[b, hk], rv)):
                check(f"{name} backward {mode} (b {b}, kv head {hk}): {n}", rel(got, w), 3e-2)


def long_case():
    """One sequence of 2^20 tokens, causal: the last 64 queries' o, lse and dq, and the last 64
    keys' dk and dv (which only those queries see) against float64."""
    torch.manual_seed(1)
    S, H, D, n = 1 << 20, 2, 128, 64
    q, k, v = (rand(1, H, S, D, grad=True) for _ in range(3))
    do = rand(1, H, S, D)
    poison(q.numel())
    o, lse = kpt.attention(q, k, v, "causal", return_lse=True)
    finite("2^20 tokens forward", o, lse)
    poison(q.numel())
    o.backward(do)
    finite("2^20 tokens backward", q.grad, k.grad, v.grad)
    i = torch.arange(S - n, S, device=dev)
    keep = i[:, None] >= torch.arange(S, device=dev)[None, :]
    for h in range(H):
        qt, kt, vt = (t.detach()[0, h].double().requires_grad_() for t in (q, k, v))
        qs = qt[S - n:]
        s = (qs @ kt.T / math.sqrt(D)).masked_fill(~keep, float("-inf"))
        rl = torch.logsumexp(s, -1)
        ro = torch.exp(s - rl[:, None]) @ vt
        ro.backward(do[0, h, S - n:].double())
        tag = f"2^20 tokens, head {h}, the last {n}"
        check(f"{tag} queries: o", rel(o[0, h, S - n:], ro), 2e-2)
        check(f"{tag} queries: lse", rel(lse[0, h, S - n:], rl), 1e-3)
        check(f"{tag} queries: dq", rel(q.grad[0, h, S - n:], qt.grad[S - n:]), 3e-2)
        check(f"{tag} keys: dk", rel(k.grad[0, h, S - n:], kt.grad[S - n:]), 3e-2)
        check(f"{tag} keys: dv", rel(v.grad[0, h, S - n:], vt.grad[S - n:]), 3e-2)


def serving_case(name, o, q, k_rows, v_rows, q_lens, kv_lens, cu, Hq, Hkv, D):
    """o of a serving call against float64 per sequence; k_rows(b) and v_rows(b) give sequence
    b's keys and values [kv_len, Hkv, D]."""
    finite(f"{name}", o)
    g = Hq // Hkv
    worst = 0.0
    for b, (ql, n) in enumerate(zip(q_lens, kv_lens)):
        if not ql:
            continue
        k = k_rows(b).double().transpose(0, 1).repeat_interleave(g, 0)
        v = v_rows(b).double().transpose(0, 1).repeat_interleave(g, 0)
        qs = q[cu[b]:cu[b + 1]].double().transpose(0, 1)
        last = torch.arange(ql, device=dev)[:, None] + n - ql  # each query's position
        keep = torch.arange(n, device=dev)[None, :] <= last
        s = (qs @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(~keep, float("-inf"))
        want = (torch.softmax(s, -1) @ v).transpose(0, 1)
        worst = max(worst, rel(o[cu[b]:cu[b + 1]], want))
    check(f"{name}: o against float64, every sequence", worst, 2e-2)


def paged_cases():
    torch.manual_seed(2)
    Hq, Hkv, D, page = 32, 8, 128, 16
    pages = -(-BIG // (page * Hkv * D))
    q_lens, kv_lens = [1, 4, 16, 0, 3, 1], [5000, 4, 33000, 9, 777, 70000]
    cu_l = [0]
    for n in q_lens:
        cu_l.append(cu_l[-1] + n)
    cu = torch.tensor(cu_l, dtype=torch.int32, device=dev)
    kvl = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
    npg = [-(-n // page) for n in kv_lens]
    # every sequence's pages at the pool's end, where page * page stride passes 2^31, shuffled
    ids = (pages - 1 - torch.randperm(sum(npg), device=dev)).to(torch.int32)
    table = torch.full((len(q_lens), max(npg)), -1, dtype=torch.int32, device=dev)
    at = 0
    for b, n in enumerate(npg):
        table[b, :n] = ids[at:at + n]
        at += n
    kc, vc = rand(pages, page, Hkv, D), rand(pages, page, Hkv, D)
    q = rand(cu_l[-1], Hq, D)
    print(f"     paged: a pool of {kc.numel()} elements, pages {int(ids.min())} to "
          f"{int(ids.max())}", flush=True)
    poison(q.numel())
    o = kpt.paged_attention(q, kc, vc, cu, kvl, table, "causal")

    def rows(cache, b):
        r = torch.arange(kv_lens[b], device=dev)
        return cache[table[b, r // page].long(), r % page]

    serving_case("paged, 16-row pages past 2^31 elements", o, q, lambda b: rows(kc, b),
                 lambda b: rows(vc, b), q_lens, kv_lens, cu_l, Hq, Hkv, D)
    del kc, vc
    torch.cuda.empty_cache()
    # a contiguous cache [B, S, Hkv, D] past 2^31 elements, the last sequences the longest
    S = 32768
    B = -(-BIG // (S * Hkv * D))
    kc, vc = rand(B, S, Hkv, D), rand(B, S, Hkv, D)
    q_lens = [1] * (B - 2) + [16, 1]
    kv_lens = [int(x) for x in torch.randint(1, S, (B - 2,))] + [S, S - 1]
    cu_l = [0]
    for n in q_lens:
        cu_l.append(cu_l[-1] + n)
    cu = torch.tensor(cu_l, dtype=torch.int32, device=dev)
    kvl = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
    q = rand(cu_l[-1], Hq, D)
    poison(q.numel())
    o = kpt.paged_attention(q, kc, vc, cu, kvl, None, "causal")
    serving_case(f"contiguous cache of {kc.numel()} elements", o, q,
                 lambda b: kc[b, :kv_lens[b]], lambda b: vc[b, :kv_lens[b]], q_lens, kv_lens,
                 cu_l, Hq, Hkv, D)


def grid_limits():
    """B and Hq at the most a launch takes (65535), forward and backward of short sequences."""
    dense_case("B = 65535, GQA 2:1", "causal", 65535, 2, 1, 17, 64,
               [(65534, 0), (32767, 0), (0, 0)], True)
    dense_case("Hq = Hkv = 65535", "causal", 1, 65535, 65535, 17, 64,
               [(0, 65534), (0, 40000), (0, 0)], True)


def paged_batch_limit():
    """A decode batch of 2^20 sequences (the most a plan takes) over pages of one row, the page
    ids shuffled over the whole pool."""
    torch.manual_seed(3)
    B, Hq, Hkv, D = 1 << 20, 4, 1, 64
    kv = torch.randint(1, 34, (B,), dtype=torch.int32)
    kv_lens = kv.tolist()
    cu_l = list(range(B + 1))
    pool = int(kv.sum())
    ids = torch.randperm(pool, device=dev).to(torch.int32)
    table = torch.full((B, 33), -1, dtype=torch.int32, device=dev)
    starts = torch.cumsum(kv, 0) - kv
    cols = torch.arange(33)
    live = cols[None, :] < kv[:, None]
    table[live.to(dev)] = ids[(starts[:, None] + cols[None, :])[live].to(dev)]
    kc, vc = rand(pool, 1, Hkv, D), rand(pool, 1, Hkv, D)
    q = rand(B, Hq, D)
    cu = torch.tensor(cu_l, dtype=torch.int32, device=dev)
    poison(q.numel())
    o = kpt.paged_attention(q, kc, vc, cu, kv.to(dev), table, "causal")
    finite(f"paged, {B} sequences, one-row pages", o)
    pick = [B - 1, B - 2, B // 2, 0]
    sub = lambda b: table[b, :kv_lens[b]].long()  # noqa: E731
    serving_case(f"paged, {B} sequences (the last, the middle, the first)",
                 o[pick], q[pick], lambda i: kc[sub(pick[i]), 0], lambda i: vc[sub(pick[i]), 0],
                 [1] * len(pick), [kv_lens[b] for b in pick], list(range(len(pick) + 1)), Hq,
                 Hkv, D)


def big_mha():
    B = -(-BIG // (32 * 2048 * 128))
    dense_case("causal, D 128, MHA", "causal", B, 32, 32, 2048, 128,
               [(B - 1, 31), (B - 1, 0), (B // 2, 17), (0, 0)], True)


def big_gqa():
    B = -(-BIG // (16 * 1024 * 64))
    dense_case("full, D 64, GQA 16:4", "full", B, 16, 4, 1024, 64,
               [(B - 1, 3), (B // 2, 1), (0, 0)], False)


def peak(fn):
    """After each group: its peak allocation, then the allocator's cache emptied."""
    print(f"     {fn.__name__}: peak {torch.cuda.max_memory_allocated() / (1 << 30):.1f} GiB "
          "allocated", flush=True)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.empty_cache()


run((big_mha, big_gqa, long_case, paged_cases, grid_limits, paged_batch_limit), after=peak)
