"""kpt.attention on the CPU backend: numpy and DLPack arrays, every way of naming a pattern,
GQA and Dqk != Dv, runtime scalars and aux tensors, the errors a user meets. A numpy attention
written out here is the oracle; outputs are compared at float32 precision.

With $KPT_TORCH_TESTS=1 and torch installed, the same on torch CPU tensors through the custom op,
its fake implementation, torch.compile, and gradients against torch's autograd of the oracle.
"""
import os

import numpy as np
import pytest

import kpt

EXAMPLES = os.environ["KPT_EXAMPLES"]


def oracle(q, k, v, keep, score=lambda s, i, j, h: s, scale=None):
    """o and lse of masked softmax attention in float64; keep(i, j) and score broadcast over
    [Sq, Skv] index grids (h: the query head, [Hq, 1, 1])."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) * (scale if scale else 1 / np.sqrt(q.shape[3]))
    i, j = np.arange(q.shape[2])[:, None], np.arange(k.shape[2])[None, :]
    h = np.arange(q.shape[1])[:, None, None]
    s = np.where(keep(i, j), score(s, i, j, h), -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m)
    z = p.sum(-1, keepdims=True)
    o = np.where(z > 0, p @ v / np.where(z > 0, z, 1), 0)
    lse = np.where(z[..., 0] > 0, np.log(np.where(z[..., 0] > 0, z[..., 0], 1)) + m[..., 0],
                   -np.inf)
    return o, lse


def qkv(B=2, Hq=4, Hkv=2, Sq=19, Skv=23, D=16, Dv=8, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, Hq, Sq, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Skv, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Skv, Dv)).astype(dtype))


def assert_close(got, want, tol=2e-5):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    finite = np.isfinite(want)
    assert (np.isfinite(got) == finite).all()
    assert np.abs(got[finite] - want[finite]).max(initial=0) <= tol * max(1, np.abs(want[finite]).max(initial=0))


def test_builtin_patterns_gqa_and_dv():
    q, k, v = qkv()
    o, lse = kpt.attention(q, k, v, "causal", return_lse=True)
    want_o, want_lse = oracle(q, k, v, lambda i, j: i >= j)
    assert o.dtype == np.float32 and lse.dtype == np.float32
    assert_close(o, want_o)
    assert_close(lse, want_lse)
    o = kpt.attention(q, k, v, "sliding_window($w)+softcap(5)", scalars={"w": 4}, scale=0.3)
    want, _ = oracle(q, k, v, lambda i, j: (i >= j) & (i - j < 4),
                     lambda s, i, j, h: 5 * np.tanh(s / 5), scale=0.3)
    assert_close(o, want)
    # a scale without scalars or aux (libkpt's arguments packed in one step)
    o = kpt.attention(q, k, v, "causal", scale=0.3)
    assert_close(o, oracle(q, k, v, lambda i, j: i >= j, scale=0.3)[0])


def test_float16_strides_and_dlpack():
    q, k, v = qkv(dtype=np.float16)
    qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # BSHD strides
    o = kpt.attention(qt, k, v, "full")
    assert o.dtype == np.float16
    assert_close(o, oracle(q, k, v, lambda i, j: np.ones_like(i + j, bool))[0], tol=2e-3)

    class Foreign:  # an array from another library, through DLPack
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    o2 = kpt.attention(Foreign(q), Foreign(k), Foreign(v), "full")
    assert np.array_equal(o, o2)


def test_lua_scripts_by_path_and_text():
    q, k, v = qkv()
    path = os.path.join(EXAMPLES, "patterns", "dilated_window.lua")
    o = kpt.attention(q, k, v, path, params={"window": 3, "dilation": 2})
    want, _ = oracle(q, k, v, lambda i, j: (i - j >= 0) & (i - j < 6) & ((i - j) % 2 == 0))
    assert_close(o, want)
    text = """return kpt.pattern{
      mask = function(b, h, q, k) return ((q ~ k) & 3):eq(0) end,
      score = function(s) return s * 0.5 * (1 + kpt.erf(s / math.sqrt(2))) end }"""
    o = kpt.attention(q, k, v, text)
    from math import erf, sqrt
    gelu = np.vectorize(lambda s: s * 0.5 * (1 + erf(s / sqrt(2))))
    want, _ = oracle(q, k, v, lambda i, j: ((i ^ j) & 3) == 0, lambda s, i, j, h: gelu(s))
    assert_close(o, want, tol=1e-4)
    assert kpt.get_pattern(text) is kpt.get_pattern(text)  # compiled once


def test_aux_tensors():
    q, k, v = qkv(Sq=23)
    doc = np.array([[0] * 7 + [1] * 9 + [2] * 7, [0] * 20 + [1] * 3], dtype=np.int32)
    o = kpt.attention(q, k, v, "document+causal", aux={"doc_q": doc, "doc_kv": doc})
    for b in range(2):
        want, _ = oracle(q[b:b + 1], k[b:b + 1], v[b:b + 1],
                         lambda i, j: (doc[b][i] == doc[b][j]) & (i >= j))
        assert_close(o[b:b + 1], want)


def test_rank4_aux_edge_features():
    """Graphormer-style [B, N, N, K] edge features, read as edge[b][q][k][c], and a strided view
    (a slice of a wider array) to show the fourth stride is honoured."""
    q, k, v = qkv(Sq=23, Skv=23)
    rng = np.random.default_rng(3)
    wide = rng.uniform(-1, 1, (2, 23, 23, 5)).astype(np.float32)
    edge, w = wide[..., 1:4], rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    o = kpt.attention(q, k, v, os.path.join(EXAMPLES, "patterns", "graphormer_edges.lua"),
                      aux={"edge": np.ascontiguousarray(np.pad(edge, ((0, 0),) * 3 + ((0, 1),))),
                           "w": np.pad(w, ((0, 0), (0, 1)))})
    script = """return kpt.pattern{ aux = {
      edge = { dtype = 'float32', shape = {'b', 'sq', 'skv', 3} },
      w = { dtype = 'float32', shape = {'hq', 3} } },
      score = function(s, b, h, q, k, p)
        return s + p.edge[b][q][k][0] * p.w[h][0] + p.edge[b][q][k][1] * p.w[h][1]
                 + p.edge[b][q][k][2] * p.w[h][2] end }"""
    o3 = kpt.attention(q, k, v, script, aux={"edge": edge, "w": w})
    for b in range(2):
        bias = np.einsum("ijc,hc->hij", edge[b].astype(np.float64), w.astype(np.float64))
        want, _ = oracle(q[b:b + 1], k[b:b + 1], v[b:b + 1], lambda i, j: i >= 0,
                         lambda s, i, j, h: s + bias)
        assert_close(o3[b:b + 1], want, tol=1e-4)
        # the example's K = 4 with the fourth feature 0 and the mean over 4: bias / 4
        want4, _ = oracle(q[b:b + 1], k[b:b + 1], v[b:b + 1], lambda i, j: i >= 0,
                          lambda s, i, j, h: s + bias / 4)
        assert_close(o[b:b + 1], want4, tol=1e-4)


def test_errors_are_clear():
    q, k, v = qkv()
    with pytest.raises(kpt.Error) as e:
        kpt.attention(q, k, v, "causal+sliding_window(")
    assert "^" in str(e.value) and e.value.column == 23
    with pytest.raises(kpt.Error) as e:
        kpt.attention(q, k, v, "return kpt.pattern{ mask = function(b, h, q, k)\n"
                               "  return q:ge(k) and k:ge(2) end }")
    assert "script:2" in str(e.value) and "never used" in str(e.value)
    with pytest.raises(kpt.Error, match="w"):
        kpt.attention(q, k, v, "sliding_window($w)")  # the scalar is missing
    with pytest.raises(TypeError, match="float16 or float32"):
        kpt.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    with pytest.raises(ValueError, match="multiple"):
        kpt.attention(q[:, :3], k, v)
    with pytest.raises(ValueError, match=r"\[B, H, S, D\]"):
        kpt.attention(q[0], k, v)
    with pytest.raises(TypeError, match="torch tensors, numpy arrays or DLPack"):
        kpt.attention([1, 2], k, v)
    with pytest.raises(ValueError, match="params go with Lua scripts"):
        kpt.attention(q, k, v, "causal", params={"w": 1})


# ---- torch CPU tensors: the custom op, fake tensors, torch.compile, autograd -------------------

torch = pytest.importorskip("torch") if os.environ.get("KPT_TORCH_TESTS") else None
needs_torch = pytest.mark.skipif(torch is None, reason="set KPT_TORCH_TESTS=1 with torch installed")


@needs_torch
def test_torch_cpu_forward_and_fake():
    q, k, v = (torch.from_numpy(t) for t in qkv())
    o = kpt.attention(q, k, v, "causal")
    assert_close(o.numpy(), oracle(q.numpy(), k.numpy(), v.numpy(), lambda i, j: i >= j)[0])
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fq, fk, fv = torch.empty(2, 4, 19, 16), torch.empty(2, 2, 23, 16), torch.empty(2, 2, 23, 8)
        fo = kpt.attention(fq, fk, fv, "causal")
        assert fo.shape == (2, 4, 19, 8)
    torch.library.opcheck(torch.ops.kpt.attention.default,
                          (q, k, v, "causal", "", [], "", [], "", [], 0.0, None))
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    torch.library.opcheck(torch.ops.kpt.attention.default,
                          (q, k, v, "causal", "", [], "", [], "", [], 0.0, sinks))


@needs_torch
def test_torch_cpu_compile_and_grad():
    q, k, v = (torch.from_numpy(t).double().float().requires_grad_() for t in qkv(Sq=9, Skv=9))
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], requires_grad=True)
    script = """return kpt.pattern{ aux = { slope = { dtype = 'float32', shape = {'hq'} } },
      mask = function(b, h, q, k) return q:ge(k) end,
      score = function(s, b, h, q, k, p) return s + p.slope[h] * kpt.float(k - q) end }"""
    f = torch.compile(lambda q, k, v, sl: kpt.attention(q, k, v, script, aux={"slope": sl}),
                      fullgraph=True)
    o = f(q, k, v, slopes)
    o.square().sum().backward()

    def ref(q, k, v, sl):
        s = q @ k.repeat_interleave(2, 1).transpose(-1, -2) / 4
        i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
        s = s + sl[:, None, None] * (j - i)
        s = s.masked_fill(i < j, float("-inf"))
        return torch.softmax(s, -1) @ v.repeat_interleave(2, 1)
    q2, k2, v2, sl2 = (t.detach().clone().requires_grad_() for t in (q, k, v, slopes))
    ref(q2, k2, v2, sl2).square().sum().backward()
    for got, want in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad),
                      (slopes.grad, sl2.grad)):
        assert_close(got.numpy(), want.numpy(), tol=1e-4)


def _paged_batch(q_lens, kv_lens, Hq=4, Hkv=2, D=16, page=4, seed=1):
    """A ragged batch over a cache of shuffled pages, and each sequence's dense keys."""
    rng = np.random.default_rng(seed)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(cu[-1]), Hq, D)).astype(np.float32)
    npages = [(n + page - 1) // page for n in kv_lens]
    maxp = max(npages) + 1
    perm = rng.permutation(sum(npages) + 2)
    table = np.full((len(kv_lens), maxp), -1, dtype=np.int32)
    kc = rng.standard_normal((len(perm), page, Hkv, D)).astype(np.float32)
    vc = rng.standard_normal((len(perm), page, Hkv, D)).astype(np.float32)
    i = 0
    for b, n in enumerate(npages):
        table[b, :n] = perm[i:i + n]
        i += n
    dense = []
    for b, n in enumerate(kv_lens):
        rows = [(table[b, j // page], j % page) for j in range(n)]
        k = np.stack([kc[p, r] for p, r in rows]) if n else np.zeros((0, Hkv, D), np.float32)
        v = np.stack([vc[p, r] for p, r in rows]) if n else np.zeros((0, Hkv, D), np.float32)
        dense.append((k.transpose(1, 0, 2)[None], v.transpose(1, 0, 2)[None]))
    return q, kc, vc, cu, np.asarray(kv_lens, dtype=np.int32), table, dense


def test_paged_attention_ragged_and_sinks():
    q_lens, kv_lens = [1, 4, 0, 3], [9, 17, 2, 3]
    q, kc, vc, cu, kvl, table, dense = _paged_batch(q_lens, kv_lens)
    sinks = np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32)
    for with_sinks in (False, True):
        o, lse = kpt.paged_attention(q, kc, vc, cu, kvl, table, "causal",
                                     sinks=sinks if with_sinks else None, return_lse=True)
        for b, (ql, kvn) in enumerate(zip(q_lens, kv_lens)):
            if not ql:
                continue
            qs = q[cu[b]:cu[b + 1]].transpose(1, 0, 2)[None]
            k, v = dense[b]
            # logical positions: query i sits at kvn - ql + i (causal is bottom-right)
            want_o, want_l = oracle(qs, k, v, lambda i, j: j <= i + (kvn - ql))
            want_o, want_l = want_o[0].transpose(1, 0, 2), want_l[0].T
            if with_sinks:
                tot = np.logaddexp(want_l, sinks[None, :].astype(np.float64))
                want_o = want_o * np.exp(want_l - tot)[..., None]
                want_l = tot
            assert_close(o[cu[b]:cu[b + 1]], want_o)
            assert_close(lse[cu[b]:cu[b + 1]], want_l)


def test_paged_attention_scalars_and_scale():
    """The paged call with a runtime scalar and a scale (libkpt's arguments built the long way,
    with a scalar array, rather than in one step)."""
    q_lens, kv_lens = [2, 1, 3], [9, 17, 5]
    q, kc, vc, cu, kvl, table, dense = _paged_batch(q_lens, kv_lens, seed=2)
    for w in (2, 5):
        o = kpt.paged_attention(q, kc, vc, cu, kvl, table, "sliding_window($w)",
                                scalars={"w": w}, scale=0.3)
        for b, (ql, kvn) in enumerate(zip(q_lens, kv_lens)):
            qs = q[cu[b]:cu[b + 1]].transpose(1, 0, 2)[None]
            i0 = kvn - ql  # logical position of the first query
            want, _ = oracle(qs, *dense[b], lambda i, j: (j <= i + i0) & (i + i0 - j < w),
                             scale=0.3)
            assert_close(o[cu[b]:cu[b + 1]], want[0].transpose(1, 0, 2))
    # a scale alone (the arguments packed in one step)
    o = kpt.paged_attention(q, kc, vc, cu, kvl, table, "causal", scale=0.3)
    for b, (ql, kvn) in enumerate(zip(q_lens, kv_lens)):
        qs = q[cu[b]:cu[b + 1]].transpose(1, 0, 2)[None]
        want, _ = oracle(qs, *dense[b], lambda i, j: j <= i + kvn - ql, scale=0.3)
        assert_close(o[cu[b]:cu[b + 1]], want[0].transpose(1, 0, 2))


def test_paged_attention_errors():
    q, kc, vc, cu, kvl, table, _ = _paged_batch([2], [1])  # more queries than keys
    with pytest.raises(kpt.Error, match="queries but 1 keys"):
        kpt.paged_attention(q, kc, vc, cu, kvl, table)


@needs_torch
def test_torch_cpu_sinks_grad():
    q, k, v = (torch.from_numpy(t).double().float().requires_grad_() for t in qkv(Sq=9, Skv=9))
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    o = kpt.attention(q, k, v, "causal", sinks=sinks)
    o.sum().backward()
    qd, kd, vd, sd = (t.detach().double().requires_grad_() for t in (q, k, v, sinks))
    kr, vr = kd.repeat_interleave(2, 1), vd.repeat_interleave(2, 1)
    s = (qd @ kr.transpose(-1, -2)) / 4.0
    s = s.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
    s = torch.cat([s, sd[None, :, None, None].expand(2, 4, 9, 1)], -1)
    ref = torch.softmax(s, -1)[..., :-1] @ vr
    ref.sum().backward()
    for got, want in ((o, ref), (q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad),
                      (sinks.grad, sd.grad)):
        assert torch.allclose(got.double(), want.detach(), atol=1e-4, rtol=1e-4)


def test_sinks_numpy():
    q, k, v = qkv()
    sinks = np.array([0.3, -2.0, 1.5, 0.0], dtype=np.float32)
    o, lse = kpt.attention(q, k, v, "causal", sinks=sinks, return_lse=True)
    want_o, want_l = oracle(q, k, v, lambda i, j: i >= j)
    tot = np.logaddexp(want_l, sinks[None, :, None].astype(np.float64))
    assert_close(lse, tot)
    assert_close(o, want_o * np.exp(want_l - tot)[..., None])
