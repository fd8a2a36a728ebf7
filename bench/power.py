#!/usr/bin/env python3
"""Sustained runs at the power limit, with the card's SM clock and board power: kpt's forward
and backward beside cuDNN's (SDPA), each run back to back for --seconds while nvidia-smi
samples the clock and the power every 100 ms. Where the card sits at its power limit, a call's
time is its energy over that limit, so energy a call says more than TFLOP/s alone about what a
kernel spends besides its tensor cores' cycles.

    python3 bench/power.py --lib build-gpu/libkpt.so --cases causal,full --seconds 4

Per implementation and case: µs a call (CUDA events over the whole run), TFLOP/s (forward
4·B·Hq·S·S·D times the kept fraction, backward 2.5 times that), the mean SM clock and power
of the samples after the first second of the run, and joules a call (mean power times the
time a call). Cases are bench/cases.py's that SDPA runs without a mask (full, causal,
gqa_causal), made by bench.case_inputs (16k tokens, B = 16k / S, H = 2048 / D), bf16; --seq
sets S (16384). kpt's gradients are compared with cuDNN's first.
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (setup_peers, case_inputs, sdpa_peers, max_rel, lib_digest)
from bench import kpt  # noqa: E402

SETTLE_S = 1.0  # samples of a run's first second are left out: the clock is still falling


class Sampler:
    """nvidia-smi sampling the SM clock and the power every 100 ms until stop()."""

    def __init__(self):
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw",
             "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def stop(self):
        """[(epoch seconds, MHz, W)] of every sample."""
        self.proc.terminate()
        out = []
        for line in self.proc.communicate()[0].splitlines():
            f = [x.strip() for x in line.split(",")]
            try:  # nvidia-smi's timestamps are local time, as time.time()'s reading of them
                t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                out.append((t, float(f[1]), float(f[2])))
            except (ValueError, IndexError):
                pass
        return out


def sustained(fn, seconds):
    """(start, end, ms a call) of fn run back to back for about `seconds`."""
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start, n = time.time(), 0
    e0.record()
    while time.time() - start < seconds:
        for _ in range(10):
            fn()
        n += 10
        torch.cuda.synchronize()
    e1.record()
    e1.synchronize()
    return start, time.time(), e0.elapsed_time(e1) / n


def run_case(name, S, seconds):
    """[(label, flops, (start, end, ms))] of kpt's and cuDNN's forward and backward."""
    with kpt.Context(backend="cuda") as ctx:
        return run_in(ctx, name, S, seconds)


def run_in(ctx, name, S, seconds):
    """run_case's work in the context ctx."""
    D = 128
    case, _, q, k, v, o, _, flops = bench.case_inputs(name, S, D, "bf16")
    if case.sdpa not in ("plain", "causal"):
        raise SystemExit(f"power.py: '{name}' needs a mask SDPA does not run fused "
                         "(full, causal or gqa_causal)")
    stream = torch.cuda.current_stream().cuda_stream
    dout = torch.randn_like(q)
    lse = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    pat = case.pattern(kpt)
    fk, bk = ctx.kernel(pat, "bf16", D), ctx.kernel(pat, "bf16", D, backward=True)
    ws = torch.empty(bk.workspace_bytes(q, k, v, o, lse, dout, dq, dk, dv), dtype=torch.uint8,
                     device="cuda")
    kpt_fwd = lambda: fk(q, k, v, o, lse=lse, stream=stream)
    kpt_bwd = lambda: bk.backward(q, k, v, o, lse, dout, dq, dk, dv, workspace=ws, stream=stream)
    kpt_fwd()
    kpt_bwd()
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    cudnn = bench.sdpa_peers(case, qg, kg, vg, S, case.hq, torch.bfloat16)["cudnn"]
    out = cudnn()
    grads = torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)
    torch.cuda.synchronize()
    err = max(bench.max_rel(a, b) for a, b in zip((dq, dk, dv), grads))
    if not err <= bench.AGREE["bf16"]:
        raise SystemExit(f"power.py: {name}: kpt's gradients differ from cuDNN's ({err:.1e})")
    with torch.no_grad():
        cudnn_fwd = bench.sdpa_peers(case, q, k, v, S, case.hq, torch.bfloat16)["cudnn"]
        runs = [("kpt fwd", flops, sustained(kpt_fwd, seconds)),
                ("cuDNN fwd", flops, sustained(cudnn_fwd, seconds))]
    runs += [("kpt bwd", 2.5 * flops, sustained(kpt_bwd, seconds)),
             ("cuDNN bwd", 2.5 * flops,
              sustained(lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True),
                        seconds))]
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib")
    ap.add_argument("--cases", default="causal,full")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--seconds", type=float, default=4.0, help="a run's length (past 1 s)")
    args = ap.parse_args()
    if args.seconds <= SETTLE_S + 0.5:
        ap.error(f"--seconds: give more than {SETTLE_S + 0.5} (the first {SETTLE_S} s is left out)")
    bench.setup_peers(args.lib)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}, kpt {os.environ.get('KPT_COMMIT', '?')} "
          f"({bench.lib_digest(args.lib)})", flush=True)
    sampler = Sampler()
    results = [(name, run) for name in args.cases.split(",") if name
               for run in run_case(name, args.seq, args.seconds)]
    time.sleep(0.3)
    samples = sampler.stop()
    print("| case | implementation | µs a call | TFLOP/s | SM MHz | W | J a call |")
    print("|---|---|---|---|---|---|---|")
    for name, (label, flops, (start, end, ms)) in results:
        s = [x for x in samples if start + SETTLE_S <= x[0] <= end]
        mhz = statistics.mean(x[1] for x in s) if s else float("nan")
        watts = statistics.mean(x[2] for x in s) if s else float("nan")
        print(f"| {name} {args.seq} | {label} | {ms * 1e3:.0f} | {flops / ms / 1e9:.0f} | "
              f"{mhz:.0f} | {watts:.0f} | {watts * ms / 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
