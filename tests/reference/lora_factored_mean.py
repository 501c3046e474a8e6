#!/usr/bin/python3
"""Reference for src/weights/lora_rank's FactoredLoraMean: the weighted mean of LoRA adapters of different ranks,
written densely from its definition in NumPy (Debian's python3-numpy), for lora_rank_test.cc to compare against.

    lora_factored_mean.py CASES.json

CASES.json is a list of {"adapters": [safetensors paths], "weights": [floats], "global": safetensors path,
"out": path}. For every LoRA pair <prefix>.lora_A.weight (r_i, in) / <prefix>.lora_B.weight (out, r_i) of the
global (rank r_max), the case's `out` file holds <prefix>.delta, the dense product (out, in) in F64:

    dW = sum_i w_i B_i A_i / sum_i w_i           when sum_i r_i <= r_max
    its truncated SVD U[:, :r_max] S[:r_max] Vt[:r_max]   (np.linalg.svd) otherwise

and, for every other tensor of the global, the weighted mean sum_i w_i x_i / sum_i w_i under its own name, F64.
Values are read exactly as stored (F32, F16, BF16, F64) and widened to float64.
"""
import json
import sys

import numpy as np

from safetensors_file import read_entries, to_float64, write_entries


def read_safetensors(path):
    """{name: float64 array of its shape}, and the names in data order."""
    entries, _ = read_entries(path)
    return ({name: to_float64(raw, dtype).reshape(shape) for name, dtype, shape, raw in entries},
            [name for name, _, _, _ in entries])


def write_f64_safetensors(path, tensors):
    write_entries(path, [(name, "F64", values.shape, np.ascontiguousarray(values, dtype="<f8").tobytes())
                         for name, values in tensors])


def run_case(case):
    glob, order = read_safetensors(case["global"])
    adapters = [read_safetensors(p)[0] for p in case["adapters"]]
    weights = np.array(case["weights"], dtype=np.float64)
    total = weights.sum()
    out = []
    for name in order:
        if name.endswith(".lora_B.weight"):
            continue
        if name.endswith(".lora_A.weight"):
            prefix = name[: -len(".lora_A.weight")]
            r_max = glob[name].shape[0]
            delta = sum(w * (a[prefix + ".lora_B.weight"] @ a[name]) for w, a in zip(weights, adapters)) / total
            if sum(a[name].shape[0] for a in adapters) > r_max:
                u, s, vt = np.linalg.svd(delta, full_matrices=False)
                delta = (u[:, :r_max] * s[:r_max]) @ vt[:r_max]
            out.append((prefix + ".delta", delta))
        else:
            out.append((name, sum(w * a[name] for w, a in zip(weights, adapters)) / total))
    write_f64_safetensors(case["out"], out)


def main(argv):
    with open(argv[1]) as f:
        cases = json.load(f)
    for case in cases:
        run_case(case)
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main(sys.argv)
