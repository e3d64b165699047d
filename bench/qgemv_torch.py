#!/usr/bin/env python3
"""bench/qgemv_torch.py — PyTorch's 4-bit weight product (torch._weight_int4pack_mm, the
tinygemm kernel gpt-fast and torchao decode with) on the decode products of bench_fwd.c,
timed the way bench_fwd times its own: the same weights launched 20 times back to back,
device events around the 20, the mean; and also "cold", one launch each of enough copies of
the weights to exceed L2.

Arguments: configs, each
  M:N:K:G      y[M][N] = x[M][K] W^T, W in 4 bits with a bf16 scale and zero per G weights
Prints one line per config:
  int4 M N K G <bytes> <us warm> <us cold>
and first a line `copy <GB/s>`: the device copy rate (1 GiB, read + written, best of 9).
A config PyTorch cannot run prints 'nan' with the reason after '#'.
"""
import sys

import torch

L2_DEFEAT_BYTES = 256 << 20
LAUNCHES = 20


def copy_rate():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    best = 1e9
    for _ in range(9):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) / 1e3)
    return 2 * n / best


def pack(n, k, inner_k_tiles=8):
    """Random 4-bit weights [n][k] packed for _weight_int4pack_mm, whichever form this
    PyTorch takes (uint8 [n][k/2] since 2.5, int32 [n][k] before)."""
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, device="cuda")
    try:
        u8 = (q[:, 0::2] << 4 | q[:, 1::2]).to(torch.uint8)
        return torch._convert_weight_to_int4pack(u8, inner_k_tiles)
    except (RuntimeError, TypeError):
        return torch._convert_weight_to_int4pack(q, inner_k_tiles)


def events_us(fn, reps):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn(0)
    torch.cuda.synchronize()
    s.record()
    for i in range(reps):
        fn(i)
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3 / reps


def run(m, n, k, g):
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    w_bytes = n * k // 2 + (k // g) * n * 2 * 2
    copies = max(1, -(-L2_DEFEAT_BYTES // w_bytes))
    ws = [pack(n, k) for _ in range(copies)]
    sz = [torch.randn(k // g, n, 2, dtype=torch.bfloat16, device="cuda") * 0.01 for _ in range(copies)]
    mm = torch._weight_int4pack_mm
    warm = min(events_us(lambda i: mm(x, ws[0], g, sz[0]), LAUNCHES) for _ in range(5))
    cold = min(events_us(lambda i: mm(x, ws[i % copies], g, sz[i % copies]), max(copies, LAUNCHES))
               for _ in range(5))
    return w_bytes, warm, cold


def main():
    print(f"copy {copy_rate() / 1e9:.0f}")
    for cfg in sys.argv[1:]:
        m, n, k, g = (int(v) for v in cfg.split(":"))
        try:
            b, warm, cold = run(m, n, k, g)
            print(f"int4 {m} {n} {k} {g} {b} {warm:.1f} {cold:.1f}")
        except Exception as ex:  # a config this PyTorch cannot run
            print(f"int4 {m} {n} {k} {g} nan nan nan # {type(ex).__name__}: {str(ex).splitlines()[0][:120]}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
