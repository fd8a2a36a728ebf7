"""The ctypes layer of the kpt package: libkpt's public C API (include/kpt/*.h), one class per
handle. kpt.attention (kpt/__init__.py) is built on it; it stays usable on its own.

It needs nothing but the standard library. Tensors are passed as anything with a device (or host)
address, a dtype, a shape and element strides: torch tensors work as they are (see `view`), and
`Tensor` describes raw memory. Launches go on the stream you give (for torch, its current stream),
so kpt kernels order with the rest of your work without any synchronisation.

    import kpt, torch
    ctx = kpt.Context()                                    # the first GPU, default disk cache
    pat = kpt.Pattern("sliding_window($w)+softcap(30)")    # or kpt.Pattern.from_lua_file(...)
    ker = ctx.kernel(pat, "bf16", head_dim=128)            # compiled once, then cached
    ker(q, k, v, o, scalars={"w": 1024}, stream=torch.cuda.current_stream().cuda_stream)

Errors raise kpt.Error with kpt's message (pattern, line and column for pattern text).
The library is found through $KPT_LIB, else beside this file (an installed wheel), else by the
loader's usual search for libkpt.so.0.
"""
import ctypes
import os
import struct
import weakref

# ---- the C ABI: mirrors of include/kpt/*.h --------------------------------------------------

DTYPES = {"f16": 1, "bf16": 2, "f32": 3, "f64": 4, "i32": 5, "bool": 6}
# torch's dtype names, so torch tensors can be passed without importing torch here
_TORCH_DTYPES = {"torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32",
                 "torch.float64": "f64", "torch.int32": "i32", "torch.bool": "bool"}
BACKENDS = {"auto": 0, "cuda": 1, "hip": 2, "vulkan": 3, "cpu": 4}
NO_DISK_CACHE, OFFLINE = 1, 2


class _Diag(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int), ("line", ctypes.c_int), ("column", ctypes.c_int),
                ("message", ctypes.c_char * 1024)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("shape", ctypes.c_int64 * 4), ("stride", ctypes.c_int64 * 4)]


class _ScalarValue(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_double)]


class _AuxTensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("tensor", _Tensor)]


class _Args(ctypes.Structure):
    _fields_ = [("q", _Tensor), ("k", _Tensor), ("v", _Tensor), ("o", _Tensor), ("lse", _Tensor),
                ("scale", ctypes.c_double),
                ("scalars", ctypes.POINTER(_ScalarValue)), ("num_scalars", ctypes.c_int),
                ("aux", ctypes.POINTER(_AuxTensor)), ("num_aux", ctypes.c_int),
                ("sinks", _Tensor)]


_LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


class _Grads(ctypes.Structure):
    _fields_ = [("dout", _Tensor), ("dq", _Tensor), ("dk", _Tensor), ("dv", _Tensor),
                ("daux", ctypes.POINTER(_AuxTensor)), ("num_daux", ctypes.c_int),
                ("dsinks", _Tensor), ("deterministic", ctypes.c_int)]


class _PagedArgs(ctypes.Structure):
    _fields_ = [("q", _Tensor), ("o", _Tensor), ("lse", _Tensor), ("k", _Tensor), ("v", _Tensor),
                ("page_table", _Tensor), ("cu_seqlens_q", _Tensor), ("kv_lens", _Tensor),
                ("sinks", _Tensor), ("scale", ctypes.c_double),
                ("scalars", ctypes.POINTER(_ScalarValue)), ("num_scalars", ctypes.c_int),
                ("aux", ctypes.POINTER(_AuxTensor)), ("num_aux", ctypes.c_int)]


class _PagedShape(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int), ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int32)),
                ("kv_lens", ctypes.POINTER(ctypes.c_int32)), ("max_q", ctypes.c_int),
                ("max_kv", ctypes.c_int), ("num_heads_q", ctypes.c_int),
                ("num_heads_kv", ctypes.c_int)]


class _PagedPlan(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int), ("num_heads_q", ctypes.c_int),
                ("num_heads_kv", ctypes.c_int), ("max_q", ctypes.c_int), ("max_kv", ctypes.c_int),
                ("splits", ctypes.c_int), ("q_per_block", ctypes.c_int),
                ("q_blocks", ctypes.c_int), ("blocks", ctypes.c_int),
                ("max_tokens", ctypes.c_int), ("rows", ctypes.c_int),
                ("workspace_bytes", ctypes.c_size_t)]


