"""kpt for torch tensors: the custom ops torch.ops.kpt.attention and kpt.attention_backward,
their fake (meta) implementations for torch.compile, and autograd through kpt's backward.

Patterns, params, scalars and aux tensors travel through the ops as strings (a list of names is
one string, names joined by newlines: schemas carry no lists of strings), lists of values and a
list of tensors. Launches go on
torch's current stream of the tensors' device; nothing allocates outside torch's allocator (the
backward's workspace is a torch tensor) and nothing synchronises, so CUDA graphs capture the ops.
Block maps of patterns that read aux tensors are built once per set of aux tensors and reused
while those tensors are alive and unmodified (torch's version counter), so build one outside a
capture by calling once before it.
"""
import threading
import weakref
from typing import List, Optional, Tuple

import torch

from . import _capi, _kernel_of, context, get_pattern
from . import _check_shapes

_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
_lock = threading.Lock()
_named_patterns = {}  # "kpt.Pattern#N" -> Pattern, for Pattern objects given to kpt.attention
_blockmaps = {}


def _pattern_key(pat):
    """The string that names a Pattern object inside the ops (pattern strings and scripts name
    themselves; a Pattern object costs torch.compile a graph break here)."""
    key = f"kpt.Pattern#{id(pat)}"
    with _lock:
        _named_patterns[key] = pat
    return key


def _names(joined):
    return joined.split("\n") if joined else []


def _resolve(pattern, pnames, pvalues):
    with _lock:
        pat = _named_patterns.get(pattern)
    params = dict(zip(_names(pnames), pvalues))
    return pat if pat is not None else get_pattern(pattern, params or None)


def _context_of(t):
    if t.device.type == "cuda":
        return context("cuda", t.device.index if t.device.index is not None else 0)
    if t.device.type == "cpu":
        return context("cpu")
    raise ValueError(f"kpt: tensors on {t.device} are not supported (cuda or cpu)")


def _kernel(q, pat, dv, backward=False):
    """The kernel of `pat` for q's device, dtype and head dims."""
    return _kernel_of(_context_of(q), pat, _DTYPES[q.dtype], q.shape[3], dv, backward=backward)


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.device.type == "cuda" else None


def _check(q, k, v, aux):
    _check_shapes(q, k, v)
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"kpt: q is on {q.device}, {name} on {t.device}")
        if t.dtype != q.dtype:
            raise TypeError(f"kpt: q is {q.dtype}, {name} is {t.dtype}; give one dtype")
    if q.dtype not in _DTYPES:
        raise TypeError(f"kpt: q, k and v must be float16, bfloat16 or float32, not {q.dtype}")
    for name, t in zip(*aux):
        if t.device != q.device:
            raise ValueError(f"kpt: aux '{name}' is on {t.device}, q on {q.device}")
    for name, t in [("q", q), ("k", k), ("v", v)] + list(zip(*aux)):
        if t.layout != torch.strided:
            raise ValueError(f"kpt: {name} must be a strided (dense) tensor, not {t.layout}")


def _blockmap(ker, q, k, v, o, scalars, aux, stream):
    """The kernel's block map for these aux tensors and scalars (built once, then reused while
    the same tensors live unmodified), or None when the kernel needs none."""
    if not ker.needs_blockmap:
        return None
    key = (ker._h.value, tuple(q.shape), tuple(k.shape), tuple(sorted(scalars.items())),
           tuple(sorted((n, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t._version)
                        for n, t in aux.items())))
    with _lock:
        hit = _blockmaps.get(key)
    if hit is not None and all(ref() is aux[n] for n, ref in hit[1].items()):
        return hit[0]
    bm = ker.blockmap(q, k, v, o, scalars=scalars, aux=aux, stream=stream)
    with _lock:
        if len(_blockmaps) > 256:
            _blockmaps.clear()
        _blockmaps[key] = (bm, {n: weakref.ref(t) for n, t in aux.items()})
    return bm


