#!/usr/bin/python3
"""Reference for src/strategy/robust_aggregation: coordinate-wise median, trimmed mean, Krum and Multi-Krum written
from their formulas in NumPy (Debian's python3-numpy), for robust_aggregation_test.cc to compare against.

    robust_aggregation.py CASES.json

CASES.json is a list of {"updates": [safetensors paths], "strategy": "median" | "trimmed_mean" | "krum" |
"multi_krum", "beta": float, "f": int, "m": int, "out": path}. Each case's result is written to `out` as
safetensors in the updates' dtypes (F32, BF16, F16; BF16 rounded to nearest even, F16 by NumPy's float16 cast).

Arithmetic, as documented in docs/training.md: values widened to float32 (exact); median of an even count is
float32((float64(a) + float64(b)) / 2); trimmed and Multi-Krum means are float64 sums rounded once to float32;
Krum's squared distances are float64 sums over all tensors, and it returns the winning update's bytes unchanged.
Equal Krum scores (with f = 0 and 3 updates the two closest always tie): the update whose bytes come first wins.
"""
import json
import sys

import numpy as np

from safetensors_file import float32_to_bytes as to_dtype_bytes
from safetensors_file import read_entries, to_float32, write_entries


def read_safetensors(path):
    """[(name, dtype, shape, float32 values, raw bytes)] in file order."""
    entries, _ = read_entries(path)
    return [(name, dtype, shape, to_float32(raw, dtype), raw) for name, dtype, shape, raw in entries]


def write_safetensors(path, tensors):
    write_entries(path, tensors)


def median(stack):
    n = stack.shape[0]
    s = np.sort(stack, axis=0)
    if n % 2 == 1:
        return s[n // 2]
    return ((s[n // 2 - 1].astype(np.float64) + s[n // 2].astype(np.float64)) / 2).astype(np.float32)


def trimmed_mean(stack, beta):
    n = stack.shape[0]
    k = int(np.floor(beta * n))
    s = np.sort(stack, axis=0)[k:n - k].astype(np.float64)
    return (s.sum(axis=0) / (n - 2 * k)).astype(np.float32)


def krum_ranking(updates, f):
    """Indices of `updates`, lowest score first; equal scores in canonical order (the updates' bytes compared
    lexicographically, tensor after tensor)."""
    n = len(updates)
    canonical = sorted(range(n), key=lambda i: b"".join(t[4] for t in updates[i]))
    flat = np.stack([np.concatenate([t[3].astype(np.float64) for t in u]) for u in updates])
    distances = np.array([[np.sum((flat[i] - flat[j]) ** 2) for j in range(n)] for i in range(n)])
    nearest = n - f - 2
    scores = [np.sort(np.delete(distances[i], i))[:nearest].sum() for i in range(n)]
    return sorted(canonical, key=lambda i: scores[i])  # sorted() is stable


def run_case(case):
    updates = [read_safetensors(p) for p in case["updates"]]
    n = len(updates)
    layout = [(name, dtype, shape) for name, dtype, shape, _, _ in updates[0]]
    strategy = case["strategy"]
    out = []
    if strategy == "krum":
        best = updates[krum_ranking(updates, case["f"])[0]]
        out = [(name, dtype, shape, raw) for name, dtype, shape, _, raw in best]
    else:
        chosen = list(range(n))
        if strategy == "multi_krum":
            m = case["m"] or n - case["f"]
            chosen = sorted(krum_ranking(updates, case["f"])[:m])
        for t, (name, dtype, shape) in enumerate(layout):
            stack = np.stack([updates[i][t][3] for i in chosen])
            if strategy == "median":
                values = median(stack)
            elif strategy == "trimmed_mean":
                values = trimmed_mean(stack, case["beta"])
            elif strategy == "multi_krum":
                values = (stack.astype(np.float64).sum(axis=0) / len(chosen)).astype(np.float32)
            else:
                raise ValueError(f"unknown strategy {strategy}")
            out.append((name, dtype, shape, to_dtype_bytes(values, dtype)))
    write_safetensors(case["out"], out)


def main(argv):
    with open(argv[1]) as f:
        cases = json.load(f)
    for case in cases:
        run_case(case)
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main(sys.argv)
