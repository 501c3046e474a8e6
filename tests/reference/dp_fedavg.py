#!/usr/bin/python3
"""Independent NumPy reference for dp_fedavg (src/strategy/dp_fed_avg.h, rdp_accountant.h).

Usage: dp_fedavg.py INPUT OUTPUT. INPUT is text, one record per line:
  orders A1 A2 ...                      RDP orders for the following cases
  case Q SIGMA ROUNDS DELTA             -> "case RDP_1 ... RDP_n EPS_CLASSIC EPS_IMPROVED"
  aggregate KEY_HEX ROUND CLIP SIGMA    starts an aggregate (KEY_HEX: the job's private key); followed by
  global V1 V2 ...                      the global (flattened) and
  update V1 V2 ...                      one line per update, then
  end                                   -> "aggregate V1 V2 ..." (the new global, float64, %.17g)

The accountant is computed here from the definition, not from the series the C++ code uses: one round's RDP at
order a is log(A_a) / (a - 1) with A_a = E_{z ~ N(0, s^2)}[((1 - q) + q exp((2z - 1) / (2 s^2)))^a]
(Mironov, Talwar, Zhang 2019, sec. 3), integrated numerically (trapezoid rule in log space on a grid much finer than
the integrand's width); q = 1 gives a / (2 s^2). Conversions: classic eps = rdp - log(delta) / (a - 1); improved
eps = rdp + log(1 - 1/a) - (log(delta) + log(a)) / (a - 1); both minimised over the orders, clamped at 0.

The aggregate follows the documented rule in float64: clip each delta to CLIP, average unweighted, add the noise
drawn by the documented generator: Box-Muller over ChaCha20's keystream (RFC 8439, written out here from the RFC,
checked against its test vector) under the job's private key with the nonce (1, round).
"""
import math
import sys

import numpy as np

MASK32 = 0xFFFFFFFF
NOISE_DOMAIN = 1  # DpFedAvg::kDpNoiseDomain


def _rotl(x, n):
    return ((x << n) & MASK32) | (x >> (32 - n))


def _quarter(s, a, b, c, d):
    s[a] = (s[a] + s[b]) & MASK32
    s[d] = _rotl(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & MASK32
    s[b] = _rotl(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b]) & MASK32
    s[d] = _rotl(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & MASK32
    s[b] = _rotl(s[b] ^ s[c], 7)


def chacha20_block(key, counter, nonce):
    """RFC 8439 section 2.3: 64 bytes of keystream for a 32-byte key, a 32-bit counter and a 12-byte nonce."""
    constants = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574]
    words = lambda b: [int.from_bytes(b[i:i + 4], "little") for i in range(0, len(b), 4)]
    state = constants + words(key) + [counter] + words(nonce)
    s = list(state)
    for _ in range(10):
        _quarter(s, 0, 4, 8, 12)
        _quarter(s, 1, 5, 9, 13)
        _quarter(s, 2, 6, 10, 14)
        _quarter(s, 3, 7, 11, 15)
        _quarter(s, 0, 5, 10, 15)
        _quarter(s, 1, 6, 11, 12)
        _quarter(s, 2, 7, 8, 13)
        _quarter(s, 3, 4, 9, 14)
    return b"".join(((a + b) & MASK32).to_bytes(4, "little") for a, b in zip(s, state))


# RFC 8439 appendix A.1, test vector 1: the all-zero key and nonce, block 0.
assert chacha20_block(bytes(32), 0, bytes(12))[:16].hex() == "76b8e0ada0f13d90405d6ae55386bd28"


def noise_words(key, round_, count):
    """`count` 64-bit little-endian words of the keystream under `key`, nonce (NOISE_DOMAIN, round), from block 0."""
    nonce = NOISE_DOMAIN.to_bytes(4, "little") + round_.to_bytes(8, "little")
    stream = b""
    block = 0
    while len(stream) < 8 * count:
        stream += chacha20_block(key, block, nonce)
        block += 1
    return [int.from_bytes(stream[8 * i:8 * i + 8], "little") for i in range(count)]


