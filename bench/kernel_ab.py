#!/usr/bin/env python3
"""Builds of libkpt against each other on kernel time: the libraries take turns over --rounds
rounds, one process per library and round (a process keeps the first libkpt it loads), and
each figure is the mean over the rounds with its spread. On the H200 one round a build misled
more than once: the same build's figures moved by 2-4 % from round to round.

    python3 bench/kernel_ab.py --libs base/libkpt.so,new/libkpt.so --rounds 3 \\
        --forward full:1024:128,causal:16384:128 --backward causal:16384,softcap+causal:16384

--forward PATTERN:S:D: kpt's forward alone, TFLOP/s burst (the median of --reps calls, each
after an L2 flush; bench.Timer) and sustained (the mean of --sustain calls back to back); with
--lse the forward also writes the rows' log-sum-exp, as training's does (bench_backward.py's).
--backward PATTERN:S[:D]: the sum of the backward's kernels for one call after an L2 flush
(bench/bwd_kernel_times.py; D = 128 unless given), default and deterministic, TFLOP/s and the
deterministic / default ratio, then each kernel's mean µs. Cases are bench.case_inputs's
(16k tokens, B = 16k / S, H = 2048 / D), bf16. --env NAME=V1,V2 runs each library once under
each value of an environment switch (KPT_CUDA_PDL=0,1), in turns as the libraries.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_cases(text, option, dim=None):
    """[(pattern, S, D)] from "causal:1024:128,full:16384" (PATTERN:LENGTH:HEAD_DIM; with dim,
    the head dim may be left out and is dim); ValueError naming the bad one."""
    form = "PATTERN:LENGTH:HEAD_DIM" if dim is None else "PATTERN:LENGTH[:HEAD_DIM]"
    out = []
    for spec in filter(None, text.split(",")):
        m = re.fullmatch(r"(.+?):(\d+)(?::(\d+))?", spec)
        S, D = (int(m[2]), int(m[3]) if m[3] else dim) if m else (0, None)
        if not m or S < 1 or D is None or D < 1:
            raise ValueError(f"{option}: '{spec}' is not {form} (as causal:1024:128"
                             + (")" if dim is None else " or causal:16384)"))
        out.append((m[1], S, D))
    return out


def measure_one(args):
    """This process's turn: every case on args.one, one JSON record a line on stdout."""
    import torch
    sys.path.insert(0, HERE)
    import bench
    import bwd_kernel_times
    from bench import kpt

    bench.setup_peers(args.one)
    timer = bench.Timer(args.reps, warmup=3)
    stream = torch.cuda.current_stream().cuda_stream
    with kpt.Context(backend="cuda") as ctx:
        for name, S, D in parse_cases(args.forward, "--forward"):
            case, _, q, k, v, o, _, flops = bench.case_inputs(name, S, D, "bf16")
            ker = ctx.kernel(case.pattern(kpt), "bf16", D)
            sc, aux = case.scalars, case.aux
            bm = (ker.blockmap(q, k, v, o, scalars=sc, aux=aux, stream=stream)
                  if ker.needs_blockmap else None)
            lse = (torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
                   if args.lse else None)
            def fn():
                ker(q, k, v, o, lse=lse, scalars=sc, aux=aux, blockmap=bm, stream=stream)
            burst, sustained = timer(fn), timer.sustained(fn, args.sustain)
            label = f"fwd {name}:{S}:{D}" + ("+lse" if args.lse else "")
            print(json.dumps({"case": label, "burst": flops / burst / 1e9,
                              "sustained": flops / sustained / 1e9}), flush=True)
        flush = torch.empty(128 << 20, dtype=torch.int32, device="cuda")
        for name, S, D in parse_cases(args.backward, "--backward", 128):
            ms = bwd_kernel_times.measure(ctx, flush, name, S, D, "bf16", args.reps)
            default, det = ms
            label = f"bwd {name}:{S}" + (f":{D}" if D != 128 else "")
            print(json.dumps({"case": label, "default": default["tflops"],
                              "det": det["tflops"], "ratio": det["tflops"] / default["tflops"],
                              "kernels": {("det " if m["deterministic"] else "") + n: t
                                          for m in ms for n, t in m["kernels"].items()}}),
                  flush=True)


def spread(xs):
    """mean (min-max) of a list of figures."""
    if len(xs) == 1:
        return f"{xs[0]:.0f}"
    return f"{statistics.mean(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"


