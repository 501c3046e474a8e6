#!/usr/bin/python3
"""Independent reference forward of a Llama-family model (llama, qwen2, mistral), for checking the C++ trainer.

Written from the published equations (Llama: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU; Qwen2's
q/k/v bias; Llama 3's RoPE scaling, from rope_scaling or Transformers 5's rope_parameters), not from the C++ code; it
shares nothing with it but the file formats. Run with Debian's interpreter (/usr/bin/python3: python3-torch,
python3-numpy).

    llama_forward.py MODEL_DIR INPUTS OUT [MODEL_DIR INPUTS OUT ...]

INPUTS is a safetensors file with `input_ids` and `attention_mask` (I64, (B, T)); OUT receives `logits` (F32,
(B, T, V)). Conventions the C++ side documents too: a token's rotary position counts the real tokens before it; a
query attends to real keys at or before it and a padding query to itself only.
"""
import json
import math
import sys

import numpy as np
import torch

from safetensors_file import read_entries, to_float32, write_entries

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    entries, _ = read_entries(path)
    out = {}
    for name, dtype, shape, raw in entries:
        array = to_float32(raw, dtype) if dtype == "BF16" else np.frombuffer(raw, dtype=DTYPES[dtype])
        out[name] = torch.from_numpy(array.copy().reshape(shape))
    return out


def write_safetensors(path, tensors):
    write_entries(path, [(name, "F32", list(t.shape), t.contiguous().numpy().astype(np.float32).tobytes())
                         for name, t in tensors.items()])


def load_weights(model_dir):
    try:
        return read_safetensors(f"{model_dir}/model.safetensors")
    except FileNotFoundError:
        with open(f"{model_dir}/model.safetensors.index.json") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        weights = {}
        for name in files:
            weights.update(read_safetensors(f"{model_dir}/{name}"))
        return weights


def rope_settings(cfg):
    # Transformers 4 writes rope_theta at the top and scaling in rope_scaling; Transformers 5 puts both in
    # rope_parameters. A value written in both places must agree.
    settings = {}
    sources = [{"rope_theta": cfg["rope_theta"]} if "rope_theta" in cfg else {}]
    sources += [cfg.get("rope_scaling") or {}, cfg.get("rope_parameters") or {}]
    for source in sources:
        for key, value in source.items():
            key = "rope_type" if key == "type" else key
            assert settings.setdefault(key, value) == value, f"config.json gives {key} twice, differently"
    return settings


def inverse_frequencies(cfg, head_dim):
    scaling = rope_settings(cfg)
    theta = scaling.get("rope_theta", 10000.0)
    inv = [1.0 / theta ** (2 * i / head_dim) for i in range(head_dim // 2)]
    if scaling.get("rope_type", "default") == "llama3":
        # Llama 3.1: wavelengths beyond old_ctx/low are slowed by `factor`, those below old_ctx/high kept, and
        # the band between interpolated linearly in old_ctx / wavelength.
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_ctx = scaling["original_max_position_embeddings"]
        scaled = []
        for f in inv:
            wavelength = 2 * math.pi / f
            if wavelength < old_ctx / high:
                scaled.append(f)
            elif wavelength > old_ctx / low:
                scaled.append(f / factor)
            else:
                s = (old_ctx / wavelength - low) / (high - low)
                scaled.append((1 - s) * f / factor + s * f)
        inv = scaled
    return torch.tensor(inv, dtype=torch.float64)


def rms_norm(x, weight, eps):
    return weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rotate(x, cos, sin):
    # Pairs (i, i + D/2) rotate by angle position * inv_freq[i].
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def forward(model_dir, input_ids, attention_mask):
    with open(f"{model_dir}/config.json") as f:
        cfg = json.load(f)
    w = {k: v.to(torch.float64) for k, v in load_weights(model_dir).items()}
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    eps = cfg.get("rms_norm_eps", 1e-6)
    B, T = input_ids.shape

    def linear(x, prefix):
        y = x @ w[prefix + ".weight"].T
        if prefix + ".bias" in w:
            y = y + w[prefix + ".bias"]
        return y

    mask = attention_mask.to(torch.bool)
    positions = (attention_mask.cumsum(1) - 1).clamp(min=0).to(torch.float64)  # (B, T)
    angles = positions[:, :, None] * inverse_frequencies(cfg, head_dim)[None, None, :]  # (B, T, D/2)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]  # (B, 1, T, D/2)

    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    visible = (j <= i)[None] & mask[:, None, :]  # (B, T, T)
    if cfg.get("model_type") == "mistral" and cfg.get("sliding_window"):
        visible = visible & (j > i - cfg["sliding_window"])[None]
    visible = visible | torch.eye(T, dtype=torch.bool)[None]

    h = w["model.embed_tokens.weight"][input_ids]  # (B, T, C)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = linear(x, p + "self_attn.q_proj").view(B, T, n_head, head_dim).transpose(1, 2)
        k = linear(x, p + "self_attn.k_proj").view(B, T, n_kv, head_dim).transpose(1, 2)
        v = linear(x, p + "self_attn.v_proj").view(B, T, n_kv, head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        group = n_head // n_kv
        outputs = []
        for head in range(n_head):  # query head `head` reads key/value head head // group
            kh, vh = k[:, head // group], v[:, head // group]
            scores = q[:, head] @ kh.transpose(-1, -2) / math.sqrt(head_dim)  # (B, T, T)
            scores = scores.masked_fill(~visible, float("-inf"))
            outputs.append(torch.softmax(scores, dim=-1) @ vh)
        attended = torch.stack(outputs, dim=2).reshape(B, T, n_head * head_dim)
        h = h + linear(attended, p + "self_attn.o_proj")
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = linear(x, p + "mlp.gate_proj"), linear(x, p + "mlp.up_proj")
        h = h + linear(gate * torch.sigmoid(gate) * up, p + "mlp.down_proj")
    h = rms_norm(h, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return (h @ head.T).to(torch.float32)


def main(argv):
    if len(argv) < 3 or len(argv) % 3 != 0:
        sys.exit("usage: llama_forward.py MODEL_DIR INPUTS OUT [MODEL_DIR INPUTS OUT ...]")
    for model_dir, inputs_path, out_path in zip(argv[0::3], argv[1::3], argv[2::3]):
        inputs = read_safetensors(inputs_path)
        logits = forward(model_dir, inputs["input_ids"], inputs["attention_mask"])
        write_safetensors(out_path, {"logits": logits})


if __name__ == "__main__":
    main(sys.argv[1:])
