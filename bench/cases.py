"""The benchmark's patterns: each as kpt runs it (a built-in pattern string or a Lua example
script), as FlexAttention runs it (score_mod / mask_mod), and as SDPA runs it where SDPA can
(is_causal, or a materialised boolean mask or float bias).

make_case(name, B, S, H, D, dtype) returns a Case with the tensors the pattern reads; the torch
functions follow kpt's definitions (docs/patterns.md, examples/patterns/*.lua) exactly, and every
case is checked for agreement before it is timed.
"""
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "examples", "patterns")

BUILTIN = ["full", "causal", "sliding_window", "alibi+causal", "softcap+causal", "prefix_lm",
           "document", "gqa_causal", "docs12_causal"]
LUA = ["alibi", "chunked_causal", "dilated_window", "document_logical", "gemma2", "graphormer",
       "longformer", "natten_2d", "natten_morton", "gelu_scores", "prefix_lm", "t5_buckets",
       "sliding_tile", "sliding_tile_3d"]
SPARSE = ["sliding_window", "document"]  # also run at S = 32k and 64k
DENSE_MASK_MAX_S = 16384  # SDPA's materialised boolean mask: S*S bytes
DENSE_BIAS_MAX_S = 8192   # SDPA's materialised bias: H*S*S elements


@dataclass
class Case:
    name: str
    kpt: str                     # a pattern string, or "lua:<script>"
    lua_params: dict = field(default_factory=dict)  # compile-time params of a script
    scalars: dict = field(default_factory=dict)     # runtime scalars
    aux: dict = field(default_factory=dict)         # aux tensors by kpt name
    score_mod: Optional[Callable] = None
    mask_mod: Optional[Callable] = None
    mask_uses_batch: bool = False  # FlexAttention's block mask needs B rows
    hq: int = 16
    hkv: int = 16
    sdpa: Optional[str] = None     # "plain", "causal", "mask" or "bias"
    bias_fn: Optional[Callable] = None  # (h, q, k) -> float bias for SDPA ("bias")

    @property
    def kernel_key(self):
        return (self.kpt, tuple(sorted(self.lua_params.items())))

    def pattern(self, kpt):
        """The kpt pattern (`kpt` is the package python/kpt)."""
        if self.kpt.startswith("lua:"):
            path = os.path.join(SCRIPTS, self.kpt[4:] + ".lua")
            return kpt.Pattern.from_lua_file(path, params=self.lua_params)
        return kpt.Pattern(self.kpt)


def alibi_slopes(h):
    """kpt's ALiBi slopes (compiler/builtins.c: kpt_alibi_slope) for h heads."""
    m = 1 << (h.bit_length() - 1)
    return [2 ** (-8 * (i + 1) / m) if i < m else 2 ** (-4 * (2 * (i - m) + 1) / m)
            for i in range(h)]


def causal(b, h, q, k):
    return q >= k


def doc_ids(B, S, dev, seed, docs=4):
    """Document ids [B, S]: `docs` documents of random lengths, the same for every batch row."""
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randint(1, S, (docs - 1,), generator=g).tolist())
    ids = torch.zeros(S, dtype=torch.int32)
    for c in cuts:
        ids[c:] += 1
    return ids.to(dev).unsqueeze(0).expand(B, S).contiguous(), [0] + cuts


def make_case(name, B, S, H, dev="cuda"):
    if name.startswith("lua:"):
        return _lua_case(name[4:], B, S, H, dev)
    if name == "full":
        return Case(name, "full", sdpa="plain", hq=H, hkv=H)
    if name == "causal":
        return Case(name, "causal", mask_mod=causal, sdpa="causal", hq=H, hkv=H)
    if name == "gqa_causal":
        return Case(name, "causal", mask_mod=causal, sdpa="causal", hq=32, hkv=8)
    if name == "gqa8_causal":  # eight query heads a kv head (not in the default lists)
        return Case(name, "causal", mask_mod=causal, sdpa="causal", hq=32, hkv=4)
    if name == "sliding_window":
        W = 1024
        return Case(name, f"sliding_window({W})", mask_mod=lambda b, h, q, k: (q >= k) & (q - k < W),
                    sdpa="mask", hq=H, hkv=H)
    if name == "prefix_lm":
        P = S // 4
        return Case(name, "prefix_lm($p)", scalars={"p": P},
                    mask_mod=lambda b, h, q, k: (k < P) | (q >= k), sdpa="mask", hq=H, hkv=H)
    if name == "alibi+causal":
        slopes = torch.tensor(alibi_slopes(H), device=dev, dtype=torch.float32)
        return Case(name, "alibi+causal", score_mod=lambda s, b, h, q, k: s + slopes[h] * (k - q),
                    mask_mod=causal, sdpa="bias", hq=H, hkv=H,
                    bias_fn=lambda h, q, k: slopes[h] * (k - q))
    if name == "softcap+causal":
        C = 50.0
        return Case(name, "softcap(50)+causal", score_mod=lambda s, b, h, q, k: C * torch.tanh(s / C),
                    mask_mod=causal, hq=H, hkv=H)
    if name == "document":
        ids, _ = doc_ids(B, S, dev, S)
        return Case(name, "document", aux={"doc_q": ids, "doc_kv": ids},
                    mask_mod=lambda b, h, q, k: ids[b, q] == ids[b, k], sdpa="mask", hq=H, hkv=H)
    if name == "docs12_causal":  # many short documents: 12 causal ones packed (~4 % kept at 16k)
        ids, _ = doc_ids(B, S, dev, S, docs=12)
        return Case(name, "document+causal", aux={"doc_q": ids, "doc_kv": ids},
                    mask_mod=lambda b, h, q, k: (ids[b, q] == ids[b, k]) & (q >= k), sdpa="mask",
                    hq=H, hkv=H)
    raise ValueError(f"unknown case {name}")


