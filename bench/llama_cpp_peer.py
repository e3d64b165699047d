#!/usr/bin/env python3
"""bench/llama_cpp_peer.py — llama.cpp on the same model and cores, measured as bench_cpu.c
measures activekv: per prompt length N, prefill N tokens (batches of 512), then decode 64
tokens one at a time; decode rate = 64 / their time, at a mean history of N + 32.

Through llama-cpp-python (`pip install llama-cpp-python` builds llama.cpp for this CPU);
without it the script prints a note and exits 0.

Arguments: MODEL THREADS N [N ...]
Prints one line per N:  llama.cpp N <prefill tok/s> <history> <decode tok/s>
"""
import sys
import time

try:
    from llama_cpp import Llama
except ImportError:
    print("note: llama-cpp-python is not installed (pip install llama-cpp-python): no peer")
    sys.exit(0)

N_GEN = 64


def main():
    path, threads, lengths = sys.argv[1], int(sys.argv[2]), [int(v) for v in sys.argv[3:]]
    llm = Llama(model_path=path, n_ctx=max(lengths) + 2 * N_GEN, n_threads=threads,
                n_threads_batch=threads, n_batch=512, verbose=False)
    base = llm.tokenize(b"The quick brown fox jumps over the lazy dog; then it measures twice.",
                        add_bos=False)
    llm.eval([llm.token_bos()] + base)  # warm: the weights paged in, the threads started
    for n in lengths:
        toks = [llm.token_bos()] + (base * (n // len(base) + 1))[: n - 1]
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(toks)
        t1 = time.perf_counter()
        for _ in range(N_GEN):
            llm.eval([toks[-1]])
        t2 = time.perf_counter()
        print(f"llama.cpp {n} {n / (t1 - t0):.1f} {n + N_GEN // 2} {N_GEN / (t2 - t1):.1f}", flush=True)


if __name__ == "__main__":
    main()
