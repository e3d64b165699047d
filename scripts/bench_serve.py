#!/usr/bin/env python3
"""bench_serve.py — a load client for an OpenAI-compatible server (`akv serve`, or any other),
in the manner of `vllm bench serve --dataset-name random`: random prompts of a given token
length (token ids, so every prompt is exactly that long), a fixed number of output tokens
(ignore_eos), streamed; arrivals Poisson at each request rate of a sweep (inf = all at once),
at most --max-concurrency in flight. Reports per rate: requests done and failed, duration,
request and token throughput, and TTFT / TPOT / ITL / end-to-end latency at p50 / p90 / p99
(mean too), as a markdown table (and JSON with --json).

Standard library only (threads and http.client), so it runs where nothing can be installed.

  python3 scripts/bench_serve.py --url http://127.0.0.1:8080 --input-len 256 --output-len 64 \\
      --num-prompts 32 --request-rate 1,4,inf --max-concurrency 8

A shared prefix (vLLM's --random-prefix-len): --shared-prefix N puts the same N random ids
before every prompt of a rate (a system prompt); --salt-each sends each request its own
cache_salt (akv serve, vLLM), so nothing is shared or reused: the baseline to compare with.

TTFT: request sent to the first streamed token. TPOT: (end-to-end - TTFT) / (output tokens - 1)
per request. ITL: every gap between successive streamed chunks. The server must stream one
chunk per token (akv serve does; so does vLLM) for ITL to be per token.
"""
import argparse
import http.client
import json
import math
import random
import sys
import threading
import time
import urllib.parse


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Result:
    __slots__ = ("ok", "error", "ttft", "e2e", "itl", "n_out", "n_in")

    def __init__(self):
        self.ok, self.error, self.ttft, self.e2e = False, "", 0.0, 0.0
        self.itl, self.n_out, self.n_in = [], 0, 0


def one_request(url, key, model, prompt, output_len, timeout, extra=None, temperature=0.0):
    """Streams one completion (extra: more body fields); returns a Result."""
    r = Result()
    r.n_in = len(prompt)
    u = urllib.parse.urlparse(url)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": output_len,
                       "temperature": temperature, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}, **(extra or {})}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    t0 = time.perf_counter()
    last = None
    try:
        c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
        c.request("POST", (u.path.rstrip("/") or "") + "/v1/completions", body=body,
                  headers=headers)
        resp = c.getresponse()
        if resp.status != 200:
            r.error = f"{resp.status} {resp.read()[:200].decode('utf-8', 'replace')}"
            return r
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                r.error = ev["error"].get("message", "error")
                return r
            if ev.get("usage"):
                r.n_out = ev["usage"]["completion_tokens"]
            if ev.get("choices") and ev["choices"][0].get("text"):
                now = time.perf_counter()
                if last is None:
                    r.ttft = now - t0
                else:
                    r.itl.append(now - last)
                last = now
        r.e2e = time.perf_counter() - t0
        r.ok = last is not None
        if not r.ok:
            r.error = "no token streamed"
        c.close()
    except Exception as e:  # a failed request is counted, the run goes on
        r.error = repr(e)
    return r