def summarize(records, libs):
    """The table of records ({run: [record, ...]}, records of every round; a run is a library's
    path, with " NAME=VALUE" after it under --env): per case, a row per figure and a column per
    run. Returns the lines."""
    def short(run):
        lib, _, env = run.partition(" ")
        name = os.path.basename(os.path.dirname(os.path.abspath(lib))) or lib
        return name + (" " + env if env else "")
    names = [short(l) for l in libs]
    if len(set(names)) < len(names):
        names = libs
    cases = []
    for lib in libs:
        for r in records.get(lib, []):
            if r["case"] not in cases:
                cases.append(r["case"])
    lines = ["%-44s" % "case / figure" + "".join("%24s" % n[-24:] for n in names)]
    for case in cases:
        by_lib = {l: [r for r in records.get(l, []) if r["case"] == case] for l in libs}
        keys = ["burst", "sustained"] if case.startswith("fwd") else ["default", "det", "ratio"]
        kernels = []
        for rs in by_lib.values():
            for r in rs:
                kernels += [k for k in r.get("kernels", {}) if k not in kernels]
        for key in keys + kernels:
            row = []
            for l in libs:
                xs = [r[key] if key in r else r["kernels"].get(key) for r in by_lib[l]]
                xs = [x for x in xs if x is not None]
                if key == "ratio":
                    row.append("%24s" % (f"{statistics.mean(xs):.3f}" if xs else "-"))
                else:
                    row.append("%24s" % (spread(xs) if xs else "-"))
            unit = "TF/s" if key in ("burst", "sustained", "default", "det") else \
                ("" if key == "ratio" else "us")
            lines.append("%-44s" % f"{case if key == keys[0] else ''} {key} {unit}"[:44] +
                         "".join(row))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--libs", help="libkpt.so builds, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--forward", default="", help="PATTERN:LENGTH:HEAD_DIM cases")
    ap.add_argument("--backward", default="", help="PATTERN:LENGTH[:HEAD_DIM] cases (D = 128)")
    ap.add_argument("--lse", action="store_true", help="the forward also writes the LSE")
    ap.add_argument("--env", default="",
                    help="NAME=V1,V2,...: each library runs once under each value of NAME "
                         "(a launch- or plan-time switch) in every round")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--sustain", type=int, default=50)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a turn: this process measures one build
    args = ap.parse_args()
    try:
        parse_cases(args.forward, "--forward")
        parse_cases(args.backward, "--backward", 128)
    except ValueError as e:
        ap.error(str(e))
    if args.one:
        return measure_one(args)
    libs = [l for l in (args.libs or "").split(",") if l]
    if not libs or not (args.forward or args.backward):
        ap.error("give --libs A[,B,...] and --forward or --backward cases")
    for l in libs:
        if not os.path.isfile(l):
            ap.error(f"--libs: no such file '{l}'")
    env_name, _, env_values = args.env.partition("=")
    if args.env and (not env_name or not env_values):
        ap.error(f"--env: '{args.env}' is not NAME=V1,V2,...")
    # (label, library, value): a run is a library, under one value of the switch with --env
    runs = [(l if v is None else f"{l} {env_name}={v}", l, v)
            for l in libs for v in (env_values.split(",") if args.env else [None])]
    records = {}
    for rnd in range(args.rounds):
        for run, lib, value in runs:
            env = dict(os.environ, **({env_name: value} if value is not None else {}))
            cmd = [sys.executable, os.path.abspath(__file__), "--one", lib,
                   "--forward", args.forward, "--backward", args.backward,
                   "--reps", str(args.reps), "--sustain", str(args.sustain)] + \
                (["--lse"] if args.lse else [])
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            got = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
            if p.returncode:
                sys.exit(f"kernel_ab: round {rnd + 1}, {run}: exit status {p.returncode}\n"
                         + "\n".join(p.stderr.splitlines()[-15:]))
            records.setdefault(run, []).extend(got)
            print(f"# round {rnd + 1}/{args.rounds}, {run}: "
                  + ", ".join(f"{r['case']} " + (f"{r['burst']:.0f}" if "burst" in r else
                                                   f"{r['default']:.0f}/{r['det']:.0f}")
                              for r in got), flush=True)
    print("\n".join(summarize(records, [run for run, _, _ in runs])))


if __name__ == "__main__":
    main()
