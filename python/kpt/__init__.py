"""kpt: attention patterns compiled into fused attention kernels.

    import kpt
    o = kpt.attention(q, k, v, pattern="causal+softcap(30)")          # torch or numpy, [B, H, S, D]
    o = kpt.attention(q, k, v, pattern="sliding_window($w)", scalars={"w": 1024})
    o = kpt.attention(q, k, v, pattern="examples/patterns/gemma2.lua", params={"window": 512})

Tensors are [B, H, S, D] (as torch's scaled_dot_product_attention): q [B, Hq, Sq, Dqk], k
[B, Hkv, Skv, Dqk], v [B, Hkv, Skv, Dv], with Hq a multiple of Hkv (GQA); any strides. The dtype
and head dims come from the tensors. torch tensors on a CUDA device run on that device, on
torch's current stream; CPU tensors, numpy arrays and DLPack CPU arrays run on kpt's CPU backend
(the double-precision reference). The backend chosen is logged (logger "kpt", INFO) once per
context.

With torch, kpt.attention is a custom op (torch.ops.kpt.attention, registered when torch is
importable): torch.compile traces it without graph breaks, CUDA graphs capture it, and autograd
differentiates it through kpt's backward kernels: gradients for q, k, v and for float aux tensors
that require grad (learnable score-mod parameters).

The C API's handles are here too (Context, Pattern, Kernel, BlockMap: kpt._capi) for callers
that manage kernels themselves. Errors raise kpt.Error carrying kpt's message (pattern, line and
column, with a caret for pattern text).
"""
import logging
import os
import sys
import threading
from typing import Any, Dict, Mapping, Optional, Union

from ._capi import (BACKENDS, DTYPES, NO_DISK_CACHE, OFFLINE, BlockMap, Context, Error, Kernel,
                    Pattern, Tensor, library, view)

__all__ = ["attention", "paged_attention", "paged_plan", "get_pattern", "context", "Error", "Context", "Pattern", "Kernel",
           "BlockMap", "Tensor", "library", "view", "DTYPES", "BACKENDS", "NO_DISK_CACHE",
           "OFFLINE"]

log = logging.getLogger("kpt")
_lock = threading.Lock()
_patterns = {}
_contexts = {}


# ---- patterns and contexts, made once -----------------------------------------------------

def _params_key(params):
    return tuple(sorted((str(n), float(v)) for n, v in (params or {}).items()))


def get_pattern(spec: Union[str, Pattern],
                params: Optional[Mapping[str, float]] = None) -> Pattern:
    """The compiled pattern for `spec` (cached): a Pattern; a built-in pattern string
    ("document+causal"); a Lua script's path (ending in .lua); or a Lua script's text (anything
    containing "kpt.pattern"). `params` overrides a script's params."""
    if isinstance(spec, Pattern):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"kpt: a pattern is a string or a kpt.Pattern, not {type(spec).__name__}")
    key = (spec, _params_key(params))
    with _lock:
        p = _patterns.get(key)
        if p is None:
            if spec.endswith(".lua") and "\n" not in spec:
                p = Pattern.from_lua_file(spec, params=params)
            elif "kpt.pattern" in spec:
                p = Pattern.from_lua(spec, params=params, name="script")
            elif params:
                raise ValueError("kpt: params go with Lua scripts; a pattern string takes its "
                                 "values in the text, e.g. sliding_window(256)")
            else:
                p = Pattern(spec)
            _patterns[key] = p
    return p


_kernels = {}  # (context, pattern, dtype, head dims, kind) -> Kernel


def _kernel_of(ctx, pat, dtype, head_dim, head_dim_v=0, backward=False, paged=False):
    """ctx's kernel of `pat` for a dtype name and head dims, cached here: libkpt's own lookup
    prints the pattern's IR to make its key, a third of a small call's time in Python. A key
    holds the pattern itself, so no later pattern takes its place."""
    key = (ctx, pat, dtype, head_dim, head_dim_v, backward, paged)
    with _lock:
        ker = _kernels.get(key)
    if ker is None:
        ker = ctx.kernel(pat, dtype, head_dim, head_dim_v, backward=backward, paged=paged)
        with _lock:
            if len(_kernels) > 256:
                _kernels.clear()
            _kernels[key] = ker
    return ker


def context(backend: str = "auto", device: int = 0) -> Context:
    """The shared context of a backend and device (created once; kernels cached in it and on
    disk). backend: "cuda", "cpu", "hip", "vulkan" or "auto"."""
    if backend not in BACKENDS:
        raise ValueError(f"kpt: unknown backend '{backend}' ({', '.join(BACKENDS)})")
    key = (backend, device)
    with _lock:
        ctx = _contexts.get(key)
        if ctx is None:
            ctx = Context(backend=backend, device=device)
            _contexts[key] = ctx
            log.info("kpt: backend %s, device %d: %s (%s)", backend, device, ctx.device_name,
                     ctx.target)
    return ctx


# ---- arrays: torch, numpy, DLPack -----------------------------------------------------------

