"""The baseline for bench_aggregate: FedAvg the way Flower aggregates (flwr.server.strategy.aggregate.aggregate).

Each client's update is a list of numpy arrays (one per tensor); all K are held in memory, then
`reduce(np.add, [w * n ...]) / N` per tensor. Prints the timing as one JSON line. Run with Debian's /usr/bin/python3.

bf16 has no numpy dtype: a client's bf16 tensor arrives as uint16 bits and is widened to float32 inside the
aggregation (the smallest change to Flower's code that can consume it).
"""
import argparse
import json
import time
from functools import reduce

import numpy as np


def aggregate(results):
    """Flower's aggregate(): results = [(list of ndarrays, num_examples)]."""
    num_examples_total = sum(num_examples for (_, num_examples) in results)
    weighted_weights = [[layer * num_examples for layer in weights] for weights, num_examples in results]
    return [reduce(np.add, layer_updates) / num_examples_total for layer_updates in zip(*weighted_weights)]


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def aggregate_bf16(results):
    num_examples_total = sum(num_examples for (_, num_examples) in results)
    weighted_weights = [[bf16_to_f32(layer) * num_examples for layer in weights] for weights, num_examples in results]
    return [reduce(np.add, layer_updates) / num_examples_total for layer_updates in zip(*weighted_weights)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", choices=["f32", "bf16"], required=True)
    parser.add_argument("--tensors", type=int, required=True)
    parser.add_argument("--tensor-elements", type=int, required=True)
    parser.add_argument("--k", type=int, required=True)
    args = parser.parse_args()

    # One random client, varied per client by a cheap shift (for bf16 in its bit pattern): K distinct arrays, as
    # Flower holds them, without K random draws. Generation is not timed.
    rng = np.random.default_rng(0)
    base = [rng.random(args.tensor_elements, dtype=np.float32) - 0.5 for _ in range(args.tensors)]
    if args.dtype == "bf16":
        base = [(layer.view(np.uint32) >> 16).astype(np.uint16) for layer in base]
    shift = (lambda k: np.float32(1e-3 * k)) if args.dtype == "f32" else (lambda k: np.uint16(k))
    results = [([layer + shift(k) for layer in base], 100 + 10 * k) for k in range(args.k)]
    del base
    update_bytes = sum(layer.nbytes for layer in results[0][0])

    start = time.perf_counter()
    mean = (aggregate if args.dtype == "f32" else aggregate_bf16)(results)
    seconds = time.perf_counter() - start
    assert len(mean) == args.tensors
    print(json.dumps({"seconds": seconds, "update_bytes": update_bytes, "k": args.k}))


if __name__ == "__main__":
    main()
