#!/usr/bin/env python3
"""kpt from Python on numpy arrays (CPU backend): a sliding window with soft-capping, checked
against the same attention written in numpy. With torch tensors on a GPU the call is the same.

    pip install .            # from the repository (scripts/dev demo does it in build-py/venv)
    python3 examples/python/numpy_example.py
"""
import logging

import numpy as np

import kpt

logging.basicConfig(level=logging.INFO, format="%(message)s")  # kpt logs the backend it picks
B, H, S, D, W = 1, 4, 256, 64, 32
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3))

o = kpt.attention(q, k, v, "sliding_window($w)+softcap(30)", scalars={"w": W})

s = 30 * np.tanh(q @ k.transpose(0, 1, 3, 2) / np.sqrt(D) / 30)
i, j = np.arange(S)[:, None], np.arange(S)[None, :]
s = np.where((i >= j) & (i - j < W), s, -np.inf)
p = np.exp(s - s.max(-1, keepdims=True))
ref = p / p.sum(-1, keepdims=True) @ v
err = np.abs(o - ref).max()
print(f"kpt.attention: {kpt.get_pattern('sliding_window($w)+softcap(30)').name}, "
      f"max difference from numpy {err:.1e}")
raise SystemExit(0 if err < 1e-4 else 1)
