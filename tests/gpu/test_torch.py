#!/usr/bin/env python3
"""The Python package on CUDA tensors (the device's half of tests/python): kpt.attention against
SDPA and explicit masks, gradients against torch's autograd, aux (learnable parameter)
gradients, torch.compile with fullgraph=True, CUDA graph capture and replay, and a short training
run of a small transformer whose losses follow SDPA's step by step.

    KPT_LIB=build-gpu/libkpt.so python3 tests/gpu/test_torch.py

Prints one line per check and exits 1 if any failed (77 without a CUDA device or torch).
"""
import math
import os

from gpu_checks import check, run, torch_or_skip

torch = torch_or_skip()
import torch.nn.functional as F  # noqa: E402
import kpt  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
dev, bf16 = "cuda", torch.bfloat16


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


def rand(*shape, dtype=bf16, grad=False):
    return torch.randn(*shape, device=dev, dtype=dtype).requires_grad_(grad)


def sdpa(q, k, v, mask=None, causal=False, scale=None):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


def forward_checks():
    torch.manual_seed(0)
    q, k, v = rand(2, 8, 1000, 128), rand(2, 2, 1000, 128), rand(2, 2, 1000, 128)
    check("forward causal GQA", rel(kpt.attention(q, k, v, "causal"), sdpa(q, k, v, causal=True)),
          2e-2)
    i = torch.arange(1000, device=dev)
    win = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < 200)
    check("forward sliding_window($w)",
          rel(kpt.attention(q, k, v, "sliding_window($w)", scalars={"w": 200}),
              sdpa(q, k, v, mask=win)), 2e-2)
    doc = (i // 300).to(torch.int32).expand(2, 1000).contiguous()
    mask = (doc[0][:, None] == doc[0][None, :]) & (i[:, None] >= i[None, :])
    aux = {"doc_q": doc, "doc_kv": doc}
    o1 = kpt.attention(q, k, v, "document+causal", aux=aux)
    o2 = kpt.attention(q, k, v, "document+causal", aux=aux)  # the cached block map
    check("forward document+causal (block map)", rel(o1, sdpa(q, k, v, mask=mask)), 2e-2)
    check("forward document+causal, block map reused", (o1 - o2).abs().max().item(), 0)
    doc2 = (i // 100).to(torch.int32).expand(2, 1000).contiguous()
    doc.copy_(doc2)  # in place: the version counter says the map is stale
    mask2 = (doc2[0][:, None] == doc2[0][None, :]) & (i[:, None] >= i[None, :])
    check("forward document+causal after an in-place change",
          rel(kpt.attention(q, k, v, "document+causal", aux=aux), sdpa(q, k, v, mask=mask2)), 2e-2)
    script = os.path.join(EXAMPLES, "patterns", "gemma2.lua")
    qs, ks, vs = rand(1, 4, 512, 64), rand(1, 4, 512, 64), rand(1, 4, 512, 64)
    j = torch.arange(512, device=dev)
    gm = (j[:, None] >= j[None, :]) & (j[:, None] - j[None, :] < 128)
    s = (qs.float() @ ks.float().transpose(-1, -2)) / 8
    s = (50 * torch.tanh(s / 50)).masked_fill(~gm, float("-inf"))
    ref = torch.softmax(s, -1) @ vs.float()
    check("forward Lua script (gemma2.lua)",
          rel(kpt.attention(qs, ks, vs, script, params={"window": 128}), ref), 2e-2)


def backward_checks():
    torch.manual_seed(1)
    for name, hkv, d in (("causal", 8, 64), ("causal GQA", 2, 64), ("causal D=256", 2, 256)):
        q, k, v = rand(2, 8, 777, d, grad=True), rand(2, hkv, 777, d, grad=True), rand(
            2, hkv, 777, d, grad=True)
        do = rand(2, 8, 777, d)
        kpt.attention(q, k, v, "causal").backward(do)
        got = [t.grad for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        sdpa(q, k, v, causal=True).backward(do)
        for g, t, n in zip(got, (q, k, v), "qkv"):
            check(f"backward {name} d{n} vs SDPA", rel(g, t.grad), 3e-2)
    # torch's determinism switch: the same bits twice (on sm_90a, dq without atomics)
    q, k, v = (rand(1, 4, 1000, 128, grad=True) for _ in range(3))
    do = rand(1, 4, 1000, 128)
    torch.use_deterministic_algorithms(True)
    try:
        runs = []
        for _ in range(2):
            for t in (q, k, v):
                t.grad = None
            kpt.attention(q, k, v, "causal").backward(do)
            runs.append([t.grad.clone() for t in (q, k, v)])
    finally:
        torch.use_deterministic_algorithms(False)
    check("backward deterministic: bitwise equal runs",
          0.0 if all(torch.equal(a, b) for a, b in zip(*runs)) else 1.0, 0.0)
    # a learnable per-head slope (an aux tensor with requires_grad), against fp32 autograd
    q, k, v = rand(1, 4, 300, 64, grad=True), rand(1, 4, 300, 64, grad=True), rand(
        1, 4, 300, 64, grad=True)
    slope = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=dev, requires_grad=True)
    script = """return kpt.pattern{ aux = { slope = { dtype = 'float32', shape = {'hq'} } },
      mask = function(b, h, q, k) return q:ge(k) end,
      score = function(s, b, h, q, k, p) return s + p.slope[h] * kpt.float(k - q) end }"""
    do = rand(1, 4, 300, 64)
    kpt.attention(q, k, v, script, aux={"slope": slope}).backward(do)
    got = [t.grad.clone() for t in (q, k, v, slope)]
    q2, k2, v2, sl2 = (t.detach().float().requires_grad_() for t in (q, k, v, slope))
    i = torch.arange(300, device=dev)
    s = q2 @ k2.transpose(-1, -2) / 8 + sl2[:, None, None] * (i[None, :] - i[:, None])
    s = s.masked_fill(i[:, None] < i[None, :], float("-inf"))
    (torch.softmax(s, -1) @ v2).backward(do.float())
    for g, t, n in zip(got, (q2, k2, v2, sl2), ("dq", "dk", "dv", "dslope")):
        check(f"backward learnable slope {n} vs fp32 autograd", rel(g, t.grad), 3e-2)


def compile_and_graph_checks():
    torch.manual_seed(2)
    q, k, v = rand(2, 8, 512, 128), rand(2, 8, 512, 128), rand(2, 8, 512, 128)
    f = torch.compile(lambda q, k, v: kpt.attention(q, k, v, "causal+softcap(30)") * 2,
                      fullgraph=True)
    eager = kpt.attention(q, k, v, "causal+softcap(30)") * 2
    check("torch.compile(fullgraph=True) vs eager", (f(q, k, v) - eager).abs().max().item(), 0)
    # CUDA graph: forward and backward captured, replayed on new data
    sq, sk, sv = (t.clone().requires_grad_() for t in (q, k, v))
    sdo = rand(2, 8, 512, 128)
    doc = (torch.arange(512, device=dev) // 100).to(torch.int32).expand(2, 512).contiguous()
    aux = {"doc_q": doc, "doc_kv": doc}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: kernels compiled, block maps built
        for _ in range(2):
            kpt.attention(sq, sk, sv, "document+causal", aux=aux).backward(sdo)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    sq.grad = sk.grad = sv.grad = None
    with torch.cuda.graph(g):
        so = kpt.attention(sq, sk, sv, "document+causal", aux=aux)
        so.backward(sdo)
    for t, new in zip((sq, sk, sv), (rand(2, 8, 512, 128) for _ in range(3))):
        t.data.copy_(new)
    g.replay()
    torch.cuda.synchronize()
    rq, rk, rv = (t.detach().clone().requires_grad_() for t in (sq, sk, sv))
    ro = kpt.attention(rq, rk, rv, "document+causal", aux=aux)
    ro.backward(sdo)
    check("CUDA graph replay: o", (so - ro).abs().max().item(), 0)
    check("CUDA graph replay: dq", (sq.grad - rq.grad).abs().max().item(), 0)


class Block(torch.nn.Module):
    """A pre-norm transformer block whose attention is SDPA or kpt (causal)."""

    def __init__(self, dim, heads, use_kpt):
        super().__init__()
        self.heads, self.use_kpt = heads, use_kpt
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, S, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = (t.to(bf16) for t in (q, k, v))
        if self.use_kpt:
            a = kpt.attention(q, k, v, "causal")
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.float().transpose(1, 2).reshape(B, S, D))
        return x + self.mlp(self.norm2(x))


def training_check():
    losses = {}
    for use_kpt in (False, True):
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Embedding(512, 256),
                                    *[Block(256, 4, use_kpt) for _ in range(2)],
                                    torch.nn.Linear(256, 512)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        gen = torch.Generator(device=dev).manual_seed(4)
        out = []
        for _ in range(30):
            tokens = torch.randint(0, 512, (8, 257), device=dev, generator=gen)
            tokens[:, 1::2] = (tokens[:, 0:-1:2] * 7 + 3) % 512  # learnable structure
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 512), tokens[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses[use_kpt] = out
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses[True], losses[False]))
    print("     losses (SDPA):", " ".join(f"{x:.3f}" for x in losses[False][::5]))
    print("     losses (kpt): ", " ".join(f"{x:.3f}" for x in losses[True][::5]))
    check("training: losses follow SDPA's step by step (max relative difference)", worst, 2e-2)
    check("training: the loss falls", losses[True][-1] / losses[True][0], 0.9)


