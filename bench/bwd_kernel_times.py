#!/usr/bin/env python3
"""kpt's backward, kernel by kernel: the GPU time of each of its kernels (CUPTI's durations,
through torch.profiler) for one call with the L2 cache flushed before it, the median over
--reps calls, in the default and the deterministic mode. For A/B work on the kernels: the sum
leaves out launch gaps and host time, and one library per process keeps builds apart. Beside it,
without the profiler: the wall time of a call (CUDA events around it, the L2 flush completed
first) and the host's time in the call (its submission), where a burst figure differs from the
kernels' sum.

    python3 bench/bwd_kernel_times.py --lib build-gpu/libkpt.so --cases full:16384,causal:4096

Cases are bench/cases.py's patterns with a length, made by bench.case_inputs (16k tokens per
case, B = 16k / S, H = 2048 / D); bf16, D = 128 by default. TFLOP/s: 2.5 times the forward's
FLOPs over the kernels' sum.
"""
import argparse
import os
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (setup_peers, case_inputs)
from bench import kpt  # noqa: E402


def inputs(name, S, D, dtype_name):
    """bench.case_inputs's case (16k tokens, H = 2048 / D), with lse, dout and the gradients."""
    case, B, q, k, v, o, _, fwd_flops = bench.case_inputs(name, S, D, dtype_name)
    do = torch.randn_like(q)
    lse = torch.empty(B, case.hq, S, device="cuda")
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    return case, (q, k, v, o, lse, do), grads, 2.5 * fwd_flops


def kernel_times(fn, flush, reps):
    """Per call: the sum of the GPU kernels' durations (us), each kernel's (by name, memsets
    included) and the span from the first one's start to the last one's end (the sum plus the
    gaps between them)."""
    totals, each, spans = [], {}, []
    for _ in range(reps):
        flush.zero_()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        totals.append(sum(e.time_range.end - e.time_range.start for e in ev))
        spans.append(max(e.time_range.end for e in ev) - min(e.time_range.start for e in ev))
        for e in ev:
            each.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
    return (statistics.median(totals), {n: statistics.median(t) for n, t in each.items()},
            statistics.median(spans))


def wall_times(fn, flush, reps, idle=0.0):
    """Per call, without the profiler: the CUDA events' time around it (the GPU's span plus any
    wait for the host's first launch) and the host's time in fn (its submission), us, medians.
    The L2 flush completes before each call, so the wait for the first launch shows whole; then
    the card idles `idle` seconds."""
    walls, hosts = [], []
    for _ in range(reps):
        flush.zero_()
        torch.cuda.synchronize()
        time.sleep(idle)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        e1.record()
        e1.synchronize()
        walls.append(e0.elapsed_time(e1) * 1e3)
        hosts.append((t1 - t0) * 1e6)
    return statistics.median(walls), statistics.median(hosts)


def measure(ctx, flush, name, S, D, dtype_name, reps, with_daux=False, idle=0.0):
    """The case's backward in the default and the deterministic mode: for each, a dict of its
    kernels' sum (us, TFLOP/s), each kernel's median (us, by name), the span and, without the
    profiler, the wall and host times (us), as the functions above measure them."""
    stream = torch.cuda.current_stream().cuda_stream
    case, (q, k, v, o, lse, do), (dq, dk, dv), flops = inputs(name, S, D, dtype_name)
    pat = case.pattern(kpt)
    fk = ctx.kernel(pat, dtype_name, D)
    bk = ctx.kernel(pat, dtype_name, D, backward=True)
    sc, aux = case.scalars, case.aux
    daux = {n: torch.zeros(t.shape, dtype=torch.float32, device="cuda")
            for n, t in (aux or {}).items() if t.is_floating_point()} if with_daux else None
    maps = [kk.blockmap(q, k, v, o, scalars=sc, aux=aux, stream=stream)
            if kk.needs_blockmap else None for kk in (fk, bk)]
    ws = torch.empty(bk.workspace_bytes(q, k, v, o, lse, do, dq, dk, dv, scalars=sc, aux=aux,
                                        daux=daux),
                     dtype=torch.uint8, device="cuda")
    fk(q, k, v, o, lse=lse, scalars=sc, aux=aux, blockmap=maps[0], stream=stream)

    def runner(det):
        return lambda: bk.backward(q, k, v, o, lse, do, dq, dk, dv, scalars=sc, aux=aux,
                                   daux=daux, blockmap=maps[1], workspace=ws, stream=stream,
                                   deterministic=det)
    # The wall and host times of both modes before the profiler's runs: measured right after
    # them, a backward call's submission read 163-221 us (full and causal at 16k, H200,
    # 2026-11-29) where it takes 36-77 without the profiler just before.
    walls = {}
    for det in (False, True):
        run = runner(det)
        run()
        run()
        torch.cuda.synchronize()
        walls[det] = wall_times(run, flush, reps, idle)
    out = []
    for det in (False, True):
        total, each, span = kernel_times(runner(det), flush, reps)
        wall, host = walls[det]
        out.append({"deterministic": det, "us": total, "tflops": flops / total / 1e6,
                    "kernels": {n.split("(")[0]: t for n, t in each.items()}, "span": span,
                    "wall": wall, "host": host})
    return out


def parse_cases(text):
    """[(pattern, S)] from "full:16384,causal:4096"; ValueError naming the bad entry."""
    out = []
    for spec in text.split(","):
        name, _, S = spec.rpartition(":")
        if not name or not S.isdigit() or int(S) < 1:
            raise ValueError(f"--cases: '{spec}' is not PATTERN:LENGTH (as full:16384)")
        out.append((name, int(S)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True)
    ap.add_argument("--cases", default="full:16384,causal:4096")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--daux", action="store_true",
                    help="ask for the gradients of the case's float aux tensors too")
    ap.add_argument("--idle", type=float, default=0.0,
                    help="seconds the card idles before each wall-clock call (the power "
                         "limiter's budget refills; docs/BENCHMARKS.md, \"the deterministic "
                         "mode's ratio by the wall clock\")")
    args = ap.parse_args()
    try:
        todo = parse_cases(args.cases)
    except ValueError as e:
        ap.error(str(e))
    bench.setup_peers(args.lib)
    flush = torch.empty(128 << 20, dtype=torch.int32, device="cuda")
    with kpt.Context(backend="cuda") as ctx:
        for name, S in todo:
            parts = []
            for m in measure(ctx, flush, name, S, args.dim, args.dtype, args.reps, args.daux,
                             args.idle):
                kernels = " ".join(f"{n[:16]} {t:.0f}" for n, t in m["kernels"].items())
                parts.append(f"{'det.' if m['deterministic'] else 'default'} {m['us']:8.1f} us "
                             f"{m['tflops']:4.0f} TF/s, span {m['span']:.1f} us, wall "
                             f"{m['wall']:.1f} us, host {m['host']:.0f} us ({kernels})")
            print(f"{name:14s} S={S:6d} | " + " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
