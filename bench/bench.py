#!/usr/bin/env python3
"""kpt against PyTorch SDPA (each backend forced) and FlexAttention, in one process, on the same
tensors. kpt is driven through its public C API (the kpt package's C layer, python/kpt/_capi.py, ctypes) on torch
tensors' device pointers and torch's current stream.

    python3 bench/bench.py --lib build-gpu/libkpt.so --json results.json [options]

For every case: kpt's output (poisoned with NaN first) is compared with every peer's (max
|a - b| / max |b|), then each is timed with CUDA events after warm-up, the median of --reps runs,
with the L2 cache flushed (a 512 MiB write) before every run (burst figures); with --sustain N
also the mean of N calls back to back (sustained figures: the card at its power limit, clocks
lower). TFLOP/s follow DESIGN.md §8:
4·B·Hq·S·S·D times the exact fraction of (b, q, k) pairs the mask keeps. Compilation is timed
per kernel (kpt cold, from the disk cache, from memory; FlexAttention's first call), and so are
block-map builds (kpt's and FlexAttention's create_block_mask).

The results go to --json after every case (a run cut short keeps what it measured); the table is
printed last. bench/report.py turns the JSON into docs/BENCHMARKS.md and its plots.
"""
import argparse
import concurrent.futures
import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

# "kpt cold" must be cold: on machines with the CUDA driver, NVRTC keeps what it compiled in the
# driver's compute cache (~/.nv/ComputeCache) and a second compile of the same kernel, even in
# another process, takes 30-50 ms; earlier runs (tests, other benchmarks) would fill it.
os.environ.setdefault("CUDA_CACHE_DISABLE", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import kpt  # noqa: E402
import cases  # noqa: E402

TOKENS = 16384
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
SDPA_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION}
AGREE = {"bf16": 2e-2, "f16": 5e-3}  # max relative difference accepted between kpt and a peer


# ---- timing ----------------------------------------------------------------------------------

class Timer:
    def __init__(self, reps, warmup):
        self.reps, self.warmup = reps, warmup
        self.flush = torch.empty(128 << 20, dtype=torch.int32, device="cuda")

    def __call__(self, fn, reps=None):
        """Median milliseconds of fn() on the current stream, L2 flushed before each run."""
        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps or self.reps):
            self.flush.zero_()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        return statistics.median(times)

    def sustained(self, fn, n):
        """Mean milliseconds of fn() over n calls back to back (no flush): the card then runs at
        its power limit, as in training or serving, and clocks drop."""
        fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(n):
            fn()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) / n

    def in_turns(self, fns, rounds, sustain):
        """Times of each of fns ({name: fn}): bursts (as __call__) and, where sustain, sustained
        runs of that many calls. Every fn takes its turn, round after round, each round in another
        order, and all the bursts come before the sustained runs (which heat the card), so clock
        drift spreads over all of them. Returns {name: (burst times, sustained times)}."""
        names = list(fns)
        times = {n: ([], []) for n in names}
        for kind in (0, 1) if sustain else (0,):
            for r in range(rounds if names else 0):
                for n in names[r % len(names):] + names[:r % len(names)]:
                    times[n][kind].append(self(fns[n]) if kind == 0 else
                                          self.sustained(fns[n], sustain))
        return times