class _ContextParams(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("device", ctypes.c_int),
                ("target", ctypes.c_char_p), ("cache_dir", ctypes.c_char_p),
                ("cache_max_bytes", ctypes.c_uint64), ("flags", ctypes.c_uint),
                ("log", _LOG_FN), ("log_user", ctypes.c_void_p), ("log_level", ctypes.c_int)]


class _KernelDesc(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("head_dim", ctypes.c_int), ("head_dim_v", ctypes.c_int),
                ("num_heads_q", ctypes.c_int), ("num_heads_kv", ctypes.c_int),
                ("options", ctypes.c_uint)]


class _KernelInfo(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("target", ctypes.c_char_p), ("desc", _KernelDesc),
                ("tile_q", ctypes.c_int), ("tile_kv", ctypes.c_int),
                ("shared_bytes", ctypes.c_size_t), ("source", ctypes.c_char_p)]


class _Stats(ctypes.Structure):
    _fields_ = [("requests", ctypes.c_uint64), ("memory_hits", ctypes.c_uint64),
                ("bundle_hits", ctypes.c_uint64), ("disk_hits", ctypes.c_uint64),
                ("compiles", ctypes.c_uint64), ("failures", ctypes.c_uint64),
                ("compile_ms_total", ctypes.c_double), ("compile_ms_max", ctypes.c_double),
                ("hit_rate", ctypes.c_double)]


class _ParamValue(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_double)]


class _LuaParams(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("params", ctypes.POINTER(_ParamValue)),
                ("num_params", ctypes.c_int), ("max_memory", ctypes.c_size_t),
                ("max_instructions", ctypes.c_uint64),
                ("print", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)),
                ("print_user", ctypes.c_void_p), ("max_seconds", ctypes.c_double)]


class _AuxInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("dims", ctypes.c_int64 * 4)]


class _ScalarInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("has_default", ctypes.c_int),
                ("default_value", ctypes.c_double)]


_P, _PP, _D = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_Diag)
_SIGNATURES = {
    "kpt_pattern_parse": ([ctypes.c_char_p, _PP, _D], ctypes.c_int),
    "kpt_pattern_from_lua": ([ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_LuaParams), _PP,
                              _D], ctypes.c_int),
    "kpt_pattern_from_lua_file": ([ctypes.c_char_p, ctypes.POINTER(_LuaParams), _PP, _D],
                                  ctypes.c_int),
    "kpt_pattern_destroy": ([_PP], None),
    "kpt_pattern_name": ([_P], ctypes.c_char_p),
    "kpt_pattern_scalar_count": ([_P], ctypes.c_int),
    "kpt_pattern_scalar_info": ([_P, ctypes.c_int, ctypes.POINTER(_ScalarInfo)], ctypes.c_int),
    "kpt_pattern_aux_count": ([_P], ctypes.c_int),
    "kpt_pattern_aux_info": ([_P, ctypes.c_int, ctypes.POINTER(_AuxInfo)], ctypes.c_int),
    "kpt_context_create": ([ctypes.POINTER(_ContextParams), _PP, _D], ctypes.c_int),
    "kpt_context_destroy": ([_PP], None),
    "kpt_context_target": ([_P], ctypes.c_char_p),
    "kpt_context_device_name": ([_P], ctypes.c_char_p),
    "kpt_context_get_stats": ([_P, ctypes.POINTER(_Stats)], ctypes.c_int),
    "kpt_context_load_bundle": ([_P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), _D],
                                ctypes.c_int),
    "kpt_context_synchronize": ([_P, _D], ctypes.c_int),
    "kpt_kernel_get": ([_P, _P, ctypes.POINTER(_KernelDesc), _PP, _D], ctypes.c_int),
    "kpt_kernel_get_info": ([_P, ctypes.POINTER(_KernelInfo)], ctypes.c_int),
    "kpt_kernel_needs_blockmap": ([_P], ctypes.c_int),
    "kpt_kernel_launch": ([_P, ctypes.POINTER(_Args), _P, _P, _D], ctypes.c_int),
    "kpt_kernel_backward_workspace": ([_P, ctypes.POINTER(_Args), ctypes.POINTER(_Grads),
                                       ctypes.POINTER(ctypes.c_size_t), _D], ctypes.c_int),
    "kpt_kernel_launch_backward": ([_P, ctypes.POINTER(_Args), ctypes.POINTER(_Grads), _P, _P,
                                    ctypes.c_size_t, _P, _D], ctypes.c_int),
    "kpt_blockmap_create": ([_P, ctypes.POINTER(_Args), _P, _PP, _D], ctypes.c_int),
    "kpt_blockmap_update": ([_P, ctypes.POINTER(_Args), _P, _D], ctypes.c_int),
    "kpt_blockmap_destroy": ([_PP], None),
    "kpt_paged_plan_make": ([_P, ctypes.POINTER(_PagedShape), ctypes.POINTER(_PagedPlan), _D],
                            ctypes.c_int),
    "kpt_paged_run": ([_P, ctypes.POINTER(_PagedPlan), ctypes.POINTER(_PagedArgs), _P,
                       ctypes.c_size_t, _P, _D], ctypes.c_int),
}
PAGED = 2  # kpt_kernel_desc option KPT_DESC_PAGED

