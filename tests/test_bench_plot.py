#!/usr/bin/env python3
"""test_bench_plot.py — scripts/bench_plot.py reads what the benchmarks write: tables by their
column names (a column is matched whole or by its first words: `B` is not `bus ms`), a batch-1
table's step time as a rate, bench_staged's trace named by the row printed after it, the
step-breakdown parts, the peer tables, bench_serve's JSON (akv and llama-server); and, where
matplotlib is installed, draws every plot and the index from them. Also reads the whole of
docs/benchmarks.md. Usage: test_bench_plot.py REPO_ROOT."""
import json
import os
import sys
import tempfile

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, os.path.join(root, "scripts"))
import bench_plot as bp  # noqa: E402

FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print(f"FAIL {what}")


RESULTS = """\
### The staged compact route (NVIDIA H100)

| context | tier | staged GiB/step | bus ms | step ms |
|---|---|---|---|---|
| 32768 | exact | 2.26 | 43.7 | 50.0 |
| 131072 | exact | 9.0 | 170.0 | 200.0 |
| 32768 | q4 | 0.1 | 2.0 | 10.0 |
| 131072 | q4 | 0.4 | 8.0 | 40.0 |

### Engine batch step

| context | B | step ms | floor ms | products ms | attention ms | small ms | host ms | rest ms |
|---|---|---|---|---|---|---|---|---|
| 4096 | 1 | 5.5 | 5.4 | 5.3 | 0.7 | 0.7 | 0.02 | -1.2 |
| 4096 | 32 | 15.2 | 11.2 | 6.1 | 5.9 | 0.9 | 0.35 | 2.0 |

| shape | history | akv tok/s | llama.cpp tok/s | akv / llama.cpp |
|---|---|---|---|---|
| qwen3-0.6b | 512 | 700.1 | 600.0 | 1.17 |
| qwen3-0.6b | 8192 | does not fit | 500.0 | - |

| context | route | share | step ms | / staged |
|---|---|---|---|---|
    trace, layers 1..3: H2D interval 5.0 ms a layer (worst 5.1), host issue interval 0.3 ms, copy bus time 4.800 ms
    layer: ms from layer 0's begin ...
     0: h2d    0.060  d2h    0.059  compute    5.624  issued    0.000
     1: h2d    4.500  d2h    5.643  compute   14.750  issued    0.607
     2: h2d    9.519  d2h   14.768  compute   23.869  issued    1.211
     3: h2d   18.694  d2h   23.888  compute   33.257  issued    1.747
| 131072 | host | 0.50 | 299.30 | 0.931 |
"""


def main():
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "r.md"), "w") as f:
            f.write(RESULTS)
        os.makedirs(os.path.join(d, "peer"))
        row = {"ttft": {"p50": 0.1, "p90": 0.2, "p99": 0.3}, "itl": {"p50": 0.01, "p90": 0.02, "p99": 0.03}}
        for path, title, conc in (("serve-c8.json", "H100, synthetic, c8-4k", 8),
                                  ("serve-c32.json", "H100, synthetic, c32-4k", 32),
                                  ("peer/serve-c8.json", "H100, llama-server, c8-4k", 8)):
            with open(os.path.join(d, path), "w") as f:
                json.dump({"args": {"title": title, "max_concurrency": conc, "input_len": 4096}, "rows": [row]}, f)
        with open(os.path.join(d, "broken.json"), "w") as f:
            f.write("{not json")
        tables, traces, serve = bp.read_all([d])

        check(len(tables) == 4, f"4 tables read, got {len(tables)}")
        check([len(t.rows) for t in tables] == [4, 2, 2, 1],
              f"every row, the one printed after a trace too: {[len(t.rows) for t in tables]}")
        t = tables[0]
        check(t.heading.startswith("The staged compact route"), "a table takes the heading above it")
        check(t.col("b") is None, "`b` is not matched by `bus ms`")
        check(tables[1].col("b") == 1, "`B` found whole")
        ds = bp.decode_series(tables)
        ex = [k for k in ds if k.endswith("(exact)")]
        check(len(ex) == 1 and ds[ex[0]] == [(32768.0, 20.0), (131072.0, 5.0)],
              f"the exact tier's rate from step ms, by context: {ds}")
        check(not any("Engine batch step" in k for k in ds), "a batched table is no one stream's rate")
        sr = bp.step_rows(tables)
        check(len(sr) == 2 and sr[1][0] == "4096/32" and sr[1][1]["attention ms"] == 5.9 and sr[1][3] == 11.2,
              f"the step's parts, label and floor: {sr}")
        pr = bp.peer_rows(tables)
        check(pr == [("qwen3-0.6b 512", 700.1, 600.0)], f"the peer rows that have both figures: {pr}")
        check(len(traces) == 1 and traces[0].name == "131072 host 0.50" and len(traces[0].layers) == 4
              and traces[0].bus_ms == 4.8 and traces[0].layers[3][2] == 33.257,
              f"the trace, named by the row after it: {[(x.name, x.bus_ms, x.layers) for x in traces]}")
        who = sorted((w, c) for w, c, _, _ in serve)
        check(who == [("akv", 8), ("akv", 32), ("llama-server", 8)], f"the serve runs, and the broken file left out: {who}")

        try:
            import matplotlib  # noqa: F401
            have = True
        except ImportError:
            have = False
        if have:
            out = os.path.join(d, "plots")
            os.makedirs(out)
            made = bp.draw(out, tables, traces, serve)
            check(sorted(made) == ["bus.png", "decode.png", "peers.png", "serve.png", "step.png"], f"every plot drawn: {made}")
            for m in made:
                check(os.path.getsize(os.path.join(out, m)) > 5000, f"{m} has a picture in it")
        else:
            print("matplotlib not installed: the drawing is not tested")

    t, tr = bp.read_markdown(os.path.join(root, "docs", "benchmarks.md"))
    check(len(t) >= 30 and bp.decode_series(t) and bp.step_rows(t),
          f"docs/benchmarks.md: {len(t)} tables, decode series and step rows found")
    print(f"{'FAIL' if FAILS else 'ok'}: {len(FAILS)} failed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