def sinks_checks():
    """Learnable sinks through kpt.attention: o and the gradients of q, k, v and the sinks
    against fp32 autograd of the definition (a logit column with no value in the softmax)."""
    B, Hq, Hkv, S, D = 2, 8, 2, 300, 64
    q, k, v = rand(B, Hq, S, D, grad=True), rand(B, Hkv, S, D, grad=True), rand(B, Hkv, S, D, grad=True)
    sinks = torch.randn(Hq, device=dev, requires_grad=True)
    dout = torch.randn(B, Hq, S, D, device=dev)
    o = kpt.attention(q, k, v, "causal", sinks=sinks)
    (o.float() * dout).sum().backward()
    got = [o.detach(), q.grad, k.grad, v.grad, sinks.grad]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    sf = sinks.detach().clone().requires_grad_()
    kr, vr = kf.repeat_interleave(Hq // Hkv, 1), vf.repeat_interleave(Hq // Hkv, 1)
    s = qf @ kr.transpose(-1, -2) / math.sqrt(D)
    keep = torch.ones(S, S, dtype=torch.bool, device=dev).tril()
    s = s.masked_fill(~keep, float("-inf"))
    s = torch.cat([s, sf[None, :, None, None].expand(B, Hq, S, 1)], -1)
    ref = torch.softmax(s, -1)[..., :-1] @ vr
    (ref * dout).sum().backward()
    want = [ref.detach(), qf.grad, kf.grad, vf.grad, sf.grad]
    for name, g, w in zip(["o", "dq", "dk", "dv", "dsinks"], got, want):
        check(f"sinks: {name} vs fp32 autograd", rel(g, w), 3e-2)


def paged_checks():
    """kpt.paged_attention on CUDA tensors: a ragged decode batch over 16-row pages against SDPA
    per sequence (bottom-right causal), sinks by their definition, and a plan made for bounds
    captured in a CUDA graph and replayed with other lengths."""
    Hq, Hkv, D, page = 32, 8, 128, 16
    q_lens, kv_lens = [1, 4, 0, 16, 1], [700, 33, 5, 2048, 1]
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=dev)
    kvl = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
    npg = [(n + page - 1) // page for n in kv_lens]
    maxp = max(npg)
    pool = torch.randperm(sum(npg) + 4, device=dev).to(torch.int32)
    table = torch.full((len(q_lens), maxp), -1, dtype=torch.int32, device=dev)
    i = 0
    for b, n in enumerate(npg):
        table[b, :n] = pool[i:i + n]
        i += n
    kc = rand(pool.numel(), page, Hkv, D)
    vc = rand(pool.numel(), page, Hkv, D)
    q = rand(int(cu[-1]), Hq, D)
    sinks = torch.randn(Hq, device=dev)
    o, lse = kpt.paged_attention(q, kc, vc, cu, kvl, table, "causal", sinks=sinks,
                                 return_lse=True)
    worst = 0.0
    for b, (ql, n) in enumerate(zip(q_lens, kv_lens)):
        if not ql:
            continue
        rows = torch.arange(n, device=dev)
        k = kc[table[b, rows // page].long(), rows % page].transpose(0, 1)[None]
        v = vc[table[b, rows // page].long(), rows % page].transpose(0, 1)[None]
        qs = q[cu[b]:cu[b + 1]].transpose(0, 1)[None]
        keep = rows[None, :] <= torch.arange(ql, device=dev)[:, None] + (n - ql)
        s = (qs.float() @ k.float().repeat_interleave(Hq // Hkv, 1).transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(~keep, float("-inf"))
        tot = torch.logaddexp(torch.logsumexp(s, -1), sinks[None, :, None])
        p = torch.exp(s - tot[..., None])
        want = (p @ v.float().repeat_interleave(Hq // Hkv, 1))[0].transpose(0, 1)
        worst = max(worst, rel(o[cu[b]:cu[b + 1]], want))
        worst = max(worst, rel(lse[cu[b]:cu[b + 1]], tot[0].T))
    check("paged: ragged batch, 16-row pages, sinks, against the definition", worst, 2e-2)
    plan = kpt.paged_plan("causal", "bf16", D, Hq, Hkv, batch=len(q_lens), max_q=16, max_kv=2048)
    ws = torch.empty(max(1, plan.workspace_bytes), dtype=torch.uint8, device=dev)
    out = torch.empty_like(q)
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        kpt.paged_attention(q, kc, vc, cu, kvl, table, "causal", plan=plan, workspace=ws, out=out)
        s.synchronize()
        with torch.cuda.graph(g, stream=s):
            kpt.paged_attention(q, kc, vc, cu, kvl, table, "causal", plan=plan, workspace=ws,
                                out=out)
    kvl.copy_(torch.tensor([16, 2000, 100, 1000, 7]))
    g.replay()
    torch.cuda.synchronize()
    eager = kpt.paged_attention(q, kc, vc, cu, kvl, table, "causal", plan=plan, workspace=ws)
    check("paged: CUDA graph replay with new lengths equals an eager run",
          0.0 if torch.equal(out, eager) else 1.0, 0.0)
    # a plan for fewer queries than a sequence has: the rows past it are NaN, the rest right
    short = kpt.paged_plan("causal", "bf16", D, Hq, Hkv, batch=len(q_lens), max_q=1, max_kv=2048)
    got = kpt.paged_attention(q, kc, vc, cu, kvl, table, "causal", plan=short)
    full = kpt.paged_attention(q, kc, vc, cu, kvl, table, "causal", plan=plan, workspace=ws)
    c, cap = cu.tolist(), short.q_blocks * short.q_per_block  # queries the plan covers
    first = torch.tensor([t for b in range(len(q_lens)) for t in range(c[b], min(c[b + 1],
                          c[b] + cap))], device=dev)
    rest = torch.tensor([t for b in range(len(q_lens)) for t in range(c[b] + cap, c[b + 1])],
                        device=dev)
    ok = rest.numel() > 0 and bool(got[rest].isnan().all()) and \
        not got[first].isnan().any() and rel(got[first], full[first]) < 2e-2
    check("paged: a plan for fewer queries gives NaN past it, the first queries right",
          0.0 if ok else 1.0, 0.0)
    # a packed plan (a prefill chunk beside decodes, made from host lengths) captured once and
    # replayed after the 40 queries moved to another sequence: the same total fits it
    qa, qb = [40, 1, 1, 1, 1], [1, 1, 1, 40, 1]
    cum = lambda ls: [0] + [int(x) for x in torch.tensor(ls).cumsum(0)]  # noqa: E731
    packed = kpt.paged_plan("causal", "bf16", D, Hq, Hkv, cu_seqlens_q=cum(qa), kv_lens=kv_lens)
    check("paged: a mixed batch's plan is packed",
          0.0 if packed.q_blocks == 0 and packed.max_tokens == 44 else 1.0, 0.0)
    cu2 = torch.tensor(cum(qa), dtype=torch.int32, device=dev)
    kvl2 = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
    q2 = rand(44, Hq, D)
    ws2 = torch.empty(max(1, packed.workspace_bytes), dtype=torch.uint8, device=dev)
    out2 = torch.full_like(q2, float("nan"))
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        kpt.paged_attention(q2, kc, vc, cu2, kvl2, table, "causal", plan=packed, workspace=ws2,
                            out=out2)
        s.synchronize()
        with torch.cuda.graph(g2, stream=s):
            kpt.paged_attention(q2, kc, vc, cu2, kvl2, table, "causal", plan=packed,
                                workspace=ws2, out=out2)
    cu2.copy_(torch.tensor(cum(qb), dtype=torch.int32))
    out2.fill_(float("nan"))
    g2.replay()
    torch.cuda.synchronize()
    fresh = kpt.paged_plan("causal", "bf16", D, Hq, Hkv, cu_seqlens_q=cum(qb), kv_lens=kv_lens)
    want2 = kpt.paged_attention(q2, kc, vc, cu2, kvl2, table, "causal", plan=fresh)
    check("paged: a packed plan replayed with the queries moved equals a fresh plan's run",
          rel(out2, want2) if not out2.isnan().any() else float("inf"), 2e-2)


run((forward_checks, backward_checks, compile_and_graph_checks, training_check, sinks_checks,
     paged_checks))
