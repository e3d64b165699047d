#!/usr/bin/env python3
"""Writes tests/data/gguf_dequant_ref.bin: random blocks of every type akv decodes, and the
f32 values that gguf-py (llama.cpp's own Python GGUF package, an implementation independent of
src/gguf) decodes them to. Run with gguf==0.19.0 and numpy installed:

    python3 tests/data/gguf_dequant_ref.py tests/data/gguf_dequant_ref.bin

Format, little-endian: u32 n_records; per record: u32 ggml type, u32 n_blocks, u32 n_bytes,
u32 n_elems, the block bytes, then n_elems f32 values.
"""
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

rng = np.random.default_rng(20261129)


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).tobytes()


def random_blocks(qtype, n_blocks):
    """Random quant bytes with finite, moderate f16 scales at the right places."""
    elems, size = GGML_QUANT_SIZES[qtype]
    raw = bytearray(rng.integers(0, 256, size=n_blocks * size, dtype=np.uint8).tobytes())
    for b in range(n_blocks):
        o = b * size
        if qtype in (T.Q8_0, T.Q4_0):
            raw[o:o + 2] = f16_bytes(rng.uniform(-0.1, 0.1))
        elif qtype in (T.Q4_1, T.Q4_K, T.Q5_K):
            raw[o:o + 4] = f16_bytes(rng.uniform(-0.1, 0.1, size=2))
        elif qtype == T.Q6_K:
            raw[o + 208:o + 210] = f16_bytes(rng.uniform(-0.01, 0.01))
    return bytes(raw)


records = []
for qtype, n_blocks in ((T.F16, 64), (T.BF16, 64), (T.Q8_0, 4), (T.Q4_0, 4), (T.Q4_1, 4),
                        (T.Q4_K, 3), (T.Q6_K, 3), (T.Q5_K, 3)):
    if qtype in (T.F16, T.BF16):
        vals = rng.standard_normal(n_blocks).astype(np.float32)
        raw = vals.astype(np.float16).tobytes() if qtype == T.F16 else \
            (vals.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    else:
        raw = random_blocks(qtype, n_blocks)
    out = dequantize(np.frombuffer(raw, dtype=np.uint8), qtype).astype(np.float32).ravel()
    records.append(struct.pack("<IIII", int(qtype), n_blocks, len(raw), out.size) + raw +
                   out.tobytes())

with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<I", len(records)))
    for r in records:
        f.write(r)
