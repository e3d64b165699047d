#!/usr/bin/env python3
"""scripts/ref_logits.py — an independent float64 reference of the Llama forward pass in numpy.

Loads a GGUF (Llama architecture) with the `gguf` package from PyPI (its reader and its own
dequantisation), runs the whole prompt through every layer in float64, and prints the top-k
next-token ids and logits after the last prompt token. It shares no code with activekv: it
checks the C forward pass (docs/model.md records a run).

    python3 -m venv /tmp/v && /tmp/v/bin/pip install gguf numpy
    /tmp/v/bin/python scripts/ref_logits.py models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --ids 504,3575,282,4649,314 [--top 5] [--out logits.f32] [--compare akv.f32]

--out writes the last position's logits as raw float32 (the format of `akv run --dump-logits`,
one step). Only what the file says is used: every hyperparameter is read from its metadata.
"""
import argparse
import sys

import numpy as np
import gguf


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            sys.exit(f"ref_logits: missing key {key}")
        return default
    return f.contents()


def load(reader, name):
    for t in reader.tensors:
        if t.name == name:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
            return np.asarray(w, dtype=np.float64).reshape([int(n) for n in reversed(t.shape)])
    return None


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_normal(x, pos, inv_freq, n_rot):
    """Adjacent pairs (2i, 2i+1) of the first n_rot elements of each head: x [T, H, D]."""
    ang = pos[:, None] * inv_freq[None, :]  # [T, n_rot/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
    y = x.copy()
    y[..., 0:n_rot:2] = a * c - b * s
    y[..., 1:n_rot:2] = a * s + b * c
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--out", help="write the last position's logits as raw float32")
    ap.add_argument("--compare", help="raw float32 logits of another run (the first step of "
                    "`akv run --dump-logits`): print its top-k and the largest difference")
    args = ap.parse_args()

    r = gguf.GGUFReader(args.model)
    arch = field(r, "general.architecture")
    if arch != "llama":
        sys.exit(f"ref_logits: architecture {arch} is not llama")
    n_layer = int(field(r, "llama.block_count"))
    n_head = int(field(r, "llama.attention.head_count"))
    n_kv = int(field(r, "llama.attention.head_count_kv"))
    n_embd = int(field(r, "llama.embedding_length"))
    eps = float(field(r, "llama.attention.layer_norm_rms_epsilon"))
    base = float(field(r, "llama.rope.freq_base", 10000.0))
    hd = n_embd // n_head
    n_rot = int(field(r, "llama.rope.dimension_count", hd))
    factors = load(r, "rope_freqs.weight")
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    if factors is not None:
        inv_freq = inv_freq / factors

    ids = np.array([int(s) for s in args.ids.split(",")])
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    emb = load(r, "token_embd.weight")  # [vocab, n_embd]
    out_w = load(r, "output.weight")
    if out_w is None:
        out_w = emb  # tied output embedding
    x = emb[ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(n_layer):
        p = f"blk.{l}."
        h = rmsnorm(x, load(r, p + "attn_norm.weight"), eps)
        q = (h @ load(r, p + "attn_q.weight").T).reshape(T, n_head, hd)
        k = (h @ load(r, p + "attn_k.weight").T).reshape(T, n_kv, hd)
        v = (h @ load(r, p + "attn_v.weight").T).reshape(T, n_kv, hd)
        q, k = rope_normal(q, pos, inv_freq, n_rot), rope_normal(k, pos, inv_freq, n_rot)
        att = np.empty((T, n_head, hd))
        for hh in range(n_head):
            kv = hh // (n_head // n_kv)
            sc = q[:, hh, :] @ k[:, kv, :].T / np.sqrt(hd) + mask
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            sc /= sc.sum(axis=1, keepdims=True)
            att[:, hh, :] = sc @ v[:, kv, :]
        x = x + att.reshape(T, n_embd) @ load(r, p + "attn_output.weight").T
        h = rmsnorm(x, load(r, p + "ffn_norm.weight"), eps)
        g = h @ load(r, p + "ffn_gate.weight").T
        u = h @ load(r, p + "ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ load(r, p + "ffn_down.weight").T
    x = rmsnorm(x, load(r, "output_norm.weight"), eps)
    logits = x[-1] @ out_w.T
    top = np.argsort(-logits, kind="stable")[: args.top]
    for i in top:
        print(f"{i} {logits[i]:.6f}")
    if args.out:
        logits.astype(np.float32).tofile(args.out)
    if args.compare:
        other = np.fromfile(args.compare, dtype=np.float32)[: len(logits)].astype(np.float64)
        if len(other) != len(logits):
            sys.exit(f"ref_logits: {args.compare} holds fewer than {len(logits)} logits")
        otop = np.argsort(-other, kind="stable")[: args.top]
        print("compare:")
        for i in otop:
            print(f"{i} {other[i]:.6f}")
        same = list(top) == list(otop)
        print(f"top-{args.top} ids {'identical' if same else 'DIFFER'}; max |diff| "
              f"{np.max(np.abs(other - logits)):.3g}, rms {np.sqrt(np.mean((other - logits)**2)):.3g}")
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