def standard_normals(key, round_, count):
    pairs = (count + 1) // 2
    w = np.array(noise_words(key, round_, 2 * pairs), dtype=np.uint64)
    u1 = ((w[0::2] >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53
    u2 = (w[1::2] >> np.uint64(11)).astype(np.float64) * 2.0**-53
    r = np.sqrt(-2.0 * np.log(u1))
    theta = 2.0 * np.pi * u2
    z = np.empty(2 * pairs)
    z[0::2] = r * np.cos(theta)
    z[1::2] = r * np.sin(theta)
    return z[:count]


def rdp_one_round(q, sigma, order):
    if q == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    if q == 1:
        return order / (2 * sigma**2)
    h = sigma / 20
    z = np.arange(-40 * sigma - 1, order + 40 * sigma + 1, h)
    t = (2 * z - 1) / (2 * sigma**2)
    log_ratio = order * np.logaddexp(math.log1p(-q), math.log(q) + t)  # log of the integrand / N(0, s^2) density
    log_phi = -(z**2) / (2 * sigma**2) - math.log(sigma * math.sqrt(2 * math.pi))
    # A - 1 = integral of phi * (ratio - 1): exact cancellation of the 1 keeps the precision of small RDP values.
    small = log_ratio < 700
    excess = np.where(small, np.exp(log_phi) * np.expm1(np.where(small, log_ratio, 0)), 0.0)
    with np.errstate(over="ignore"):
        large = np.exp(np.where(small, -np.inf, log_phi + log_ratio))
    a_minus_1 = (np.sum(excess) + np.sum(large)) * h
    if math.isinf(a_minus_1) or a_minus_1 > 1e300:  # too large for linear space: the log-space sum
        m = (log_phi + log_ratio).max()
        log_a = m + math.log(np.sum(np.exp(log_phi + log_ratio - m)) * h)
    else:
        log_a = math.log1p(a_minus_1)
    return log_a / (order - 1)


def epsilon(orders, rdp, delta, improved):
    best = math.inf
    for a, r in zip(orders, rdp):
        if improved:
            e = r + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1)
        else:
            e = r - math.log(delta) / (a - 1)
        best = min(best, e)
    return max(best, 0.0)


def aggregate(key, round_, clip, sigma, global_, updates):
    g = np.array(global_, dtype=np.float64)
    total = np.zeros_like(g)
    for u in updates:
        d = np.array(u, dtype=np.float64) - g
        norm = math.sqrt(float(np.sum(d * d)))
        total += d * (clip / norm if norm > clip else 1.0)
    k = len(updates)
    return g + total / k + sigma * clip / k * standard_normals(key, round_, g.size)


def main():
    lines = open(sys.argv[1]).read().splitlines()
    out = []
    orders = []
    i = 0
    while i < len(lines):
        f = lines[i].split()
        i += 1
        if not f:
            continue
        if f[0] == "orders":
            orders = [float(x) for x in f[1:]]
        elif f[0] == "case":
            q, sigma, rounds, delta = float(f[1]), float(f[2]), int(f[3]), float(f[4])
            step = [rdp_one_round(q, sigma, a) for a in orders]
            total = [rounds * r for r in step]
            values = step + [epsilon(orders, total, delta, False), epsilon(orders, total, delta, True)]
            out.append("case " + " ".join("%.17g" % v for v in values))
        elif f[0] == "aggregate":
            key, round_, clip, sigma = bytes.fromhex(f[1]), int(f[2]), float(f[3]), float(f[4])
            global_, updates = None, []
            while lines[i].split()[0] != "end":
                g = lines[i].split()
                i += 1
                if g[0] == "global":
                    global_ = [float(x) for x in g[1:]]
                else:
                    updates.append([float(x) for x in g[1:]])
            i += 1
            result = aggregate(key, round_, clip, sigma, global_, updates)
            out.append("aggregate " + " ".join("%.17g" % v for v in result))
        else:
            raise SystemExit("unknown record: " + f[0])
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
