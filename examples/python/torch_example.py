#!/usr/bin/env python3
"""kpt on PyTorch tensors: a document mask with a sliding window, checked against SDPA.

    KPT_LIB=build/libkpt.so python3 examples/python/torch_example.py

kpt reads torch tensors in place (their device pointers, dtypes, shapes and strides) and launches
on torch's current stream, so nothing is copied and nothing synchronises.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import kpt  # noqa: E402

B, H, S, D, W = 2, 8, 2048, 128, 256
dev, dt = "cuda", torch.bfloat16

ctx = kpt.Context()  # the first CUDA device; kernels cached on disk across runs
pattern = kpt.Pattern("document+sliding_window($w)")
kernel = ctx.kernel(pattern, "bf16", head_dim=D)  # compiled once: S, B, H and w are arguments

# BSHD tensors, as many models keep them: kpt takes the [B, H, S, D] view's strides as they are
q, k, v = (torch.randn(B, S, H, D, device=dev, dtype=dt).transpose(1, 2) for _ in range(3))
o = torch.empty(B, H, S, D, device=dev, dtype=dt)
docs = (torch.arange(S, device=dev) // 700).to(torch.int32).expand(B, S).contiguous()
aux = {"doc_q": docs, "doc_kv": docs}
stream = torch.cuda.current_stream().cuda_stream

# the document mask reads aux tensors: build its block map once, reuse it for every launch
bmap = kernel.blockmap(q, k, v, o, scalars={"w": W}, aux=aux, stream=stream)
kernel(q, k, v, o, scalars={"w": W}, aux=aux, blockmap=bmap, stream=stream)

i = torch.arange(S, device=dev)
keep = (docs[0, :, None] == docs[0, None, :]) & (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < W)
ref = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
err = ((o.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
print(f"{ctx.device_name}: {pattern.name}, max relative difference from SDPA {err:.2e}")
print("kernel:", kernel.info(), "\nstats:", ctx.stats())
sys.exit(0 if err < 2e-2 else 1)
