"""Compile the FlashInfer modules bench_paged.py and bench_mixed.py run (bf16, head dim 128: the
CUDA-core batch decode, the fa2 batch prefill that its tensor-core decode and paged prefill use)
and install them as FlashInfer's AOT modules, so the benchmark machine needs neither nvcc nor
FlashInfer's sources. Run it where nvcc and the flashinfer package are, for the benchmark's GPU:

    FLASHINFER_CUDA_ARCH_LIST=9.0a python3 bench/flashinfer_aot.py [--dest DIR] [--pack FILE]

DIR defaults to the installed package's data/aot, where FlashInfer looks first. --pack also
writes FILE (.tar.xz) to unpack into a directory on PYTHONPATH there: the package's Python
files, the sources its wrappers read when they make a module's spec (recorded as this run makes
them), its dist-info and the modules under flashinfer/data/aot; with apache-tvm-ffi for that
machine's Python and FLASHINFER_DISABLE_JIT=1 it runs them (FlashInfer 0.7.2.post1: 11 MB).
"""
import argparse
import os
import shutil
import sys
import tarfile

import torch


def specs():
    from flashinfer.jit.attention import modules as m
    bf = torch.bfloat16
    dec = (bf, bf, bf, torch.int32, 128, 128, 0, False, False)
    pre = dec + (False,)
    return [m.gen_batch_decode_module(*dec),
            m._gen_batch_prefill_primary_module("fa2", *pre),
            m._gen_batch_prefill_independent_paged_module("fa2", *pre)]


def pack(path, read, built):
    """The archive --pack describes; `read`: files of the package opened while the specs were
    made; `built`: (module name, library path)."""
    import flashinfer
    from importlib import metadata
    base = os.path.dirname(flashinfer.__file__)
    site = os.path.dirname(base)
    files = [os.path.join(d, f) for d, _, fs in os.walk(base) for f in fs if f.endswith(".py")]
    files += [p for p in read if p.startswith(base + os.sep) and os.path.isfile(p)]
    dist = metadata.distribution("flashinfer-python")
    files += [str(dist.locate_file(f)) for f in dist.files or [] if ".dist-info" in str(f)]
    with tarfile.open(path, "w:xz") as t:
        for p in sorted(set(files)):
            if os.path.isfile(p):
                t.add(p, arcname=os.path.relpath(p, site))
        for name, lib in built:
            t.add(lib, arcname=f"flashinfer/data/aot/{name}/{name}.so")
    print("packed", path, os.path.getsize(path), "bytes", flush=True)


def main():
    from flashinfer.jit import env
    ap = argparse.ArgumentParser()
    ap.add_argument("--dest", default=str(env.FLASHINFER_AOT_DIR))
    ap.add_argument("--pack", help="also write this .tar.xz for the benchmark machine")
    args = ap.parse_args()
    read = set()
    sys.addaudithook(lambda ev, a: read.add(a[0]) if ev == "open" and isinstance(a[0], str)
                     else None)
    built = []
    for s in specs():
        s.build()
        dst = f"{args.dest}/{s.name}"
        os.makedirs(dst, exist_ok=True)
        shutil.copy2(s.jit_library_path, f"{dst}/{s.name}.so")
        built.append((s.name, str(s.jit_library_path)))
        print("installed", f"{dst}/{s.name}.so", flush=True)
    if args.pack:
        pack(args.pack, {os.path.abspath(p) for p in read}, built)


if __name__ == "__main__":
    main()
