"""The serving plan's split count against the others: each batch's plan with its `splits`
overwritten (its workspace resized as libkpt sizes it: runtime/paged_args.c,
kpt_paged_workspace_bytes), each count's output checked against the plan's own run, then every
count timed in replayed CUDA graphs (bench_paged.graph_times: sustained, no host in the way).
The batches: bench_paged.py's uniform ones (B sequences of Sq tokens over Skv keys, `full`) and
bench_mixed.py's mixed ones (`causal`, bottom-right), bf16, pages of 16 (--page 0: the uniform
batches on a contiguous cache).

    python3 bench/paged_splits.py --lib build/libkpt.so [--counts 1,2,4,8] [--out FILE.json]

--env NAME=V1,V2 times every count under each value of an environment variable that libkpt
reads at each launch ("-": unset), in the same graphs' rounds; e.g. the combine launch against
the cluster combine (docs/serving.md) at every split count of the one-token batches:

    python3 bench/paged_splits.py --lib L --page 0 --env KPT_CUDA_CLUSTER=0,1 --counts 2,4,8,16 \
        --only "1,1,4096;8,1,4096" --seeds ""

--heads HQ:HKV sets the uniform batches' GQA (32:8 by default; 8:1 is one kv head a GPU, as
in tensor parallel) and --dim their head dim (128); --only takes any B, Sq and Skv: thin waves
(fewer work items than SMs) are where the plan's count matters most (docs/serving.md,
"Split-KV").

Prints a line a batch: microseconds a call for each count (count/value with --env), `*` on the
plan's own count, and the best.
"""
import argparse
import json
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import bench_mixed as bm  # noqa: E402
import bench_paged as bp  # noqa: E402

UNIFORM = [(1, 1, 4096), (1, 1, 32768), (8, 1, 4096), (8, 1, 32768), (8, 4, 4096),
           (1, 16, 4096), (1, 16, 32768), (8, 16, 4096), (64, 1, 4096)]
ROWS = 64  # KPT_PAGED_ROWS: the workspace's rows a work item, whatever the plan's rows


def workspace_bytes(plan, splits, dv):
    """kpt_paged_workspace_bytes for `plan` split `splits` ways (0 unsplit)."""
    if splits <= 1:
        return 0
    slots = plan.blocks * splits * plan.num_heads_kv * ROWS
    return ((slots * dv * 4 + 255) & ~255) + slots * 4


def set_env(env, value):
    """Sets (value "-": unsets) environment variable `env`; nothing where env is None."""
    if env is None:
        return
    if value == "-":
        os.environ.pop(env, None)
    else:
        os.environ[env] = value


def sweep(name, plan, run, dv, counts, env=None, values=("-",)):
    """Times of run() under `plan` split each of `counts` ways (and its own count), each under
    every value of environment variable `env` (when given); returns {label: us or None}, labels
    the count or "count/value", and the count the plan chose. run(workspace) returns the
    output."""
    own = plan.splits

    def split(s):
        plan._plan.splits = s
        plan._plan.workspace_bytes = workspace_bytes(plan, s, dv)
    set_env(env, values[0])
    ref = run(torch.empty(max(1, plan.workspace_bytes), dtype=torch.uint8, device="cuda")).clone()
    fns = {}
    for s in sorted(set(counts) | {own}):
        split(s)
        ws = torch.empty(max(1, plan.workspace_bytes), dtype=torch.uint8, device="cuda")
        for v in values:
            label = f"{s}/{v}" if env else s
            set_env(env, v)
            err = bp.agree(run(ws), ref)
            if not err < 2e-2:  # bf16 sums in another order; NaN fails too
                print(f"{name}: {label} disagrees with the plan's own run ({err:.1e})",
                      flush=True)
                continue
            # libkpt reads the plan and the variable at the call, so each graph holds its own
            fns[label] = lambda s=s, v=v, ws=ws: (set_env(env, v), split(s), run(ws))
    times = bp.graph_times(fns, calls=5)
    split(own)
    set_env(env, "-")
    return {s: (t * 1e3 if t else None) for s, t in times.items()}, own


