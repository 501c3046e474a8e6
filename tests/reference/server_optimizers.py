"""Independent NumPy reference for the server optimizers (strategy/server_optimizer.h), for strategy_test.

FedAvgM (Hsu et al. 2019) and FedAdam / FedYogi / FedAdagrad (Reddi et al. 2021, Algorithm 2), written from the
papers' formulas in float32 NumPy, the way Flower's strategies compute them (m and v start at zero, no bias
correction). Run with Debian's /usr/bin/python3 (python3-numpy):

    server_optimizers.py IN.safetensors OUT.safetensors [IN OUT ...]

IN holds "global/<name>" (float32) and "round<r>/update<i>/<name>" (float32), with metadata: kind, lr, momentum,
beta1, beta2, tau, rounds, and samples<r> ("3,1,4": the sample counts of round r's updates). OUT gets, for each round
r, "round<r>/global/<name>" and the moments "round<r>/m/<name>", "round<r>/v/<name>".
"""
import sys

import numpy as np

from safetensors_file import read_entries, to_float32, write_entries


def read_safetensors(path):
    entries, metadata = read_entries(path)
    tensors = {}
    for name, dtype, shape, raw in entries:
        assert dtype == "F32", (name, dtype)
        tensors[name] = to_float32(raw, dtype).reshape(shape).copy()
    return tensors, metadata


def write_safetensors(path, tensors):
    write_entries(path, [(name, "F32", array.shape, np.ascontiguousarray(array, dtype=np.float32).tobytes())
                         for name, array in tensors.items()])


def run_case(in_path, out_path):
    tensors, meta = read_safetensors(in_path)
    kind = meta["kind"]
    f32 = np.float32
    lr, momentum = f32(float(meta["lr"])), f32(float(meta["momentum"]))
    b1, b2, tau = f32(float(meta["beta1"])), f32(float(meta["beta2"])), f32(float(meta["tau"]))
    one_minus_b1, one_minus_b2 = f32(1.0 - float(meta["beta1"])), f32(1.0 - float(meta["beta2"]))
    names = [k[len("global/") :] for k in tensors if k.startswith("global/")]
    w = {n: tensors["global/" + n] for n in names}
    m = {n: np.zeros_like(w[n]) for n in names}
    v = {n: np.zeros_like(w[n]) for n in names}
    out = {}
    for r in range(1, int(meta["rounds"]) + 1):
        samples = [int(s) for s in meta["samples%d" % r].split(",")]
        total = sum(samples)
        for n in names:
            # FedAvg: the sample-weighted mean, in float64, rounded once to float32.
            acc = np.zeros(w[n].shape, dtype=np.float64)
            for i, count in enumerate(samples):
                acc += tensors["round%d/update%d/%s" % (r, i, n)].astype(np.float64) * count
            mean = (acc / total).astype(np.float32)
            delta = mean - w[n]
            if kind == "fedavgm":
                v[n] = momentum * v[n] + delta
                w[n] = w[n] + lr * v[n]
            else:
                m[n] = b1 * m[n] + one_minus_b1 * delta
                delta2 = delta * delta
                if kind == "fedadam":
                    v[n] = b2 * v[n] + one_minus_b2 * delta2
                elif kind == "fedyogi":
                    v[n] = v[n] - one_minus_b2 * delta2 * np.sign(v[n] - delta2)
                elif kind == "fedadagrad":
                    v[n] = v[n] + delta2
                else:
                    raise SystemExit("unknown kind " + kind)
                w[n] = w[n] + lr * m[n] / (np.sqrt(v[n]) + tau)
            assert w[n].dtype == np.float32 and v[n].dtype == np.float32
            out["round%d/global/%s" % (r, n)] = w[n]
            out["round%d/m/%s" % (r, n)] = m[n]
            out["round%d/v/%s" % (r, n)] = v[n]
    write_safetensors(out_path, out)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) % 2 != 0 or not args:
        raise SystemExit(__doc__)
    for i in range(0, len(args), 2):
        run_case(args[i], args[i + 1])