def _lua_case(script, B, S, H, dev):
    name = "lua:" + script
    c = Case(name, name, hq=H, hkv=H)
    if script == "alibi":
        slopes = torch.tensor([2 ** (-8 * (h + 1) / H) for h in range(H)], device=dev)
        c.score_mod = lambda s, b, h, q, k: s + slopes[h] * (k - q)
        c.mask_mod = causal
    elif script == "chunked_causal":
        C = 2048
        c.lua_params = {"chunk": C}
        c.mask_mod = lambda b, h, q, k: (q // C == k // C) & (q >= k)
    elif script == "dilated_window":
        W, Dl = 512, 2
        c.lua_params = {"window": W, "dilation": Dl}
        c.mask_mod = lambda b, h, q, k: (q - k >= 0) & (q - k < W * Dl) & ((q - k) % Dl == 0)
    elif script == "document_logical":
        P = 16
        ids, starts = doc_ids(B, S, dev, S + 1)
        offs = torch.full((S,), S, dtype=torch.int32)
        offs[: len(starts)] = torch.tensor(starts, dtype=torch.int32)
        offs = offs.to(dev).unsqueeze(0).expand(B, S).contiguous()
        c.lua_params = {"prefix": P}
        c.aux = {"doc": ids, "offsets": offs}

        def mask(b, h, q, k):
            dq, dk = ids[b, q], ids[b, k]
            qp, kp = q - offs[b, dq], k - offs[b, dk]
            return (dq == dk) & ((qp >= kp) | (kp < P))
        c.mask_mod = mask
    elif script == "gemma2":
        W, C = 4096, 50.0
        c.score_mod = lambda s, b, h, q, k: C * torch.tanh(s / C)
        c.mask_mod = lambda b, h, q, k: (q >= k) & (q - k < W)
    elif script == "graphormer":
        g = torch.Generator(device=dev).manual_seed(S)
        dist = torch.randint(0, 20, (B, S, S), device=dev, dtype=torch.int32, generator=g)
        bias = torch.rand(H, 16, device=dev, generator=g) * 2 - 1
        c.aux = {"dist": dist, "bias": bias}
        c.score_mod = lambda s, b, h, q, k: s + bias[h, dist[b, q, k].clamp(0, 15)]
    elif script == "longformer":
        W = 256
        g = torch.Generator(device=dev).manual_seed(S)
        glob = torch.rand(B, S, device=dev, generator=g) < 1 / 256
        glob[:, 0] = True
        c.lua_params = {"window": W}
        c.aux = {"global": glob}
        c.mask_uses_batch = True
        c.mask_mod = lambda b, h, q, k: ((q - k).abs() <= W) | glob[b, q] | glob[b, k]
    elif script == "natten_2d":
        Wd, K = 128, 13
        Ht = S // Wd
        c.lua_params = {"width": Wd, "height": Ht, "kernel": K}

        def mask(b, h, q, k):
            qx, qy, kx, ky = q % Wd, q // Wd, k % Wd, k // Wd
            x0 = (qx - K // 2).clamp(0, Wd - K)
            y0 = (qy - K // 2).clamp(0, Ht - K)
            return (kx >= x0) & (kx < x0 + K) & (ky >= y0) & (ky < y0 + K)
        c.mask_mod = mask
    elif script == "natten_morton":
        side, K = 1 << (S.bit_length() // 2), 13  # S = 4^n: a side x side canvas in Z order
        if side * side != S:
            raise ValueError(f"natten_morton needs S a power of 4, not {S}")
        c.lua_params = {"side": side, "kernel": K}

        def compact(v):  # the even bits of v, packed (as the script's compact)
            v = v & 0x55555555
            v = (v | (v >> 1)) & 0x33333333
            v = (v | (v >> 2)) & 0x0F0F0F0F
            v = (v | (v >> 4)) & 0x00FF00FF
            return (v | (v >> 8)) & 0x0000FFFF

        def mask(b, h, q, k):
            qx, qy, kx, ky = compact(q), compact(q >> 1), compact(k), compact(k >> 1)
            x0 = (qx - K // 2).clamp(0, side - K)
            y0 = (qy - K // 2).clamp(0, side - K)
            return (kx >= x0) & (kx < x0 + K) & (ky >= y0) & (ky < y0 + K)
        c.mask_mod = mask
    elif script in ("sliding_tile", "sliding_tile_3d"):
        # STA (examples/patterns/sliding_tile.lua): 2-D, a square canvas in 8 x 8 tiles and a
        # 5 x 5 tile window; 3-D, 16 frames of a square canvas in 4 x 4 x 4 tiles, 3 x 3 x 3
        c.kpt = "lua:sliding_tile"
        if script == "sliding_tile":
            frames, side, tile, win = 1, math.isqrt(S), (1, 8, 8), (1, 5, 5)
        else:
            frames, side, tile, win = 16, math.isqrt(S // 16), (4, 4, 4), (3, 3, 3)
        if frames * side * side != S or side % tile[1]:
            raise ValueError(f"{script}: S = {S} is not a canvas of whole tiles")
        c.lua_params = {"frames": frames, "height": side, "width": side, "tile_f": tile[0],
                        "tile_h": tile[1], "tile_w": tile[2], "win_f": win[0], "win_h": win[1],
                        "win_w": win[2]}
        nf, nh, nw = frames // tile[0], side // tile[1], side // tile[2]
        vol = tile[0] * tile[1] * tile[2]

        def tile_of(t):
            i = t // vol
            return i // (nh * nw), i // nw % nh, i % nw

        def mask(b, h, q, k):
            (qf, qh, qw), (kf, kh, kw) = tile_of(q), tile_of(k)
            f0 = (qf - win[0] // 2).clamp(0, nf - win[0])
            h0 = (qh - win[1] // 2).clamp(0, nh - win[1])
            w0 = (qw - win[2] // 2).clamp(0, nw - win[2])
            return ((kf >= f0) & (kf < f0 + win[0]) & (kh >= h0) & (kh < h0 + win[1])
                    & (kw >= w0) & (kw < w0 + win[2]))
        c.mask_mod = mask
    elif script == "gelu_scores":
        c.score_mod = lambda s, b, h, q, k: s * 0.5 * (1 + torch.erf(s / math.sqrt(2)))
        c.mask_mod = lambda b, h, q, k: q >= k
    elif script == "prefix_lm":
        P = S // 4
        c.scalars = {"prefix": P}
        c.mask_mod = lambda b, h, q, k: (k < P) | (q >= k)
    elif script == "t5_buckets":
        nb, maxd = 16, 128  # buckets per direction, the script's MAX_DISTANCE
        exact = nb // 2
        edges = []  # the smallest distance of each log-spaced bucket, as the script computes
        for v in range(exact + 1, nb):
            n = exact if not edges else edges[-1]
            while min(exact + math.floor(math.log(n / exact) / math.log(maxd / exact)
                                         * (nb - exact) + 1e-9), nb - 1) < v:
                n += 1
            edges.append(n)
        g = torch.Generator(device=dev).manual_seed(S)
        bias = torch.rand(H, 2 * nb, device=dev, generator=g) * 4 - 2
        c.aux = {"bias": bias}

        def score(s, b, h, q, k):
            rel = k - q
            n = rel.abs()
            large = exact + sum((n >= e).to(torch.int64) for e in edges)
            bucket = torch.where(n < exact, n, large)
            return s + bias[h, torch.where(rel > 0, bucket + nb, bucket)]
        c.score_mod = score
    else:
        raise ValueError(f"unknown Lua example {script}")
    return c


def kept_fraction(case, B, S, dev="cuda"):
    """The exact fraction of (b, q, k) pairs the mask keeps (DESIGN §8), in row chunks."""
    if case.mask_mod is None:
        return 1.0
    bs = B if case.mask_uses_batch or case.aux else 1
    kept, rows = 0, max(1, (1 << 26) // (S * bs))
    k = torch.arange(S, device=dev).view(1, 1, S)
    b = torch.arange(bs, device=dev).view(bs, 1, 1)
    h = torch.zeros((), dtype=torch.int64, device=dev)
    for q0 in range(0, S, rows):
        q = torch.arange(q0, min(S, q0 + rows), device=dev).view(1, -1, 1)
        kept += int(case.mask_mod(b, h, q, k).expand(bs, q.shape[1], S).sum())
    return kept / (bs * S * S)


def dense_mask(case, S, dev="cuda"):
    """SDPA's boolean mask [1, 1, S, S] (True = attend), for batch-independent masks."""
    q = torch.arange(S, device=dev).view(S, 1)
    k = torch.arange(S, device=dev).view(1, S)
    z = torch.zeros((), dtype=torch.int64, device=dev)
    return case.mask_mod(z, z, q, k).view(1, 1, S, S)


def dense_bias(case, S, H, dtype, dev="cuda"):
    """SDPA's float bias [1, H, S, S]: the score mod's additive term, -inf where masked."""
    q = torch.arange(S, device=dev).view(1, S, 1)
    k = torch.arange(S, device=dev).view(1, 1, S)
    h = torch.arange(H, device=dev).view(H, 1, 1)
    bias = case.bias_fn(h, q, k).to(dtype)
    if case.mask_mod is not None:
        z = torch.zeros((), dtype=torch.int64, device=dev)
        bias = bias.masked_fill(~case.mask_mod(z, h, q, k), float("-inf"))
    return bias.unsqueeze(0)