def wall_ms(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, out


def max_rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


# ---- kpt kernels: compiled once per (pattern, dtype, D), with compile times recorded ----------

class Kernels:
    def __init__(self, cache_dir):
        self.cache_dir = cache_dir
        self.ctx = kpt.Context(backend="cuda", cache_dir=cache_dir)
        self.kernels, self.compile_rows = {}, []

    def get(self, case, dtype, D):
        key = (case.kernel_key, dtype, D)
        if key in self.kernels:
            return self.kernels[key]
        pat = case.pattern(kpt)
        before = self.ctx.stats()
        cold, ker = wall_ms(lambda: self.ctx.kernel(pat, dtype, D))
        after = self.ctx.stats()
        with kpt.Context(backend="cuda", cache_dir=self.cache_dir) as fresh:  # another process's view
            disk, _ = wall_ms(lambda: fresh.kernel(pat, dtype, D))
            disk_hit = fresh.stats()["disk_hits"] == 1
        memory, _ = wall_ms(lambda: self.ctx.kernel(pat, dtype, D))
        self.compile_rows.append({
            "pattern": case.name, "kpt": pat.name, "params": case.lua_params, "dtype": dtype, "D": D,
            "cold_ms": cold, "compiled": after["compiles"] - before["compiles"] == 1,
            "backend_compile_ms": after["compile_ms_total"] - before["compile_ms_total"],
            "disk_ms": disk, "disk_hit": disk_hit, "memory_ms": memory})
        self.kernels[key] = ker
        return ker

    def prebuild(self, todo):
        """Compiles the kernels of `todo` ([(case, dtype, D)]) at once, one thread each (the
        context is thread-safe and ctypes lets go of the GIL), instead of one by one as the
        cases come. Their compile times are not recorded per kernel: they share the CPU."""
        jobs = {}
        for case, dtype, D in todo:
            key = (case.kernel_key, dtype, D)
            if key not in self.kernels and key not in jobs:
                jobs[key] = (case.pattern(kpt), dtype, D)
        if not jobs:
            return None
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
            futures = {key: pool.submit(self.ctx.kernel, *job) for key, job in jobs.items()}
            for key, fut in futures.items():
                self.kernels[key] = fut.result()
        return {"kernels": len(jobs), "threads": os.cpu_count(),
                "wall_ms": (time.perf_counter() - t0) * 1e3}


# ---- one case --------------------------------------------------------------------------------

def sdpa_peers(case, q, k, v, S, H, dtype):
    """{name: callable} of the SDPA backends that can run this case."""
    peers, kw = {}, {}
    if case.hq != case.hkv:
        kw["enable_gqa"] = True
    if case.sdpa in ("plain", "causal"):
        kw["is_causal"] = case.sdpa == "causal"
        names = SDPA_BACKENDS
    elif case.sdpa == "mask" and S <= cases.DENSE_MASK_MAX_S:
        kw["attn_mask"] = cases.dense_mask(case, S)
        names = ("cudnn", "efficient")
    elif case.sdpa == "bias" and S <= cases.DENSE_BIAS_MAX_S:
        kw["attn_mask"] = cases.dense_bias(case, S, H, dtype)
        names = ("cudnn", "efficient")
    else:
        return peers
    for name in names:
        def run(be=SDPA_BACKENDS[name]):
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q, k, v, **kw)
        peers[name + ("+mask" if "attn_mask" in kw else "")] = run
    return peers