_NUMPY_DTYPES = {"float16": "f16", "float32": "f32", "float64": "f64", "int32": "i32",
                 "bool": "bool"}


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _as_numpy(x, what):
    """x as a numpy array (numpy arrays as they are; DLPack CPU arrays without a copy)."""
    import numpy as np
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    raise TypeError(f"kpt: {what} is a {type(x).__name__}; give torch tensors, numpy arrays or "
                    "DLPack arrays")


def _numpy_view(a, what):
    dtype = _NUMPY_DTYPES.get(str(a.dtype))
    if dtype is None:
        raise TypeError(f"kpt: {what} has dtype {a.dtype}; kpt takes float16, float32, int32 or "
                        "bool arrays (bfloat16 through torch)")
    strides = []
    for s in a.strides:
        if s % a.itemsize:
            raise ValueError(f"kpt: {what} has strides that are not whole elements")
        strides.append(s // a.itemsize)
    return Tensor(a.__array_interface__["data"][0], dtype, a.shape, strides)


def _check_shapes(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if len(t.shape) != 4:
            raise ValueError(f"kpt: {name} must be [B, H, S, D], got shape {tuple(t.shape)}")
    B, Hq, Sq, Dqk = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"kpt: batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"kpt: k {tuple(k.shape)} and v {tuple(v.shape)} differ in heads or "
                         "length")
    if k.shape[3] != Dqk:
        raise ValueError(f"kpt: q's head dim {Dqk} differs from k's {k.shape[3]}")
    if k.shape[1] == 0 or Hq % k.shape[1]:
        raise ValueError(f"kpt: q's {Hq} heads are not a multiple of k's {k.shape[1]} (GQA)")


def _scalars(scalars):
    return {str(n): float(v) for n, v in (scalars or {}).items()}


# ---- the numpy / CPU path ------------------------------------------------------------------

def _attention_numpy(q, k, v, pat, scalars, aux, scale, return_lse, sinks=None):
    import numpy as np
    q, k, v = (_as_numpy(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    _check_shapes(q, k, v)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"kpt: q, k and v have dtypes {q.dtype}, {k.dtype}, {v.dtype}; give one")
    dtype = _numpy_view(q, "q").dtype
    if dtype not in ("f16", "f32"):
        raise TypeError(f"kpt: the CPU backend takes float16 or float32 arrays, not {q.dtype}")
    B, Hq, Sq, _ = q.shape
    o = np.empty((B, Hq, Sq, v.shape[3]), dtype=q.dtype)
    lse = np.empty((B, Hq, Sq), dtype=np.float32)
    aux = {n: _as_numpy(t, f"aux '{n}'") for n, t in (aux or {}).items()}
    ker = context("cpu").kernel(pat, dtype, q.shape[3], v.shape[3])
    views = {n: _numpy_view(t, f"aux '{n}'") for n, t in aux.items()}
    sk = None if sinks is None else np.ascontiguousarray(_as_numpy(sinks, "sinks"), np.float32)
    ker(_numpy_view(q, "q"), _numpy_view(k, "k"), _numpy_view(v, "v"), _numpy_view(o, "o"),
        _numpy_view(lse, "lse"), scale=scale or 0.0, scalars=scalars, aux=views,
        sinks=None if sk is None else _numpy_view(sk, "sinks"))
    return (o, lse) if return_lse else o


# ---- the entry point -----------------------------------------------------------------------

def attention(q: Any, k: Any, v: Any, pattern: Union[str, Pattern] = "full", *,
              scalars: Optional[Mapping[str, float]] = None,
              aux: Optional[Dict[str, Any]] = None, scale: Optional[float] = None,
              params: Optional[Mapping[str, float]] = None, return_lse: bool = False,
              sinks: Any = None) -> Any:
    """softmax(score(scale * q k^T) masked) v for a kpt pattern.

    pattern: a built-in pattern string, a Lua script's path or text, or a kpt.Pattern.
    scalars: {name: value} for runtime scalars ($w); aux: {name: tensor} for aux tensors;
    scale: defaults to 1/sqrt(Dqk); params: a Lua script's params. Returns o [B, Hq, Sq, Dv]
    in q's dtype, and with return_lse=True also lse [B, Hq, Sq] (f32, natural log).
    sinks: [Hq] logits joining each row's softmax denominator (gpt-oss, StreamingLLM); on torch
    tensors learnable (their gradient flows through autograd)."""
    torch = sys.modules.get("torch")
    if _torch_impl is not None and torch is not None and isinstance(q, torch.Tensor):
        # the pattern is compiled inside the op, so torch.compile traces this without a break
        return _torch_impl.attention(q, k, v, pattern, dict(params or {}), _scalars(scalars),
                                     dict(aux or {}), scale, return_lse, sinks)
    pat = get_pattern(pattern, params)
    return _attention_numpy(q, k, v, pat, _scalars(scalars), dict(aux or {}), scale,
                            return_lse, sinks)


# ---- serving: ragged batches over a paged KV cache --------------------------------------------

def _dtype_name(x):
    if _is_torch(x):
        return view(x).dtype
    return _numpy_view(_as_numpy(x, "q"), "q").dtype


def paged_plan(pattern: Union[str, Pattern], dtype: str, head_dim: int, num_heads_q: int,
               num_heads_kv: int, *, cu_seqlens_q=None, kv_lens=None, batch: int = 0,
               max_q: int = 0, max_kv: int = 0, backend: str = "cuda",
               params: Optional[Mapping[str, float]] = None):
    """A serving plan (docs/serving.md) for a batch's lengths (host sequences of ints:
    cu_seqlens_q [B + 1], kv_lens [B]) or for bounds (batch, max_q, max_kv). Pass it to
    paged_attention to run without host synchronisation (for CUDA graphs, with a workspace of
    plan.workspace_bytes). Returns the plan; plan.kernel is its kernel."""
    ker = _kernel_of(context(backend), get_pattern(pattern, params), dtype, head_dim,
                     paged=True)
    cu = [int(x) for x in cu_seqlens_q] if cu_seqlens_q is not None else None
    kv = [int(x) for x in kv_lens] if kv_lens is not None else None
    plan = ker.paged_plan(num_heads_q, num_heads_kv, cu_seqlens_q=cu, kv_lens=kv,
                          batch=batch or (len(cu) - 1 if cu else 0), max_q=max_q, max_kv=max_kv)
    plan.kernel = ker
    return plan


def paged_attention(q: Any, k_cache: Any, v_cache: Any, cu_seqlens_q: Any, kv_lens: Any,
                    page_table: Any = None, pattern: Union[str, Pattern] = "causal", *,
                    sinks: Any = None, scalars: Optional[Mapping[str, float]] = None,
                    aux: Optional[Dict[str, Any]] = None, scale: Optional[float] = None,
                    params: Optional[Mapping[str, float]] = None, plan=None, workspace=None,
                    return_lse: bool = False, out: Any = None) -> Any:
    """Attention for a serving batch (docs/serving.md): q [T, Hq, D] holds every sequence's new
    queries one after another (cu_seqlens_q [B + 1], int32), which are the last positions of
    their sequences (kv_lens [B] keys each, int32); k_cache and v_cache are
    [pages, page_size, Hkv, D] with page_table [B, max_pages] (int32), or [B, S, Hkv, D] without
    one. sinks: [Hq] float32 logits joining each row's softmax denominator. torch CUDA tensors
    run on the GPU on the current stream; numpy arrays on the CPU reference. Without `plan` one
    is made from host copies of the lengths (a device synchronisation for torch tensors); give
    a plan (paged_plan) and a workspace (a uint8 tensor of plan.workspace_bytes) to run with no
    synchronisation and no allocation, as CUDA graphs need. Returns o [T, Hq, D] (and lse
    [T, Hq] float32 with return_lse)."""
    pat = get_pattern(pattern, params)
    torch = sys.modules.get("torch")
    on_torch = torch is not None and isinstance(q, torch.Tensor)
    conv = (lambda t, n: t) if on_torch else (lambda t, n: None if t is None else
                                             _numpy_view(_as_numpy(t, n), n))
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    if plan is None:
        plan = paged_plan(pat, _dtype_name(q), D, Hq, Hkv,
                          cu_seqlens_q=[int(x) for x in cu_seqlens_q],
                          kv_lens=[int(x) for x in kv_lens],
                          backend="cuda" if on_torch else "cpu")
    if out is None:
        if on_torch:
            out = torch.empty((T, Hq, v_cache.shape[3]), dtype=q.dtype, device=q.device)
        else:
            import numpy as np
            out = np.empty((T, Hq, v_cache.shape[3]), dtype=_as_numpy(q, "q").dtype)
    lse = None
    if return_lse:
        if on_torch:
            lse = torch.empty((T, Hq), dtype=torch.float32, device=q.device)
        else:
            import numpy as np
            lse = np.empty((T, Hq), dtype=np.float32)
    if on_torch and workspace is None and plan.workspace_bytes:
        workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=q.device)
    stream = torch.cuda.current_stream(q.device).cuda_stream if on_torch and q.is_cuda else None
    plan.kernel.paged(plan, conv(q, "q"), conv(k_cache, "k_cache"), conv(v_cache, "v_cache"),
                      conv(out, "out"), conv(cu_seqlens_q, "cu_seqlens_q"),
                      conv(kv_lens, "kv_lens"), page_table=conv(page_table, "page_table"),
                      lse=conv(lse, "lse"), sinks=conv(sinks, "sinks"), scale=scale or 0.0,
                      scalars=_scalars(scalars),
                      aux={n: conv(t, f"aux '{n}'") for n, t in (aux or {}).items()},
                      workspace=workspace, stream=stream)
    return (out, lse) if return_lse else out


_torch_impl = None


def _register_torch():
    """Registers torch.ops.kpt.* when torch is importable (not imported otherwise)."""
    global _torch_impl
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    from . import _torch
    _torch_impl = _torch


if os.environ.get("KPT_NO_TORCH") != "1":
    _register_torch()
