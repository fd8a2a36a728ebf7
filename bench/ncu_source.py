#!/usr/bin/env python3
"""Where a kernel's warps wait, by SASS instruction: reads Nsight Compute's source page (CSV) and
prints the share of warp-state samples by how often each instruction ran — once per tile loop
iteration, once per work item, or otherwise — and the instructions with the most samples and
their two main stall reasons.

    ncu --clock-control none -k regex:kpt_attention --launch-skip 2 --launch-count 1 \\
        --section SourceCounters --section WarpStateStats --page source --print-source sass \\
        --csv python3 bench/profile_cases.py --lib build-gpu/libkpt.so --seq 1024 full > src.csv
    python3 bench/ncu_source.py src.csv [--loop N] [--top 25] [--by-count 6]

The loop's count is the most common execution count among instructions run more often than
the median one (as often, where the loop holds most of them; or --loop); an instruction run
that many times is "loop", one run fewer times but more than never is "other".
docs/BENCHMARKS.md ("Short sequences: O through TMA stores") used this to find the sm_90a
forward's per-item costs at 1k tokens. --by-count groups the samples by execution count (the
loop, once an item, the producer's waits ...), which compares two kernels' structure ("Short
sequences beside cuDNN's kernel").
"""
import argparse
import collections
import csv
import gzip
import statistics
import sys


def read(path):
    """(instructions, stall columns): each instruction a dict of its CSV fields."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), None)
    if start is None:
        sys.exit(f"{path}: no source table (run ncu with --page source --csv)")
    rows = list(csv.DictReader(lines[start:]))
    stalls = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    return rows, stalls


def num(x):
    try:
        return float(x.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def by_count(rows, execs, stalls, samples, total, n):
    """Samples grouped by how often their instructions ran: each group's instruction count,
    share of the samples and three main stall reasons (each a share of the group's samples)."""
    groups = collections.defaultdict(lambda: [0, 0.0, collections.Counter()])
    for r, e in zip(rows, execs):
        g = groups[e]
        g[0] += 1
        g[1] += num(r[samples])
        for s in stalls:
            g[2][s[6:]] += num(r[s])
    for e, (count, got, why) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:n]:
        reasons = sum(why.values()) or 1.0
        print(f"  exec {e:>10.0f}: {count:5d} instructions, {got / total * 100:5.1f} % of "
              f"samples; " + ", ".join(f"{w} {v / reasons * 100:.0f} %"
                                       for w, v in why.most_common(3)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv output (.gz accepted)")
    ap.add_argument("--loop", type=float, help="the loop's execution count (default: guessed)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--by-count", type=int, default=0, metavar="N",
                    help="also the N execution counts with the most samples (code run that "
                    "often: the loop, once an item, ...), with their stall reasons")
    args = ap.parse_args()
    rows, stalls = read(args.csv)
    samples = "Warp Stall Sampling (All Samples)"
    execs = [num(r["Instructions Executed"]) for r in rows]
    total = sum(num(r[samples]) for r in rows) or 1.0
    loop = args.loop
    if loop is None:
        ran = [e for e in execs if e > 0]
        med = statistics.median(ran)
        # where the loop holds most of the run instructions the median is its own count
        above = [e for e in ran if e > med] or [e for e in ran if e >= med]
        loop = collections.Counter(above).most_common(1)[0][0]
    share = collections.Counter()
    for r, e in zip(rows, execs):
        share["loop" if e == loop else "other" if e > 0 else "never"] += num(r[samples])
    print(f"{len(rows)} instructions, {total:.0f} samples; loop count {loop:.0f}: " +
          ", ".join(f"{k} {v / total * 100:.1f} %" for k, v in share.most_common()))
    if args.by_count:
        by_count(rows, execs, stalls, samples, total, args.by_count)
    top = sorted(zip(rows, execs), key=lambda x: -num(x[0][samples]))[:args.top]
    for r, e in top:
        why = sorted(((num(r[s]), s[6:]) for s in stalls), reverse=True)[:2]
        print(f"{num(r[samples]) / total * 100:5.2f} %  exec {e:>10.0f}  "
              f"{r['Source'].strip()[:70]:70s} {' '.join(w for v, w in why if v)}")


if __name__ == "__main__":
    main()
