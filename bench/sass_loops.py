#!/usr/bin/env python3
"""The loops of a kernel's SASS that issue warpgroup or warp MMAs, without a GPU: for each, its
address range, its instruction count and its MMAs; with --mix, the opcodes of the innermost one;
with a second cubin, the opcodes whose counts differ between the two innermost loops. A cheap
first look before a device run: a change that moves the K and V descriptors out of uniform
registers, or that adds a branch to the tile loop, shows here as instructions a tile.

    build-gpu/kptc emit --emit cubin --target cuda:sm_90a --head-dim 128 full -o a.cubin
    python3 bench/sass_loops.py a.cubin [b.cubin] [--mix] [--order] [--cuobjdump PATH]

--order prints the innermost loop's schedule in short: runs of MMAs (H16: sixteen), waits for
warpgroup MMAs (|W0, |W1: at most that many groups left in flight) and runs of MUFU operations
([10 EX2]), in ptxas's order; where ptxas put a wait among the exponentials shows there.

A loop is a backward branch's range; loops nest, so the innermost one holding MMAs (the fewest
instructions) is usually the tile loop. Needs cuobjdump (CUDA toolkit; --cuobjdump, else
$CUDA_HOME/bin, else PATH). docs/BENCHMARKS.md ("Item boundaries") used it to find a loop grown
from 637 to 753 instructions a tile.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

INSN = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)\s*$")
PRED = re.compile(r"^@!?U?P[T0-9]+\s+")
FUNCTION = re.compile(r"\s+Function : (\S+)")


def cuobjdump_path(given):
    if given:
        return given
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.exists(os.path.join(home, "bin", "cuobjdump")):
        return os.path.join(home, "bin", "cuobjdump")
    found = shutil.which("cuobjdump")
    if not found:
        sys.exit("sass_loops: no cuobjdump (--cuobjdump PATH, $CUDA_HOME/bin or PATH)")
    return found


def instructions(cuobjdump, cubin):
    """{function: [(address, text)]} of the cubin (each function's addresses start at 0)."""
    out = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"sass_loops: cuobjdump {cubin}: {out.stderr.strip()}")
    funcs, name = {}, None
    for line in out.stdout.splitlines():
        f = FUNCTION.match(line)
        if f:
            name = f.group(1)
            funcs[name] = []
            continue
        m = INSN.match(line)
        if m and name is not None:
            funcs[name].append((int(m.group(1), 16), m.group(2)))
    return funcs


def opcode(text):
    return PRED.sub("", text).split()[0]


def loops(ins):
    """(first, last, body) for each backward branch whose range holds an MMA, innermost first."""
    at = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (a, text) in enumerate(ins):
        m = BRANCH.search(text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target < a and target in at:
            body = ins[at[target]:i + 1]
            if any("MMA" in opcode(t) for _, t in body):
                found.append((target, a, body))
    return sorted(found, key=lambda l: len(l[2]))


def mix(body):
    return collections.Counter(opcode(t) for _, t in body)


def order(body):
    """The schedule of a loop body in short (see --order)."""
    out = []
    for _, text in body:
        op = opcode(text)
        if "MMA" in op:
            item = "H"
        elif op.startswith("WARPGROUP.DEPBAR"):
            item = "|W" + str(int(text.split(",")[-1].strip(), 0))
        elif op.startswith("MUFU."):
            item = op[5:]
        else:
            continue
        if out and out[-1][0] == item and not item.startswith("|"):
            out[-1][1] += 1
        else:
            out.append([item, 1])
    return " ".join(f"H{n}" if k == "H" else k if k.startswith("|") else f"[{n} {k}]"
                    for k, n in out)


def describe(name, found):
    print(f"{name}: {len(found)} loops with MMAs")
    for first, last, body in found:
        c = mix(body)
        mma = sum(v for k, v in c.items() if "MMA" in k)
        print(f"  {first:#07x}-{last:#07x}  {len(body):5d} instructions, {mma:3d} MMAs, "
              f"R2UR {c['R2UR']}, BSSY {c['BSSY']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cubin", nargs="+", help="one cubin, or two to compare")
    ap.add_argument("--mix", action="store_true", help="the innermost loop's opcodes")
    ap.add_argument("--order", action="store_true",
                    help="the innermost loop's MMAs, waits and MUFU operations, in order")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--function", help="the kernel to look at (default: every kernel's loops)")
    args = ap.parse_args()
    if len(args.cubin) > 2:
        sys.exit("sass_loops: one or two cubins")
    tool = cuobjdump_path(args.cuobjdump)
    inner = []
    for path in args.cubin:
        funcs = instructions(tool, path)
        if args.function and args.function not in funcs:
            sys.exit(f"sass_loops: {path}: no function {args.function} ({', '.join(funcs)})")
        found = []
        for name, ins in funcs.items():
            if args.function in (None, name):
                found += loops(ins)
        found.sort(key=lambda l: len(l[2]))
        describe(path, found)
        if not found:
            sys.exit(f"sass_loops: {path}: no loop with MMAs")
        inner.append(mix(found[0][2]))
        if args.order:
            print("  order: " + order(found[0][2]))
    if args.mix:
        for k, v in inner[0].most_common():
            print(f"  {v:5d} {k}")
    if len(inner) == 2:
        a, b = inner
        print("innermost loops' opcodes that differ (first, second):")
        for k in sorted(set(a) | set(b), key=lambda k: -abs(b[k] - a[k])):
            if a[k] != b[k]:
                print(f"  {k:32s} {a[k]:5d} {b[k]:5d}")


if __name__ == "__main__":
    main()
