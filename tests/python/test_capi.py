"""The package's C layer (kpt._capi) against libkpt's CPU backend.

A plain Python attention is the oracle; if a ctypes mirror of a C struct drifted from its header,
the arguments would arrive scrambled and these checks fail. Run by pytest (conftest.py: $KPT_LIB,
$KPT_EXAMPLES).
"""
import ctypes
import math
import os
import random
import unittest

import kpt

EXAMPLES = os.environ["KPT_EXAMPLES"]


def buffer(values):
    arr = (ctypes.c_float * len(values))(*values)
    return arr, ctypes.addressof(arr)


def reference(q, k, v, B, Hq, Hkv, Sq, Skv, D, keep, score=lambda s, b, h, i, j: s, scale=0.0):
    """o [B,Hq,Sq,D] and lse [B,Hq,Sq] of plain softmax attention, as flat lists."""
    o, lse = [0.0] * (B * Hq * Sq * D), [0.0] * (B * Hq * Sq)
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            for i in range(Sq):
                s = {}
                for j in range(Skv):
                    if keep(b, h, i, j):
                        dot = sum(q[((b * Hq + h) * Sq + i) * D + d] * k[((b * Hkv + hk) * Skv + j) * D + d]
                                  for d in range(D))
                        s[j] = score(dot * (scale or 1 / math.sqrt(D)), b, h, i, j)
                row = (b * Hq + h) * Sq + i
                if not s:
                    lse[row] = -math.inf
                    continue
                m = max(s.values())
                z = sum(math.exp(x - m) for x in s.values())
                lse[row] = m + math.log(z)
                for d in range(D):
                    o[row * D + d] = sum(math.exp(x - m) / z * v[((b * Hkv + hk) * Skv + j) * D + d]
                                         for j, x in s.items())
    return o, lse


def close(got, want, tol=1e-4):
    return all((g == w) or abs(g - w) <= tol * max(1.0, abs(w)) for g, w in zip(got, want))


