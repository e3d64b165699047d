#!/usr/bin/env python3
"""bench/attn_torch.py — PyTorch's scaled_dot_product_attention on the shapes of
bench_attn.c, timed the same way (CUDA graph of many calls, device events, median of
replays; inputs rotated across enough copies to exceed L2).

Arguments: configs, each
  d:HQ:HKV:D:B:L   decode, one query per sequence, B sequences of L keys (bf16)
  p:HQ:HKV:D:L     causal prefill of L tokens, one sequence (bf16)
Prints one line per config:
  decode HQ HKV D B L <us default> <us best> <best backend>
  prefill HQ HKV D L <us flash> <how>
A config PyTorch cannot run prints 'nan'. Lines starting with '#' are notes.
"""
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

L2_DEFEAT_BYTES = 256 << 20
# the fused backends (MATH materialises the scores and is never the fastest here)
BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION)]


def time_us(fn, n_sets, n_calls, n_reps=15):
    """Median device time of one fn(i) call, i rotating over n_sets input sets."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            fn(i % n_sets)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    n_calls = max(n_calls, n_sets)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n_calls):
            fn(i % n_sets)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(n_reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    del g
    return 1000.0 * statistics.median(times) / n_calls


def decode(hq, hkv, d, b, n):
    set_bytes = 2 * b * hkv * n * d * 2
    n_sets = max(1, min(64, math.ceil(L2_DEFEAT_BYTES / set_bytes)))
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    ks = [torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(n_sets)]
    vs = [torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(n_sets)]
    fn = lambda i: F.scaled_dot_product_attention(q, ks[i], vs[i], enable_gqa=True)
    n_calls = 40
    try:
        default = time_us(fn, n_sets, n_calls)
    except Exception as e:  # noqa: BLE001
        print(f"# decode {hq}/{hkv} d{d} B{b} L{n}: default failed: {e}".replace("\n", " "))
        default = float("nan")
    best, best_name = default, "default"
    for name, be in BACKENDS:
        try:
            with sdpa_kernel([be]):
                t = time_us(fn, n_sets, n_calls)
        except Exception:  # noqa: BLE001 — a backend that does not take the shape
            continue
        if not (t >= best):
            best, best_name = t, name
    del ks, vs
    torch.cuda.empty_cache()
    return default, best, best_name


def prefill(hq, hkv, d, n):
    q = torch.randn(1, hq, n, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16)
    how = "flash gqa"
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            fn = lambda i: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            t = time_us(fn, 1, 3, 7)
    except Exception:  # noqa: BLE001 — flash without GQA: expand K/V outside the timing
        how = "flash, K/V expanded"
        ke = k.repeat_interleave(hq // hkv, dim=1)
        ve = v.repeat_interleave(hq // hkv, dim=1)
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                fn = lambda i: F.scaled_dot_product_attention(q, ke, ve, is_causal=True)
                t = time_us(fn, 1, 3, 7)
        except Exception as e:  # noqa: BLE001
            print(f"# prefill {hq}/{hkv} d{d} L{n}: flash failed: {e}".replace("\n", " "))
            t, how = float("nan"), "failed"
    torch.cuda.empty_cache()
    return t, how


def main():
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    for cfg in sys.argv[1:]:
        kind, *vals = cfg.split(":")
        vals = [int(x) for x in vals]
        if kind == "d":
            default, best, name = decode(*vals)
            print("decode", *vals, f"{default:.3f}", f"{best:.3f}", name, flush=True)
        elif kind == "p":
            t, how = prefill(*vals)
            print("prefill", *vals, f"{t:.3f}", how.replace(" ", "_"), flush=True)


if __name__ == "__main__":
    main()
