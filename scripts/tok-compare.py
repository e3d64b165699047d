#!/usr/bin/env python3
"""scripts/tok-compare.py MODEL.gguf TEXT_FILE [PRE] — encodes a whole file with `akv tok` and
with the Hugging Face reference of scripts/tok-reference.py (the GGUF's own vocabulary and
merges), and reports whether the id sequences are identical (else the first difference) and
the encode time of each. PRE overrides tokenizer.ggml.pre in both (gpt2, smollm, llama-bpe), so
every pre-tokenizer can be checked with one vocabulary. $AKV names the akv binary
(default build/tools/akv).

  python3 scripts/tok-compare.py models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/corpus.txt
"""
import importlib.util
import os
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("ref", os.path.join(here, "tok-reference.py"))
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)

model, path = sys.argv[1], sys.argv[2]
pre = sys.argv[3] if len(sys.argv) > 3 else None
akv = os.environ.get("AKV", os.path.join(here, "..", "build", "tools", "akv"))
raw = open(path, "rb").read()
text = raw.decode("utf-8", errors="replace")
_, tk = ref.build(model, pre)
t0 = time.perf_counter()
want = tk.encode(text, add_special_tokens=False).ids
t_hf = time.perf_counter() - t0
cmd = [akv, "tok", model, "--ids", "--no-bos", "--file", path] + (["--pre", pre] if pre else [])
out = subprocess.run(cmd, check=True, capture_output=True).stdout.split()
got = [int(x) for x in out]
print(f"{len(raw)} bytes: HF {len(want)} ids in {t_hf * 1e3:.0f} ms "
      f"({len(raw) / t_hf / 1e6:.2f} MB/s, one thread); akv {len(got)} ids")
if got == want:
    print("identical")
    sys.exit(0)
i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
print(f"first difference at id {i}: akv {got[i:i + 8]} vs HF {want[i:i + 8]}")
print("context:", repr(tk.decode(want[max(0, i - 8):i + 8])))
sys.exit(1)