class Binding(unittest.TestCase):
    B, Hq, Hkv, Sq, Skv, D = 2, 4, 2, 9, 11, 8

    def setUp(self):
        self.ctx = kpt.Context(backend="cpu", flags=kpt.NO_DISK_CACHE)
        rnd = random.Random(7)
        B, Hq, Hkv, Sq, Skv, D = self.B, self.Hq, self.Hkv, self.Sq, self.Skv, self.D
        self.qv = [rnd.uniform(-1, 1) for _ in range(B * Hq * Sq * D)]
        self.kv = [rnd.uniform(-1, 1) for _ in range(B * Hkv * Skv * D)]
        self.vv = [rnd.uniform(-1, 1) for _ in range(B * Hkv * Skv * D)]
        self.bufs = [buffer(x) for x in (self.qv, self.kv, self.vv)]
        self.o = (ctypes.c_float * (B * Hq * Sq * D))(*([float("nan")] * (B * Hq * Sq * D)))
        self.lse = (ctypes.c_float * (B * Hq * Sq))(*([float("nan")] * (B * Hq * Sq)))
        f = lambda addr, h, s: kpt.Tensor(addr, "f32", (B, h, s, D))
        self.q, self.k, self.v = (f(self.bufs[0][1], Hq, Sq), f(self.bufs[1][1], Hkv, Skv),
                                  f(self.bufs[2][1], Hkv, Skv))
        self.ot = f(ctypes.addressof(self.o), Hq, Sq)
        self.lset = kpt.Tensor(ctypes.addressof(self.lse), "f32", (B, Hq, Sq))

    def tearDown(self):
        self.ctx.close()

    def run_and_check(self, pattern, keep, score=lambda s, *_: s, **kw):
        ker = self.ctx.kernel(pattern, "f32", self.D, num_heads_q=self.Hq, num_heads_kv=self.Hkv)
        ker(self.q, self.k, self.v, self.ot, lse=self.lset, **kw)
        want_o, want_lse = reference(self.qv, self.kv, self.vv, self.B, self.Hq, self.Hkv,
                                     self.Sq, self.Skv, self.D, keep, score, kw.get("scale", 0.0))
        self.assertTrue(close(list(self.o), want_o), "o differs from the Python reference")
        self.assertTrue(close(list(self.lse), want_lse), "lse differs from the Python reference")
        return ker

    def test_scalar_pattern(self):
        pat = kpt.Pattern("sliding_window($w)+softcap(5)")
        self.assertEqual(pat.scalars(), {"w": None})
        w = 3
        self.run_and_check(pat, lambda b, h, i, j: i >= j and i - j < w,
                           lambda s, *_: 5 * math.tanh(s / 5), scalars={"w": w})

    def test_aux_tensors(self):
        pat = kpt.Pattern("document+causal")
        self.assertEqual([a[0] for a in pat.aux()], ["doc_q", "doc_kv"])
        docs = [[0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2], [0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2]]
        dq = (ctypes.c_int32 * (self.B * self.Sq))(*[x for r in docs for x in r[:self.Sq]])
        dk = (ctypes.c_int32 * (self.B * self.Skv))(*[x for r in docs for x in r])
        aux = {"doc_q": kpt.Tensor(ctypes.addressof(dq), "i32", (self.B, self.Sq)),
               "doc_kv": kpt.Tensor(ctypes.addressof(dk), "i32", (self.B, self.Skv))}
        ker = self.ctx.kernel(pat, "f32", self.D, num_heads_q=self.Hq, num_heads_kv=self.Hkv)
        # the CPU backend evaluates the mask per element: it needs no map and says so
        self.assertFalse(ker.needs_blockmap)
        with self.assertRaises(kpt.Error) as e:
            ker.blockmap(self.q, self.k, self.v, self.ot, aux=aux)
        self.assertIn("needs no block map", str(e.exception))
        self.run_and_check(pat, lambda b, h, i, j: docs[b][i] == docs[b][j] and i >= j, aux=aux)

    def test_lua_script(self):
        pat = kpt.Pattern.from_lua_file(os.path.join(EXAMPLES, "patterns", "dilated_window.lua"),
                                        params={"window": 3, "dilation": 2})
        self.assertEqual(pat.name, "dilated_window")
        self.run_and_check(pat, lambda b, h, i, j: 0 <= i - j < 6 and (i - j) % 2 == 0,
                           scale=0.7)

    def test_stats_and_info(self):
        pat = kpt.Pattern("causal")
        k1 = self.ctx.kernel(pat, "f32", self.D)
        self.ctx.kernel(pat, "f32", self.D)
        st = self.ctx.stats()
        self.assertEqual((st["requests"], st["memory_hits"]), (2, 1))
        self.assertEqual(k1.info()["target"], "cpu")
        self.assertEqual(self.ctx.target, "cpu")

    def test_errors(self):
        with self.assertRaises(kpt.Error) as e:
            kpt.Pattern("causal+sliding_window(")
        self.assertEqual(e.exception.status, -2)  # KPT_ERR_PARSE
        self.assertEqual(e.exception.column, 23)
        with self.assertRaises(kpt.Error) as e:
            kpt.Pattern.from_lua_file(os.path.join(EXAMPLES, "patterns", "alibi.lua"),
                                      params={"no_such_param": 1})
        self.assertIn("no_such_param", str(e.exception))
        ker = self.ctx.kernel(kpt.Pattern("sliding_window($w)"), "f32", self.D)
        with self.assertRaises(kpt.Error) as e:  # the scalar is missing
            ker(self.q, self.k, self.v, self.ot)
        self.assertIn("w", str(e.exception))
        self.assertTrue(math.isnan(self.o[0]), "a refused launch wrote its output")
        with self.assertRaises(kpt.Error):
            kpt.Context(backend="cuda", target="cuda:sm_1")


class ClosedContext(unittest.TestCase):
    """libkpt frees a context's kernels and block maps with it: the package refuses to use them
    afterwards (kpt.Error) instead of handing freed handles to the library."""

    def test_kernel_of_a_closed_context(self):
        ctx = kpt.Context(backend="cpu", flags=kpt.NO_DISK_CACHE)
        ker = ctx.kernel(kpt.Pattern("causal"), "f32", 8)
        ctx.close()
        o = (ctypes.c_float * 8)()
        t = kpt.Tensor(ctypes.addressof(o), "f32", (1, 1, 1, 8))
        for call in (lambda: ker(t, t, t, t), lambda: ker.info(),
                     lambda: ker.needs_blockmap):
            with self.assertRaises(kpt.Error) as e:
                call()
            self.assertIn("context is closed", str(e.exception))
            self.assertEqual(e.exception.status, -1)  # KPT_ERR_INVALID_ARGUMENT
        ctx.close()  # twice is fine

    def test_block_maps_closed_first(self):
        # (the CPU backend makes no block maps: a stand-in records the order)
        ctx, order = kpt.Context(backend="cpu", flags=kpt.NO_DISK_CACHE), []

        class Map:
            def close(self):
                order.append(("map", bool(ctx._h)))

        m = Map()
        ctx._maps.add(m)
        ctx.close()
        self.assertEqual(order, [("map", True)])  # closed while the context still lived
        closed = kpt._capi.BlockMap.__new__(kpt._capi.BlockMap)
        closed._h = ctypes.c_void_p()  # what close() leaves
        with self.assertRaises(kpt.Error) as e:
            kpt._capi._map_handle(closed, "launch")
        self.assertIn("block map is closed", str(e.exception))
