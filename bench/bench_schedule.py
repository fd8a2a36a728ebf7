#!/usr/bin/env python3
"""kpt's sm_90a forward under its two grid schedules — one CTA per work item, and the persistent
grid (one CTA per SM walking the items) — and the runtime's choice between them, in one process on
the same tensors, with SDPA's cuDNN and FLASH beside them where they run the case.

The schedule is read from KPT_CUDA_PERSISTENT at each launch (runtime/cuda_device.c,
forward_ctas): 0 one CTA per item, 1 persistent, unset the runtime's choice. Each variant's output
is compared with the first's (they compute the same thing with the same kernel) and with cuDNN's;
the variants and peers take turns over --rounds rounds and each figure is the median.

With --tall the variants are instead the q tile heights of masked head-dim-64 kernels, read from
KPT_CUDA_TALL (runtime/forward_grid.h): "128 rows" (0), "192 rows" (1, the tall variant where the
plan has one) and the runtime's choice, each with the runtime's grid.

  python3 bench/bench_schedule.py --lib build-gpu/libkpt.so \\
      --patterns full,causal,gqa_causal --seqs 1024,2048,4096,16384 --sustain 30
"""

import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (the timer, kernels, peers and cases of the main benchmark)

import torch  # noqa: E402

SCHEDULES = {"per-item": "0", "persistent": "1", "auto": None}
HEIGHTS = {"128 rows": "0", "192 rows": "1", "auto": None}
VARIANTS = SCHEDULES
VARIABLE = "KPT_CUDA_PERSISTENT"


def with_schedule(value, fn):
    def run():
        if value is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = value
        return fn()
    return run


def one(args, kernels, timer, name, S, D, dtype_name):
    case, B, q, k, v, o, _, flops = bench.case_inputs(name, S, D, dtype_name)
    ker = kernels.get(case, dtype_name, D)
    stream = torch.cuda.current_stream().cuda_stream
    bm = None
    if ker.needs_blockmap:
        bm = ker.blockmap(q, k, v, o, scalars=case.scalars, aux=case.aux, stream=stream)

    def run_kpt():
        ker(q, k, v, o, scalars=case.scalars, aux=case.aux, blockmap=bm, stream=stream)
        return o
    row, ref = {"case": f"{name} S={S} B={B} {dtype_name} D={D}"}, None
    fns = {n: with_schedule(val, run_kpt) for n, val in VARIANTS.items()}
    fns.update(bench.sdpa_peers(case, q, k, v, S, case.hq, q.dtype) if not args.no_sdpa else {})
    live = {}
    for n in [x for x in fns if x not in ("cudnn", "flash")] + ["cudnn", "flash"]:
        if n not in fns:
            continue
        try:
            o.fill_(float("nan"))
            out = fns[n]().clone()
            torch.cuda.synchronize()
            if ref is None:
                ref = out
                row["nan"] = bool(torch.isnan(out).any())
            row[n + "_err"] = bench.max_rel(ref, out)
            live[n] = fns[n]
        except Exception as e:  # a backend that refuses this case
            row[n + "_error"] = str(e).strip().splitlines()[0][:100]
    # the variants take turns (bench.Timer.in_turns); each figure is the median over the rounds
    times = timer.in_turns(live, args.rounds, args.sustain)
    for n, (burst, sus) in times.items():
        row[n] = flops / (statistics.median(burst) * 1e-3) / 1e12
        if sus:
            row[n + "_sus"] = flops / (statistics.median(sus) * 1e-3) / 1e12
    os.environ.pop(VARIABLE, None)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib")
    ap.add_argument("--patterns", default="full,causal,gqa_causal")
    ap.add_argument("--lua", default="", help="Lua examples (cases.py names), comma-separated")
    ap.add_argument("--seqs", default="1024,2048,4096,16384")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--dims", default="128")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--sustain", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3, help="turns of every variant, medians")
    ap.add_argument("--no-sdpa", action="store_true")
    ap.add_argument("--tall", action="store_true",
                    help="compare q tile heights (KPT_CUDA_TALL) instead of grid schedules")
    args = ap.parse_args()
    global VARIANTS, VARIABLE
    if args.tall:
        VARIANTS, VARIABLE = HEIGHTS, "KPT_CUDA_TALL"
    bench.setup_peers(args.lib)
    timer = bench.Timer(args.reps, warmup=2)
    names = [p for p in args.patterns.split(",") if p] + \
        ["lua:" + p for p in args.lua.split(",") if p]
    cols = list(VARIANTS) + ["cudnn", "flash"]
    print("%-40s" % "case (TFLOP/s burst / sustained)" + "".join("%14s" % c for c in cols) +
          "  max diff", flush=True)
    with tempfile.TemporaryDirectory(prefix="kpt-bench-cache-") as cache_dir:
        kernels = bench.Kernels(cache_dir)
        for dt in args.dtypes.split(","):
            for D in bench.ints(args.dims):
                for name in names:
                    for S in bench.ints(args.seqs):
                        try:
                            r = one(args, kernels, timer, name, S, D, dt)
                        except Exception as e:  # e.g. a Lua example refusing a size
                            print(f"{name} S={S} {dt} D={D}: skipped: "
                                  f"{str(e).strip().splitlines()[0][:120]}", flush=True)
                            continue
                        cells = []
                        for c in cols:
                            if c in r:
                                sus = f"/{r[c + '_sus']:.0f}" if c + "_sus" in r else ""
                                cells.append("%14s" % f"{r[c]:.0f}{sus}")
                            else:
                                cells.append("%14s" % "-")
                        errs = max((r[c + "_err"] for c in cols if c + "_err" in r), default=0)
                        print("%-40s" % r["case"] + "".join(cells) + f"  {errs:.1e}" +
                              ("  NaN!" if r.get("nan") else ""), flush=True)


if __name__ == "__main__":
    main()