@torch.library.custom_op("kpt::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: str,
                 param_names: str, param_values: List[float], scalar_names: str,
                 scalar_values: List[float], aux_names: str, aux: List[torch.Tensor],
                 scale: float, sinks: Optional[torch.Tensor]
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    """o [B, Hq, Sq, Dv] and lse [B, Hq, Sq] (f32) of a kpt pattern; sinks [Hq] f32: each
    head's logit in the softmax denominator."""
    scalar_names, aux_names = _names(scalar_names), _names(aux_names)
    _check(q, k, v, (aux_names, aux))
    pat = _resolve(pattern, param_names, param_values)
    B, Hq, Sq, _ = q.shape
    o = torch.empty((B, Hq, Sq, v.shape[3]), device=q.device, dtype=q.dtype)
    lse = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    scalars, auxd = dict(zip(scalar_names, scalar_values)), dict(zip(aux_names, aux))
    ker = _kernel(q, pat, v.shape[3])
    stream = _stream(q)
    bm = _blockmap(ker, q, k, v, o, scalars, auxd, stream)
    ker(q, k, v, o, lse, scale=scale, scalars=scalars, aux=auxd, blockmap=bm, stream=stream,
        sinks=_sinks(sinks, q))
    return o, lse


def _sinks(sinks, q):
    """The sinks as kpt takes them: f32, on q's device, one per query head (or None)."""
    if sinks is None:
        return None
    if sinks.shape != (q.shape[1],):
        raise ValueError(f"kpt: sinks must have shape [Hq] = [{q.shape[1]}], not "
                         f"{tuple(sinks.shape)}")
    return sinks.detach().to(device=q.device, dtype=torch.float32)


@attention_op.register_fake
def _attention_fake(q, k, v, pattern, param_names, param_values, scalar_names, scalar_values,
                    aux_names, aux, scale, sinks):
    _resolve(pattern, param_names, param_values)  # a bad pattern fails when traced, not later
    _check_shapes(q, k, v)
    B, Hq, Sq, _ = q.shape
    return (q.new_empty((B, Hq, Sq, v.shape[3])),
            q.new_empty((B, Hq, Sq), dtype=torch.float32))


@torch.library.custom_op("kpt::attention_backward", mutates_args=())
def attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                          lse: torch.Tensor, dout: torch.Tensor, pattern: str,
                          param_names: str, param_values: List[float],
                          scalar_names: str, scalar_values: List[float],
                          aux_names: str, aux: List[torch.Tensor], aux_grads: List[bool],
                          scale: float, sinks: Optional[torch.Tensor],
                          sinks_grad: bool) -> List[torch.Tensor]:
    """[dq, dk, dv, dsinks (f32 [Hq] where sinks_grad, else empty), then per aux tensor its
    gradient where aux_grads flags it (f32, the aux tensor's shape) or an empty tensor]."""
    pat = _resolve(pattern, param_names, param_values)
    scalar_names, aux_names = _names(scalar_names), _names(aux_names)
    dout = dout if dout.dtype == q.dtype else dout.to(q.dtype)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    daux = {n: torch.empty(t.shape, device=q.device, dtype=torch.float32)
            for n, t, want in zip(aux_names, aux, aux_grads) if want}
    scalars, auxd = dict(zip(scalar_names, scalar_values)), dict(zip(aux_names, aux))
    ker = _kernel(q, pat, v.shape[3], backward=True)
    stream = _stream(q)
    bm = _blockmap(ker, q, k, v, o, scalars, auxd, stream)
    sk = _sinks(sinks, q)
    dsinks = (torch.empty(q.shape[1], device=q.device, dtype=torch.float32)
              if sinks_grad and sk is not None else None)
    # torch's switch decides: deterministic, kpt's sm_90a backward sums dq in a fixed order
    det = torch.are_deterministic_algorithms_enabled()
    nbytes = ker.workspace_bytes(q, k, v, o, lse, dout, dq, dk, dv, scale=scale, scalars=scalars,
                                 aux=auxd, daux=daux, sinks=sk, dsinks=dsinks, deterministic=det)
    ws = torch.empty(max(nbytes, 1), device=q.device, dtype=torch.uint8)
    ker.backward(q, k, v, o, lse, dout, dq, dk, dv, scale=scale, scalars=scalars, aux=auxd,
                 daux=daux, blockmap=bm, workspace=ws, stream=stream, sinks=sk, dsinks=dsinks,
                 deterministic=det)
    def empty():  # a fresh one each: a custom op's outputs may not alias each other
        return q.new_empty(0, dtype=torch.float32)
    return [dq, dk, dv, dsinks if dsinks is not None else empty()] + [
        daux[n] if n in daux else empty() for n in aux_names]


@attention_backward_op.register_fake
def _attention_backward_fake(q, k, v, o, lse, dout, pattern, param_names, param_values,
                             scalar_names, scalar_values, aux_names, aux, aux_grads, scale,
                             sinks, sinks_grad):
    ds = (q.shape[1],) if sinks is not None and sinks_grad else (0,)
    return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            q.new_empty(ds, dtype=torch.float32)] + [
        q.new_empty(t.shape if want else (0,), dtype=torch.float32)
        for t, want in zip(aux, aux_grads)]


def _setup_context(ctx, inputs, output):
    q, k, v, pattern, pn, pv, sn, sv, an, aux, scale, sinks = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)  # the gradient flows through o only
    ctx.has_sinks = sinks is not None
    ctx.sinks_grad = bool(sinks is not None and sinks.requires_grad)
    ctx.save_for_backward(q, k, v, o, lse, *(([sinks] if ctx.has_sinks else []) + list(aux)))
    ctx.meta = (pattern, pn, pv, sn, sv, an, scale)
    ctx.aux_grads = [bool(t.requires_grad and t.is_floating_point()) for t in aux]


def _backward(ctx, dout, dlse):
    q, k, v, o, lse, *rest = ctx.saved_tensors
    sinks, aux = (rest[0], rest[1:]) if ctx.has_sinks else (None, rest)
    pattern, pn, pv, sn, sv, an, scale = ctx.meta
    dq, dk, dv, dsinks, *daux = torch.ops.kpt.attention_backward(
        q, k, v, o, lse, dout, pattern, pn, pv, sn, sv, an, aux, ctx.aux_grads, scale, sinks,
        ctx.sinks_grad)
    daux = [g.to(t.dtype) if want else None for g, t, want in zip(daux, aux, ctx.aux_grads)]
    dsinks = dsinks.to(sinks.dtype) if ctx.sinks_grad else None
    # one entry per input, lists for list inputs (torch checks the structure)
    return (dq, dk, dv, None, None, [None] * len(pv), None, [None] * len(sv), None, daux, None,
            dsinks)


attention_op.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, pattern, params, scalars, aux, scale, return_lse, sinks=None):
    """kpt.attention on torch tensors, through the custom op."""
    if isinstance(pattern, _capi.Pattern):
        pattern = _pattern_key(pattern)
    elif not isinstance(pattern, str):
        raise TypeError(f"kpt: a pattern is a string or a kpt.Pattern, not "
                        f"{type(pattern).__name__}")
    names = list(aux)
    o, lse = torch.ops.kpt.attention(q, k, v, pattern, "\n".join(params),
                                     [float(x) for x in params.values()], "\n".join(scalars),
                                     [float(x) for x in scalars.values()], "\n".join(names),
                                     [aux[n] for n in names], float(scale or 0.0), sinks)
    return (o, lse) if return_lse else o