_lib = None


def _default_path():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libkpt.so")
    return os.environ.get("KPT_LIB") or (here if os.path.exists(here) else "libkpt.so.0")


def library(path=None):
    """Loads libkpt (once): `path`, else $KPT_LIB, else the copy installed beside this package,
    else the loader's search for libkpt.so.0."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(path or _default_path())
        for name, (argtypes, restype) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, restype
        _lib = lib
    return _lib


class Error(Exception):
    """A kpt call failed: `status` is the kpt_status, `line`/`column` locate pattern text."""

    def __init__(self, diag, what):
        self.status, self.line, self.column = diag.status, diag.line, diag.column
        super().__init__(f"{what}: {diag.message.decode(errors='replace')}")


def _check(rc, diag, what):
    if rc != 0:
        raise Error(diag, what)


def _invalid(what, message):
    """An Error of status KPT_ERR_INVALID_ARGUMENT raised here, not by the library."""
    diag = _Diag()
    diag.status, diag.message = -1, message.encode()[:1023]
    return Error(diag, what)


# ---- tensors --------------------------------------------------------------------------------

class Tensor:
    """Raw memory described for kpt: an address, a dtype name ("bf16", "i32", ...), a shape and
    element strides (contiguous when omitted)."""

    def __init__(self, address, dtype, shape, strides=None):
        if strides is None:
            strides, acc = [], 1
            for n in reversed(shape):
                strides.insert(0, acc)
                acc *= n
        self.address, self.dtype = int(address), dtype
        self.shape, self.strides = tuple(shape), tuple(strides)


def view(t):
    """A Tensor for `t`: a Tensor, or a torch tensor (any object with data_ptr(), dtype, shape
    and stride())."""
    if isinstance(t, Tensor):
        return t
    dtype = _TORCH_DTYPES.get(str(t.dtype))
    if dtype is None:
        raise TypeError(f"kpt: unsupported tensor dtype {t.dtype}")
    return Tensor(t.data_ptr(), dtype, tuple(t.shape), tuple(t.stride()))


# kpt_tensor's bytes, packed in one step: a ctypes constructor with its two arrays took twice as
# long, and every tensor of every call goes through here (nine for a serving run)
_TENSOR_BYTES = struct.Struct("@Pii4q4q")
_NO_DIMS = (0, 0, 0, 0)
assert _TENSOR_BYTES.size == ctypes.sizeof(_Tensor)


def _struct_like(fmt, ctype):
    """A struct.Struct of `fmt` padded to the size of `ctype` (struct adds no trailing padding)."""
    pad = ctypes.sizeof(ctype) - struct.calcsize(fmt)
    s = struct.Struct(fmt + f"{pad}x")
    assert pad >= 0 and s.size == ctypes.sizeof(ctype)
    return s


# kpt_paged_args and kpt_attention_args without scalars or aux, packed in one step: a serving
# step's call from Python spent more time building its arguments than libkpt spent checking
# them and launching
_PAGED_BYTES = _struct_like("@" + "Pii4q4q" * 9 + "dPiPi", _PagedArgs)
_ARGS_BYTES = _struct_like("@" + "Pii4q4q" * 5 + "dPiPi" + "Pii4q4q", _Args)


_NULL_FIELDS = (0, 0, 0) + (0,) * 8
_TORCH_CODES = {}  # torch dtype -> kpt_dtype code, filled from the dtype's name on first sight


def _torch_code(dtype):
    code = DTYPES.get(_TORCH_DTYPES.get(str(dtype)))
    if code is None:
        raise TypeError(f"kpt: unsupported tensor dtype {dtype}")
    _TORCH_CODES[dtype] = code
    return code


def _tensor_fields(t):
    """kpt_tensor's fields for t (None: no tensor) in _TENSOR_BYTES's order."""
    if t is None:
        return _NULL_FIELDS
    if isinstance(t, Tensor):
        address, code, shape, strides = t.address, DTYPES[t.dtype], t.shape, t.strides
    else:  # a torch tensor, read directly
        code = _TORCH_CODES.get(t.dtype) or _torch_code(t.dtype)
        address, shape, strides = t.data_ptr(), t.shape, t.stride()
    n = len(shape)
    if n > 4:
        raise ValueError("kpt: tensors have rank 4 at most")
    pad = _NO_DIMS[n:]
    return (address, code, n, *shape, *pad, *strides, *pad)


def _tensor(t):
    return _Tensor.from_buffer_copy(_TENSOR_BYTES.pack(*_tensor_fields(t)))


class _ArgsHolder:
    """kpt_attention_args and the arrays and strings it points to (kept alive together)."""

    def __init__(self, q, k, v, o, lse, scale, scalars, aux, sinks=None):
        if not scalars and not aux:  # the common call, in one step
            f = _tensor_fields
            self.scalars = self.aux = None
            self.args = _Args.from_buffer_copy(_ARGS_BYTES.pack(
                *f(q), *f(k), *f(v), *f(o), *f(lse), float(scale), 0, 0, 0, 0, *f(sinks)))
            return
        self.scalars = (_ScalarValue * max(1, len(scalars)))(
            *[_ScalarValue(n.encode(), float(x)) for n, x in scalars.items()])
        self.aux = (_AuxTensor * max(1, len(aux)))(
            *[_AuxTensor(n.encode(), _tensor(t)) for n, t in aux.items()])
        self.args = _Args(_tensor(q), _tensor(k), _tensor(v), _tensor(o), _tensor(lse),
                          float(scale), self.scalars, len(scalars), self.aux, len(aux),
                          _tensor(sinks))


# ---- patterns, contexts, kernels, block maps ------------------------------------------------

class Pattern:
    """A compiled attention pattern: a built-in pattern string, or a Lua script (from_lua_file)."""

    def __init__(self, text=None, _handle=None):
        lib = library()
        self._h = ctypes.c_void_p(_handle)
        if _handle is None:
            diag = _Diag()
            _check(lib.kpt_pattern_parse(text.encode(), ctypes.byref(self._h), diag), diag,
                   "pattern")

    @staticmethod
    def _lua_params(params, name):
        """kpt_lua_params for `params` ({"window": 256}) and `name` (ctypes keeps the params
        array alive with the struct)."""
        params = params or {}
        values = (_ParamValue * max(1, len(params)))(
            *[_ParamValue(n.encode(), float(x)) for n, x in params.items()])
        lp = _LuaParams(name=name.encode() if name else None, params=values,
                        num_params=len(params))
        return lp

    @classmethod
    def from_lua(cls, source, params=None, name=None):
        """Runs a Lua pattern script given as text; `params` overrides its params."""
        lib, diag, h = library(), _Diag(), ctypes.c_void_p()
        text = source.encode()
        _check(lib.kpt_pattern_from_lua(text, len(text), cls._lua_params(params, name),
                                        ctypes.byref(h), diag), diag, name or "script")
        return cls(_handle=h.value)

    @classmethod
    def from_lua_file(cls, path, params=None, name=None):
        """Runs a Lua pattern script; `params` overrides its params ({"window": 256})."""
        lib, diag, h = library(), _Diag(), ctypes.c_void_p()
        _check(lib.kpt_pattern_from_lua_file(os.fsencode(path), cls._lua_params(params, name),
                                             ctypes.byref(h), diag), diag, os.fspath(path))
        return cls(_handle=h.value)

    @property
    def name(self):
        return library().kpt_pattern_name(self._h).decode()

    def scalars(self):
        """{name: default or None} of the runtime scalars."""
        lib, out = library(), {}
        for i in range(lib.kpt_pattern_scalar_count(self._h)):
            info = _ScalarInfo()
            lib.kpt_pattern_scalar_info(self._h, i, info)
            out[info.name.decode()] = info.default_value if info.has_default else None
        return out

    def aux(self):
        """[(name, dtype name, rank)] of the aux tensors the pattern reads."""
        lib, out, names = library(), [], {v: k for k, v in DTYPES.items()}
        for i in range(lib.kpt_pattern_aux_count(self._h)):
            info = _AuxInfo()
            lib.kpt_pattern_aux_info(self._h, i, info)
            out.append((info.name.decode(), names.get(info.dtype, "?"), info.rank))
        return out

    def close(self):
        if self._h:
            library().kpt_pattern_destroy(ctypes.byref(self._h))

    def __del__(self):
        if _lib is not None:
            self.close()


class Context:
    """A kpt context: a backend on one device, and its kernel caches."""

    def __init__(self, backend="auto", device=0, target=None, cache_dir=None, flags=0):
        lib, diag = library(), _Diag()
        self._h = ctypes.c_void_p()
        self._params = _ContextParams(backend=BACKENDS[backend], device=device,
                                      target=target.encode() if target else None,
                                      cache_dir=os.fsencode(cache_dir) if cache_dir else None,
                                      flags=flags)
        _check(lib.kpt_context_create(self._params, ctypes.byref(self._h), diag), diag,
               "context")
        self._maps = weakref.WeakSet()  # live block maps: freed before the context

    @property
    def target(self):
        return library().kpt_context_target(self._h).decode()

    @property
    def device_name(self):
        return library().kpt_context_device_name(self._h).decode()

    def kernel(self, pattern, dtype, head_dim, head_dim_v=0, num_heads_q=0, num_heads_kv=0,
               backward=False, paged=False):
        """The kernel of `pattern` for one shape class (compiled now, or found in a cache);
        backward=True: the backward kernels (Kernel.backward); paged=True: the serving kernels
        (Kernel.paged_plan, Kernel.paged)."""
        diag, h = _Diag(), ctypes.c_void_p()
        desc = _KernelDesc(DTYPES[dtype], head_dim, head_dim_v, num_heads_q, num_heads_kv,
                           (1 if backward else 0) | (PAGED if paged else 0))
        _check(library().kpt_kernel_get(self._h, pattern._h, desc, ctypes.byref(h), diag), diag,
               pattern.name)
        return Kernel(self, h.value)

    def stats(self):
        s = _Stats()
        library().kpt_context_get_stats(self._h, s)
        return {name: getattr(s, name) for name, _ in _Stats._fields_}

    def load_bundle(self, path):
        diag, n = _Diag(), ctypes.c_int()
        _check(library().kpt_context_load_bundle(self._h, os.fsencode(path), ctypes.byref(n),
                                                 diag), diag, os.fspath(path))
        return n.value

    def synchronize(self):
        diag = _Diag()
        _check(library().kpt_context_synchronize(self._h, diag), diag, "synchronize")

    def close(self):
        """Frees the context, its kernels and its live block maps (no launch may be in flight);
        kernels and maps of a closed context raise kpt.Error when used."""
        if self._h:
            for m in list(self._maps):  # libkpt frees a map through its context
                m.close()
            library().kpt_context_destroy(ctypes.byref(self._h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if _lib is not None:
            self.close()


class Kernel:
    """A compiled kernel; it belongs to its context. Call it to launch."""

    def __init__(self, ctx, handle):
        self.ctx, self._h = ctx, ctypes.c_void_p(handle)

    def _handle(self, what):
        """The kernel's handle, while its context is open (libkpt frees kernels with it)."""
        if not self.ctx._h:
            raise _invalid(what, "the kernel's context is closed")
        return self._h

    @property
    def needs_blockmap(self):
        return bool(library().kpt_kernel_needs_blockmap(self._handle("kernel")))

    def info(self):
        i = _KernelInfo()
        library().kpt_kernel_get_info(self._handle("kernel"), i)
        return {"pattern": i.pattern.decode(), "target": i.target.decode(), "tile_q": i.tile_q,
                "tile_kv": i.tile_kv, "shared_bytes": i.shared_bytes, "source": i.source.decode()}

    def __call__(self, q, k, v, o, lse=None, scale=0.0, scalars=None, aux=None, blockmap=None,
                 stream=None, sinks=None):
        """o (and lse, when given) = attention(q, k, v) on `stream` (a CUstream as an int, or
        None for the default stream). Tensors are logically [B, H, S, D]; lse is [B, Hq, Sq];
        sinks [Hq] f32: each head's sink logit (docs/api.md, "Attention sinks")."""
        a = _ArgsHolder(q, k, v, o, lse, scale, scalars or {}, aux or {}, sinks)
        diag = _Diag()
        _check(library().kpt_kernel_launch(self._handle("launch"), a.args,
                                           _map_handle(blockmap, "launch"), stream, diag), diag,
               "launch")
        return o

    def _grads(self, dout, dq, dk, dv, daux, dsinks=None, deterministic=False):
        daux = daux or {}
        names = [n.encode() for n in daux]
        arr = (_AuxTensor * max(1, len(daux)))(
            *[_AuxTensor(n, _tensor(t)) for n, t in zip(names, daux.values())])
        g = _Grads(_tensor(dout), _tensor(dq), _tensor(dk), _tensor(dv), arr, len(daux),
                   _tensor(dsinks), int(bool(deterministic)))
        return g, (names, arr)

    def workspace_bytes(self, q, k, v, o, lse, dout, dq, dk, dv, scale=0.0, scalars=None,
                        aux=None, daux=None, sinks=None, dsinks=None, deterministic=False):
        """Bytes of workspace a backward call with these tensors needs."""
        a = _ArgsHolder(q, k, v, o, lse, scale, scalars or {}, aux or {}, sinks)
        g, keep = self._grads(dout, dq, dk, dv, daux, dsinks, deterministic)
        diag, n = _Diag(), ctypes.c_size_t()
        _check(library().kpt_kernel_backward_workspace(self._handle("backward workspace"), a.args,
                                                       g, ctypes.byref(n), diag),
               diag, "backward workspace")
        return n.value

    def backward(self, q, k, v, o, lse, dout, dq, dk, dv, scale=0.0, scalars=None, aux=None,
                 daux=None, blockmap=None, workspace=None, stream=None, sinks=None, dsinks=None,
                 deterministic=False):
        """dq, dk, dv (and daux: {aux name: f32 tensor}; dsinks [Hq] f32 with sinks) of a
        backward kernel from the forward's q, k, v, o, lse and dout. workspace: a tensor of at
        least workspace_bytes() bytes, or None for a temporary one. deterministic: the same
        bits every run (on CUDA sm_90a, dq summed in a fixed order; slower)."""
        a = _ArgsHolder(q, k, v, o, lse, scale, scalars or {}, aux or {}, sinks)
        g, keep = self._grads(dout, dq, dk, dv, daux, dsinks, deterministic)
        ws = workspace.data_ptr() if workspace is not None else None
        nbytes = workspace.numel() * workspace.element_size() if workspace is not None else 0
        diag = _Diag()
        _check(library().kpt_kernel_launch_backward(self._handle("backward"), a.args, g,
                                                    _map_handle(blockmap, "backward"), ws,
                                                    nbytes, stream, diag), diag, "backward")
        return dq, dk, dv

    def paged_plan(self, num_heads_q, num_heads_kv, cu_seqlens_q=None, kv_lens=None, batch=None,
                   max_q=0, max_kv=0):
        """A serving plan (include/kpt/serving.h) from the batch's lengths (host sequences of
        ints), or from bounds: batch, max_q and max_kv. Returns a PagedPlan."""
        if cu_seqlens_q is not None:
            batch = len(cu_seqlens_q) - 1
        cu = (ctypes.c_int32 * (batch + 1))(*cu_seqlens_q) if cu_seqlens_q is not None else None
        kv = (ctypes.c_int32 * max(1, batch))(*kv_lens) if kv_lens is not None else None
        shape = _PagedShape(batch, cu, kv, max_q, max_kv, num_heads_q, num_heads_kv)
        plan, diag = _PagedPlan(), _Diag()
        _check(library().kpt_paged_plan_make(self._handle("paged plan"), shape, plan, diag), diag,
               "paged plan")
        return PagedPlan(plan)

    def paged(self, plan, q, k, v, o, cu_seqlens_q, kv_lens, page_table=None, lse=None,
              sinks=None, scale=0.0, scalars=None, aux=None, workspace=None, stream=None):
        """A serving run: q [T, Hq, D], k and v caches [pages, page_size, Hkv, D] (any strides),
        o [T, Hq, Dv], i32 cu_seqlens_q [B + 1], kv_lens [B] and page_table [B, max_pages] on the
        device; lse [T, Hq] and sinks [Hq] f32, optional. workspace: a tensor of at least
        plan.workspace_bytes bytes, or None for a temporary one."""
        f = _tensor_fields
        if not scalars and not aux:  # the common call, in one step
            a = _PagedArgs.from_buffer_copy(_PAGED_BYTES.pack(
                *f(q), *f(o), *f(lse), *f(k), *f(v), *f(page_table), *f(cu_seqlens_q),
                *f(kv_lens), *f(sinks), float(scale), 0, 0, 0, 0))
        else:  # ctypes keeps the names' bytes and the arrays alive with the structure
            scalars, aux = scalars or {}, aux or {}
            sv = (_ScalarValue * max(1, len(scalars)))(
                *[_ScalarValue(n.encode(), float(x)) for n, x in scalars.items()])
            av = (_AuxTensor * max(1, len(aux)))(
                *[_AuxTensor(n.encode(), _tensor(t)) for n, t in aux.items()])
            tensors = (q, o, lse, k, v, page_table, cu_seqlens_q, kv_lens, sinks)
            a = _PagedArgs(*[_tensor(t) for t in tensors], float(scale), sv, len(scalars), av,
                           len(aux))
        ws = workspace.data_ptr() if workspace is not None else None
        nbytes = workspace.numel() * workspace.element_size() if workspace is not None else 0
        diag = _Diag()
        _check(library().kpt_paged_run(self._handle("paged"), plan._plan, a, ws, nbytes, stream,
                                       diag), diag, "paged")
        return o

    def blockmap(self, q, k, v, o, scalars=None, aux=None, stream=None):
        """A block map for these aux tensors, scalars and lengths, built on `stream`."""
        return BlockMap(self, _ArgsHolder(q, k, v, o, None, 0.0, scalars or {}, aux or {}),
                        stream)


