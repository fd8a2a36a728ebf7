"""Compile the FlashInfer modules bench_paged.py runs (bf16, head dim 128: the CUDA-core batch
decode, the fa2 batch prefill that its tensor-core decode and paged prefill use) and install
them as FlashInfer's AOT modules, so the benchmark machine needs neither nvcc nor FlashInfer's
sources. Run it where nvcc and the flashinfer package are, for the benchmark's GPU:

    FLASHINFER_CUDA_ARCH_LIST=9.0a python3 bench/flashinfer_aot.py [--dest DIR]

DIR defaults to the installed package's data/aot, where FlashInfer looks first.
"""
import argparse
import os
import shutil

import torch


def specs():
    from flashinfer.jit.attention import modules as m
    bf = torch.bfloat16
    dec = (bf, bf, bf, torch.int32, 128, 128, 0, False, False)
    pre = dec + (False,)
    return [m.gen_batch_decode_module(*dec),
            m._gen_batch_prefill_primary_module("fa2", *pre),
            m._gen_batch_prefill_independent_paged_module("fa2", *pre)]


def main():
    from flashinfer.jit import env
    ap = argparse.ArgumentParser()
    ap.add_argument("--dest", default=str(env.FLASHINFER_AOT_DIR))
    args = ap.parse_args()
    for s in specs():
        s.build()
        dst = f"{args.dest}/{s.name}"
        os.makedirs(dst, exist_ok=True)
        shutil.copy2(s.jit_library_path, f"{dst}/{s.name}.so")
        print("installed", f"{dst}/{s.name}.so", flush=True)


if __name__ == "__main__":
    main()