def run_rate(args, rate, prompts):
    results = [None] * len(prompts)
    sem = threading.Semaphore(args.max_concurrency or len(prompts))
    rng = random.Random(args.seed + 1)
    threads = []

    def worker(i):
        try:
            extra = {"cache_salt": f"bench-{rate}-{i}"} if args.salt_each else None
            results[i] = one_request(args.url, args.api_key, args.model, prompts[i],
                                     args.output_len, args.timeout, extra, args.temperature)
        finally:
            sem.release()

    t0 = time.perf_counter()
    for i in range(len(prompts)):
        sem.acquire()
        t = threading.Thread(target=worker, args=(i,), daemon=True)
        t.start()
        threads.append(t)
        if rate != math.inf and i + 1 < len(prompts):
            time.sleep(rng.expovariate(rate))
    for t in threads:
        t.join()
    dur = time.perf_counter() - t0
    ok = [r for r in results if r and r.ok]
    bad = [r for r in results if not r or not r.ok]
    n_out = sum(r.n_out or (len(r.itl) + 1) for r in ok)
    n_in = sum(r.n_in for r in ok)
    ttft = [r.ttft for r in ok]
    e2e = [r.e2e for r in ok]
    tpot = [(r.e2e - r.ttft) / (max(r.n_out, len(r.itl) + 1) - 1) for r in ok
            if max(r.n_out, len(r.itl) + 1) > 1]
    itl = [x for r in ok for x in r.itl]
    row = {"rate": rate, "done": len(ok), "failed": len(bad), "duration_s": dur,
           "req_per_s": len(ok) / dur, "out_tok_per_s": n_out / dur,
           "total_tok_per_s": (n_in + n_out) / dur,
           "errors": sorted({r.error[:120] for r in bad if r})[:5]}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        row[name] = {"mean": sum(xs) / len(xs) if xs else float("nan"),
                     **{f"p{p}": percentile(xs, p) for p in (50, 90, 99)}}
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default="default")
    ap.add_argument("--input-len", type=int, default=256, help="prompt tokens (default 256)")
    ap.add_argument("--output-len", type=int, default=64, help="tokens generated (default 64)")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--request-rate", default="inf",
                    help="requests/s, a comma-separated sweep; inf = all at once (default inf)")
    ap.add_argument("--max-concurrency", type=int, default=0, help="0 = no cap")
    ap.add_argument("--vocab-lo", type=int, default=1000, help="random ids from here ...")
    ap.add_argument("--vocab-hi", type=int, default=20000, help="... to here (exclusive)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature of every request (default 0: greedy)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--warmup", type=int, default=1, help="requests before the sweep (default 1)")
    ap.add_argument("--shared-prefix", type=int, default=0,
                    help="the same N random ids before every prompt of a rate (default 0)")
    ap.add_argument("--salt-each", action="store_true",
                    help="each request its own cache_salt: nothing shared or reused")
    ap.add_argument("--title", default="")
    ap.add_argument("--json", help="write the rows here too")
    a = ap.parse_args()
    if a.input_len < 1 or a.output_len < 1 or a.num_prompts < 1 or a.vocab_hi <= a.vocab_lo:
        ap.error("lengths and counts must be positive, --vocab-hi above --vocab-lo")
    rates = [math.inf if x.strip() == "inf" else float(x) for x in a.request_rate.split(",")]
    if any(r <= 0 for r in rates):
        ap.error("request rates must be positive")
    rng = random.Random(a.seed)
    for _ in range(a.warmup):
        w = one_request(a.url, a.api_key, a.model, [rng.randrange(a.vocab_lo, a.vocab_hi)
                                                    for _ in range(16)], 4, a.timeout)
        if not w.ok:
            print(f"bench_serve: the warm-up request failed: {w.error}", file=sys.stderr)
            return 1
    rows = []
    for rate in rates:
        # fresh prompts per rate, so no rate reuses another's cached prefixes
        prefix = [rng.randrange(a.vocab_lo, a.vocab_hi) for _ in range(a.shared_prefix)]
        prompts = [prefix + [rng.randrange(a.vocab_lo, a.vocab_hi) for _ in range(a.input_len)]
                   for _ in range(a.num_prompts)]
        row = run_rate(a, rate, prompts)
        rows.append(row)
        print(f"bench_serve: rate {rate}: {row['done']} done, {row['failed']} failed in "
              f"{row['duration_s']:.1f} s", file=sys.stderr, flush=True)
        for e in row["errors"]:
            print(f"  error: {e}", file=sys.stderr)
    ms = lambda x: f"{x * 1e3:.1f}"
    print(f"\n{a.title or 'bench_serve'}: input {a.input_len}"
          f"{f' after a shared prefix of {a.shared_prefix}' if a.shared_prefix else ''}"
          f"{', a cache_salt each' if a.salt_each else ''}, output {a.output_len}"
          f"{f' at temperature {a.temperature:g}' if a.temperature else ''}, "
          f"{a.num_prompts} prompts, max concurrency {a.max_concurrency or 'none'}\n")
    print("| rate (req/s) | done | failed | req/s | out tok/s | total tok/s | TTFT p50 / p90 / p99 "
          "(ms) | TPOT p50 / p90 / p99 (ms) | ITL p50 / p90 / p99 (ms) | E2E p50 / p90 / p99 (s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        trip = lambda k, f=ms: " / ".join(f(r[k][p]) for p in ("p50", "p90", "p99"))
        print(f"| {r['rate']} | {r['done']} | {r['failed']} | {r['req_per_s']:.2f} | "
              f"{r['out_tok_per_s']:.1f} | {r['total_tok_per_s']:.1f} | {trip('ttft')} | "
              f"{trip('tpot')} | {trip('itl')} | {trip('e2e', lambda x: f'{x:.2f}')} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1, default=str)
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