class PagedPlan:
    """A serving plan: how a batch's lengths are scheduled (splits, blocks, workspace)."""

    def __init__(self, plan):
        self._plan = plan
        self.kernel = None

    def __getattr__(self, name):
        if name in dict(_PagedPlan._fields_):
            return getattr(self._plan, name)
        raise AttributeError(name)


def _map_handle(blockmap, what):
    """A block map's handle for a call (None: no map); a closed map raises."""
    if blockmap is None:
        return None
    if not blockmap._h:
        raise _invalid(what, "the block map is closed (closing its context closes it too)")
    return blockmap._h


class BlockMap:
    """Which tile pairs a data-dependent mask keeps; reuse it while its inputs stay the same.
    It belongs to its kernel's context: closing the context closes it."""

    def __init__(self, kernel, holder, stream):
        self.kernel, self._h, diag = kernel, ctypes.c_void_p(), _Diag()
        _check(library().kpt_blockmap_create(kernel._handle("blockmap"), holder.args, stream,
                                             ctypes.byref(self._h), diag), diag, "blockmap")
        kernel.ctx._maps.add(self)

    def update(self, q, k, v, o, scalars=None, aux=None, stream=None):
        """Rebuilds the map for new aux contents or scalars (same sizes)."""
        a, diag = _ArgsHolder(q, k, v, o, None, 0.0, scalars or {}, aux or {}), _Diag()
        _check(library().kpt_blockmap_update(_map_handle(self, "blockmap"), a.args, stream, diag),
               diag, "blockmap")

    def close(self):
        if self._h:
            library().kpt_blockmap_destroy(ctypes.byref(self._h))

    def __del__(self):
        if _lib is not None:
            self.close()