def case_inputs(name, S, D, dtype_name):
    """A case at 16k tokens (B = 16k / S) of a 2048-wide model (H = 2048 / D): the case, its
    batch rows, q, k, v (seeded by S and D), o poisoned with NaN, the kept fraction and the
    FLOPs (DESIGN §8)."""
    dtype = DTYPES[dtype_name]
    H = 2048 // D
    B = max(1, TOKENS // S)
    case = cases.make_case(name, B, S, H)
    torch.manual_seed(S * 131 + D)
    q = torch.randn(B, case.hq, S, D, device="cuda", dtype=dtype)
    k = torch.randn(B, case.hkv, S, D, device="cuda", dtype=dtype)
    v = torch.randn(B, case.hkv, S, D, device="cuda", dtype=dtype)
    o = torch.full_like(q, float("nan"))
    kept = cases.kept_fraction(case, B, S)
    return case, B, q, k, v, o, kept, 4.0 * B * case.hq * S * S * D * kept


def run_case(args, kernels, timer, flex, name, S, D, dtype_name):
    dtype = DTYPES[dtype_name]
    case, B, q, k, v, o, kept, flops = case_inputs(name, S, D, dtype_name)
    hq, hkv = case.hq, case.hkv
    row = {"pattern": name, "kpt": case.kpt, "S": S, "B": B, "Hq": hq, "Hkv": hkv, "D": D,
           "dtype": dtype_name, "kept": kept, "flops": flops}

    # kpt: the block map (when the pattern needs one) built once, as a caller reusing it would
    ker = kernels.get(case, dtype_name, D)
    stream = torch.cuda.current_stream().cuda_stream
    bm = None
    if ker.needs_blockmap:
        bm = ker.blockmap(q, k, v, o, scalars=case.scalars, aux=case.aux, stream=stream)
        row["kpt_blockmap_ms"] = timer(lambda: bm.update(q, k, v, o, scalars=case.scalars,
                                                         aux=case.aux, stream=stream))

    def run_kpt():
        return ker(q, k, v, o, scalars=case.scalars, aux=case.aux, blockmap=bm, stream=stream)
    run_kpt()
    torch.cuda.synchronize()
    row["kpt_nan"] = bool(torch.isnan(o).any())
    ref = o.clone()
    row["kpt_ms"] = timer(run_kpt)
    if args.sustain:
        row["kpt_sus_ms"] = timer.sustained(run_kpt, args.sustain)

    peers = sdpa_peers(case, q, k, v, S, hq, dtype) if not args.no_sdpa else {}
    bmask = None
    if case.mask_mod is not None:
        bB = B if case.mask_uses_batch else None
        row["flex_blockmask_first_ms"], bmask = wall_ms(
            lambda: create_block_mask(case.mask_mod, bB, None, S, S, device="cuda"))
        row["flex_blockmask_ms"] = statistics.median(
            wall_ms(lambda: create_block_mask(case.mask_mod, bB, None, S, S, device="cuda"))[0]
            for _ in range(5))
    gqa = hq != hkv

    def run_flex():
        return flex(q, k, v, score_mod=case.score_mod, block_mask=bmask, enable_gqa=gqa)
    row["flex_first_call_ms"], _ = wall_ms(run_flex)
    peers["flex"] = run_flex

    for pname, fn in peers.items():
        try:
            out = fn()
            row[pname + "_err"] = max_rel(ref, out)
            row[pname + "_ms"] = timer(fn)
            if args.sustain:
                row[pname + "_sus_ms"] = timer.sustained(fn, args.sustain)
        except Exception as e:  # a backend that refuses this case says why
            row[pname + "_error"] = str(e).strip().splitlines()[0][:160]
    row["peers"] = list(peers)
    for pname in ["kpt"] + list(peers):
        for kind in ["", "_sus"]:
            if pname + kind + "_ms" in row:
                row[pname + kind + "_tflops"] = flops / (row[pname + kind + "_ms"] * 1e-3) / 1e12
    bad = [p for p in peers if row.get(p + "_err", 0) > AGREE[dtype_name]]
    row["agree"] = not bad and not row["kpt_nan"]
    return row


# ---- output ----------------------------------------------------------------------------------

def fmt(x, spec=".0f"):
    return "-" if x is None else format(x, spec)


def best_sdpa(r):
    vals = [r[p + "_tflops"] for p in r["peers"] if p != "flex" and p + "_tflops" in r]
    return max(vals) if vals else None


def print_row(r):
    peers = "  ".join(f"{p} {r[p + '_tflops']:.0f} (x{r['kpt_tflops'] / r[p + '_tflops']:.2f}, "
                      f"err {r[p + '_err']:.1e})" for p in r["peers"] if p + "_tflops" in r)
    refused = [p for p in r["peers"] if p + "_error" in r]
    sus = "".join(f"  sustained: {p} {r[p + '_sus_tflops']:.0f}" for p in ["kpt"] + r["peers"]
                  if p + "_sus_tflops" in r)
    print(f"{r['dtype']} D={r['D']} {r['pattern']:20s} S={r['S']:6d} B={r['B']:3d} kept "
          f"{r['kept']:.3f}  kpt {r['kpt_tflops']:.0f} TFLOP/s ({r['kpt_ms']:.3f} ms)  {peers}{sus}"
          + (f"  refused: {','.join(refused)}" if refused else "")
          + ("" if r["agree"] else "  ** DISAGREE **"), flush=True)


def print_tables(results, compiles):
    groups = {}
    for r in results:
        groups.setdefault((r["dtype"], r["D"]), []).append(r)
    for (dt, D), rows in groups.items():
        print(f"\n{dt}, D={D} (TFLOP/s)\n| pattern | S | kpt | flash | cudnn | efficient | flex "
              "| kpt/flex | kpt/best SDPA |\n|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            g = lambda p: r.get(p + "_tflops", r.get(p + "+mask_tflops"))
            sd, fx = best_sdpa(r), r.get("flex_tflops")
            print(f"| {r['pattern']} | {r['S']} | {r['kpt_tflops']:.0f} | {fmt(g('flash'))} | "
                  f"{fmt(g('cudnn'))} | {fmt(g('efficient'))} | {fmt(fx)} | "
                  f"{fmt(fx and r['kpt_tflops'] / fx, '.2f')} | "
                  f"{fmt(sd and r['kpt_tflops'] / sd, '.2f')} |")
    print("\ncompile (ms) | pattern | dtype | D | kpt cold | kpt disk | kpt memory |")
    for c in compiles:
        print(f"| {c['pattern']} | {c['dtype']} | {c['D']} | {c['cold_ms']:.0f} | "
              f"{c['disk_ms']:.1f} | {c['memory_ms']:.3f} |")


def lib_digest(path):
    """The first 16 hex digits of the SHA-256 of the file at path, or None."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]
    except (OSError, TypeError):
        return None


def meta(args):
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception:
            return ""
    try:
        import triton
        triton_version = triton.__version__
    except Exception:
        triton_version = None
    props = torch.cuda.get_device_properties(0)
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": props.name, "sm": f"{props.major}{props.minor}",
            "driver": sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
            "sm_clock_mhz": sh(["nvidia-smi", "--query-gpu=clocks.max.sm",
                                "--format=csv,noheader,nounits"]),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "triton": triton_version,
            "python": platform.python_version(),
            "kpt_commit": os.environ.get("KPT_COMMIT") or sh(["git", "-C", HERE, "rev-parse",
                                                              "--short=12", "HEAD"]),
            # the library measured, exactly (the commit above is the checkout's, which need not
            # be the one the library was built from: set KPT_COMMIT then)
            "kpt_lib_sha256": lib_digest(getattr(args, "lib", None)),
            "command": (os.environ.get("KPT_BENCH_COMMAND") or " ".join(sys.argv)).strip(),
            "tokens": TOKENS, "reps": args.reps, "warmup": 2}


def setup_peers(lib):
    """Loads libkpt and readies the peers; returns the compiled flex_attention."""
    # SDPA explains at length why a forced backend refuses a case; the refusal is recorded
    warnings.filterwarnings("ignore", category=UserWarning)
    kpt.library(lib)
    # FlexAttention compiles per shape and mod; keep dynamo from giving up after 8 of them
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 1 << 16)
    return torch.compile(flex_attention, dynamic=False)


def ints(text):
    return [int(x) for x in text.split(",") if x]


def plan(args):
    """[(pattern, S, D, dtype)] in run order: the first dtype and head dim (the headline
    configuration) first, then the Lua examples at it, then the other dtypes and head dims."""
    combos = [(dt, D) for dt in args.dtypes.split(",") for D in ints(args.dims)]
    out = []
    for n, (dt, D) in enumerate(combos):
        seqs = ints(args.seqs if n == 0 else args.seqs_other)
        for p in args.patterns.split(",") if args.patterns else []:
            extra = ints(args.long_seqs) if p in cases.SPARSE and n == 0 else []
            out += [(p, S, D, dt) for S in seqs + extra]
        if n == 0:
            for p in args.lua.split(",") if args.lua else []:
                out += [("lua:" + p, S, D, dt) for S in ints(args.lua_seqs)]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", help="libkpt.so (default: $KPT_LIB, then the loader's search)")
    ap.add_argument("--json", help="write the results here (after every case)")
    ap.add_argument("--patterns", default=",".join(cases.BUILTIN))
    ap.add_argument("--lua", default=",".join(cases.LUA),
                    help="Lua examples, run at the first dtype and head dim ('' for none)")
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384",
                    help="S at the first dtype and head dim")
    ap.add_argument("--seqs-other", default="1024,4096,16384",
                    help="S at the other dtypes and head dims")
    ap.add_argument("--long-seqs", default="32768,65536",
                    help="extra S for the sparse patterns at the first dtype and head dim")
    ap.add_argument("--lua-seqs", default="4096,16384")
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--sustain", type=int, default=0,
                    help="also time N calls back to back (sustained figures; 0: burst only)")
    ap.add_argument("--no-sdpa", action="store_true", help="FlexAttention as the only peer")
    ap.add_argument("--time-limit", type=float, default=530,
                    help="seconds; cases left when it is reached are skipped (and listed)")
    args = ap.parse_args()
    t_start = time.time()
    flex = setup_peers(args.lib)
    timer = Timer(args.reps, warmup=2)
    info = meta(args)
    print(f"# {info['device']}, driver {info['driver']}, torch {info['torch']}, cuDNN "
          f"{info['cudnn']}, triton {info['triton']}, kpt {info['kpt_commit']}", flush=True)
    results, skipped, prebuilt = [], [], None

    def save():
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump({"meta": info, "results": results, "compile": kernels.compile_rows,
                           "prebuilt": prebuilt, "skipped": skipped,
                           "seconds": time.time() - t_start}, f, indent=1)
            os.replace(args.json + ".tmp", args.json)

    with tempfile.TemporaryDirectory(prefix="kpt-bench-cache-") as cache_dir:
        kernels = Kernels(cache_dir)
        todo = plan(args)
        # compile times are recorded one by one for the headline dtype and head dim; the other
        # combinations' kernels are compiled up front, in parallel
        first = todo[0][2:] if todo else None
        prebuilt = kernels.prebuild([(cases.make_case(p, max(1, TOKENS // S), S, 2048 // D), dt, D)
                                     for p, S, D, dt in todo if (D, dt) != first])
        if prebuilt:
            print(f"# {prebuilt['kernels']} more kernels compiled in parallel in "
                  f"{prebuilt['wall_ms']:.0f} ms on {prebuilt['threads']} threads", flush=True)
        for i, (p, S, D, dt) in enumerate(todo):
            if time.time() - t_start > args.time_limit:
                skipped = todo[i:]
                print(f"# time limit reached: {len(skipped)} cases skipped", flush=True)
                break
            try:
                r = run_case(args, kernels, timer, flex, p, S, D, dt)
                results.append(r)
                print_row(r)
            except Exception as e:
                results.append({"pattern": p, "S": S, "D": D, "dtype": dt, "error": str(e)[:300]})
                print(f"{dt} D={D} {p} S={S}: ERROR {e}", flush=True)
            torch.cuda.empty_cache()
            save()
        save()
        print_tables([r for r in results if "error" not in r], kernels.compile_rows)
        kernels.ctx.close()
    print(f"# {len(results)} cases in {time.time() - t_start:.0f} s"
          + (f", {len(skipped)} skipped" if skipped else ""))


if __name__ == "__main__":
    main()