def report(name, times, own, out):
    ok = {s: t for s, t in times.items() if t}
    best = min(ok, key=ok.get) if ok else None
    mine = [t for s, t in ok.items() if str(s).split("/")[0] == str(own)]

    def mark(s):
        return "*" if str(s).split("/")[0] == str(own) else ""
    print(f"{name:>34} | " + "  ".join(
        f"{s}{mark(s)}:{t:.1f}" if t else f"{s}:n/a" for s, t in times.items())
        + (f" | best {best}: {ok[best]:.1f} us, the plan's {own}: {min(mine):.1f}"
           if best and mine else ""), flush=True)
    out.append({"batch": name, "plan_splits": own, "us": {str(s): t for s, t in times.items()}})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--counts", default="1,2,3,4,6,8,12,16,24,32",
                    help="split counts to try beside the plan's (comma list)")
    ap.add_argument("--seeds", default="1,2",
                    help="bench_mixed.py's seeds for its batches (empty: no mixed batches)")
    ap.add_argument("--page", type=int, default=16,
                    help="the uniform batches' page size (0: a contiguous cache)")
    ap.add_argument("--only", help="the uniform batches B,Sq,Skv to run, e.g. 1,1,4096;8,1,4096")
    ap.add_argument("--env", help="NAME=V1,V2: every count under each value (-: unset)")
    ap.add_argument("--heads", default="32:8", help="query heads:kv heads")
    ap.add_argument("--dim", type=int, default=128, help="head dim (Dqk = Dv)")
    ap.add_argument("--out")
    args = ap.parse_args()
    counts = [int(x) for x in args.counts.split(",")]
    env, values = None, ("-",)
    if args.env:
        env, _, vals = args.env.partition("=")
        values = tuple(vals.split(",")) if vals else ("-",)
    uniform = UNIFORM
    if args.only:
        uniform = [tuple(int(x) for x in c.split(",")) for c in args.only.split(";")]
    capi = bp.load_kpt(args.lib)
    ctx = capi.Context("cuda")
    D, PAGE = args.dim, 16
    HQ, HKV = (int(x) for x in args.heads.split(":"))
    out = {"device": torch.cuda.get_device_name(), "env": args.env, "page": args.page,
           "rows": []}
    print(f"device: {out['device']}; bf16, D = {D}, {HQ}:{HKV}, uniform batches page "
          f"{args.page}, mixed page {PAGE}; us a call (CUDA graphs of 5 calls)"
          + (f"; count/{env}" if env else ""), flush=True)
    full = ctx.kernel(capi.Pattern("full"), "bf16", D, paged=True)
    for B, Sq, Skv in uniform:
        c = bp.Case(capi, ctx, full, B, Sq, Skv, hq=HQ, hkv=HKV, d=D, page=args.page)

        def run(ws, c=c):
            c.ws = ws
            return c.kpt()
        times, own = sweep(f"{B} x {Sq} x {Skv}", c.plan, run, D, counts, env, values)
        report(f"full {B} x {Sq} x {Skv}", times, own, out["rows"])
        del c
        torch.cuda.empty_cache()
    causal = ctx.kernel(capi.Pattern("causal"), "bf16", D, paged=True)
    for seed in (int(x) for x in args.seeds.split(",") if x):
        rng = random.Random(seed)  # drawn in bench_mixed.py's order, for the same lengths
        for name in bm.CASES:
            m = bm.Mixed(capi, causal, bm.case_lengths(name, rng), HQ, HKV, D, PAGE)
            T = max(m.cu_q[-1], 1)

            def run(ws, m=m, T=T):
                m.ws = ws
                return m.kpt(True)[:T]
            times, own = sweep(name, m.plan, run, D, counts, env, values)
            report(f"{name} (seed {seed})", times, own, out["rows"])
            m = None
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
