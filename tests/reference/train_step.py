#!/usr/bin/python3
"""Baseline for bench/train.cc: one LoRA fine-tuning step of a Llama model, written in Python with Debian's
python3-torch (the same libtorch 1.13 the C++ trainer links), timed the same way.

The step mirrors the C++ trainer's: frozen fp32 base weights cast to the compute dtype on the fly (fp32 or bf16),
RMSNorm statistics, softmax and logits in fp32, LoRA (A: (r, in), B: (out, r), scale alpha/r) on the chosen
projections, shifted next-token cross-entropy, backward, gradient clipping at 1.0, AdamW. Attention is written out
(scores, causal mask, softmax, weighted sum): libtorch 1.13 has no fused attention for either side.

    train_step.py --hidden 768 --layers 12 --heads 12 --kv-heads 12 --intermediate 2048 --vocab 32000 \
                  --seq 256 --batch 4 --lora-r 16 --dtypes fp32,bf16 --steps 2 --threads 1

Runs `steps` steps per dtype and reports the fastest in process CPU time (time.process_time()), as bench_train does
for its own side: robust to other work sharing the machine.
Prints one JSON object per dtype: {"dtype", "tokens_per_s", "step_s", "threads", "params", "trainable"}, then
{"peak_rss_mb": ...} for the whole process.
"""
import argparse
import json
import math
import resource
import time

import torch


def build(args):
    g = torch.Generator().manual_seed(0)
    C, V, I = args.hidden, args.vocab, args.intermediate
    head_dim = C // args.heads
    kv = args.kv_heads * head_dim

    def weight(out, inp):
        return torch.randn(out, inp, generator=g) * 0.02

    base = {"embed": torch.randn(V, C, generator=g) * 0.02, "norm": torch.ones(C), "layers": []}
    lora = []
    for _ in range(args.layers):
        layer = {"q": weight(C, C), "k": weight(kv, C), "v": weight(kv, C), "o": weight(C, C),
                 "gate": weight(I, C), "up": weight(I, C), "down": weight(C, I),
                 "in_norm": torch.ones(C), "post_norm": torch.ones(C), "lora": {}}
        for name in ("q", "v"):
            out, inp = layer[name].shape
            a = (torch.rand(args.lora_r, inp, generator=g) * 2 - 1) / math.sqrt(inp)
            b = torch.zeros(out, args.lora_r)
            a.requires_grad_(True)
            b.requires_grad_(True)
            layer["lora"][name] = (a, b)
            lora += [a, b]
        base["layers"].append(layer)
    return base, lora


def forward(base, ids, args, cd):
    B, T = ids.shape
    C = args.hidden
    n_head, n_kv = args.heads, args.kv_heads
    head_dim = C // n_head
    scale = args.lora_alpha / args.lora_r

    def rms(x, w):
        x32 = x.float()
        return w.to(cd) * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(cd)

    def linear(x, layer, name):
        y = torch.nn.functional.linear(x, layer[name].to(cd))
        if name in layer["lora"]:
            a, b = layer["lora"][name]
            y = y + torch.nn.functional.linear(torch.nn.functional.linear(x, a.to(cd)), b.to(cd)) * scale
        return y

    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos().to(cd), emb.sin().to(cd)

    def rope(x):
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    causal = torch.full((T, T), float("-inf")).triu(1)
    h = torch.nn.functional.embedding(ids, base["embed"].to(cd))
    for layer in base["layers"]:
        n = rms(h, layer["in_norm"])
        q = linear(n, layer, "q").view(B, T, n_head, head_dim).transpose(1, 2)
        k = linear(n, layer, "k").view(B, T, n_kv, head_dim).transpose(1, 2)
        v = linear(n, layer, "v").view(B, T, n_kv, head_dim).transpose(1, 2)
        q, k = rope(q), rope(k)
        if n_kv != n_head:
            k = k.repeat_interleave(n_head // n_kv, dim=1)
            v = v.repeat_interleave(n_head // n_kv, dim=1)
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(head_dim) + causal
        attn = torch.softmax(scores, dim=-1).to(cd) @ v
        h = h + linear(attn.transpose(1, 2).reshape(B, T, C), layer, "o")
        n = rms(h, layer["post_norm"])
        h = h + linear(torch.nn.functional.silu(linear(n, layer, "gate")) * linear(n, layer, "up"), layer, "down")
    h = rms(h, base["norm"])
    return torch.nn.functional.linear(h, base["embed"].to(cd)).float()


def main():
    p = argparse.ArgumentParser()
    for name, default in [("hidden", 768), ("layers", 12), ("heads", 12), ("kv-heads", 12), ("intermediate", 2048),
                          ("vocab", 32000), ("seq", 256), ("batch", 4), ("lora-r", 16), ("steps", 2), ("threads", 1)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--lora-alpha", type=float, default=32.0)
    p.add_argument("--dtypes", default="fp32,bf16")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base, lora = build(args)
    params = sum(t.numel() for t in [base["embed"], base["norm"]]) + sum(
        t.numel() for layer in base["layers"] for key, t in layer.items() if key != "lora")
    trainable = sum(t.numel() for t in lora)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1))
    for dtype_name in args.dtypes.split(","):
        cd = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        optimizer = torch.optim.AdamW(lora, lr=1e-4, weight_decay=0.0)
        times = []
        for step in range(args.steps):
            start = time.process_time()
            optimizer.zero_grad()
            logits = forward(base, ids, args, cd)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, args.vocab), ids[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(lora, 1.0)
            optimizer.step()
            loss.item()
            times.append(time.process_time() - start)
        step_s = min(times)
        print(json.dumps({"dtype": dtype_name, "tokens_per_s": args.batch * args.seq / step_s, "step_s": step_s,
                          "threads": torch.get_num_threads(), "params": params, "trainable": trainable}), flush=True)
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}), flush=True)


if __name__ == "__main__":
    main()
