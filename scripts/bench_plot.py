#!/usr/bin/env python3
"""bench_plot.py — the benchmark report's plots and index, from what the benchmarks wrote.

Usage: bench_plot.py [-o DIR] [--check] PATH...

PATH is a file or a directory (its *.md, *.log and *.json, recursively). Every markdown table
is read with the heading above it (a `#` line, or a bench_serve title line); bench_staged's
per-layer traces (AKV_BENCH_TRACE) and bench_serve's --json files are read too. The plots drawn,
each where its inputs are found (docs/trace.md, "The report"):

  decode.png  decode tokens/s against context, a line per table and route, tier or column
              (columns `decode tokens/s`, `... tok/s`, or a batch-1 table's `step ms`);
  peers.png   akv against llama.cpp, tables with `akv tok/s` and `llama.cpp tok/s` columns;
  step.png    where a step goes: weight products / attention / small kernels / host / the rest,
              a stacked bar per (context, batch), the step and its floor marked (engine part P);
  bus.png     bus use over a step: layers whose copies were done, and layers computed, against
              time, beside the bus at its large-copy rate (the traces);
  serve.png   time to first token and inter-token latency (p50, p99) against concurrency, akv
              and llama-server (bench_serve's JSON files).

Writes DIR/index.md (every table found, by heading and source, and the images) and the PNGs
into DIR (default: the first PATH if it is a directory, else the current one). --check parses
and prints what would be drawn, without matplotlib (the test in CI).
"""
import argparse
import glob
import json
import math
import os
import re
import sys


# ---- reading ----------------------------------------------------------------------------------

class Table:
    def __init__(self, source, heading, header, rows):
        self.source, self.heading, self.header, self.rows = source, heading, header, rows

    def col(self, *names):
        """The index of the first column named one of names (exactly, else as its first words)."""
        low = [h.lower() for h in self.header]
        for n in names:
            if n in low:
                return low.index(n)
        for n in names:
            for i, h in enumerate(low):
                if h.startswith(n + " "):
                    return i
        return None

    def title(self):
        h = self.heading or os.path.basename(self.source)
        return h if len(h) <= 70 else h[:67] + "..."


class Trace:
    def __init__(self, source, name, bus_ms, layers):
        self.source, self.name, self.bus_ms, self.layers = source, name, bus_ms, layers


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def number(s):
    """A cell's number (1.23, 1.23x, 45 %, 1,024), else None."""
    s = s.replace(",", "").replace("*", "").strip()
    m = re.match(r"^-?\d+(\.\d+)?", s)
    return float(m.group(0)) if m else None


TRACE_LINE = re.compile(r"^\s*(\d+): h2d\s+([-\d.]+)\s+d2h\s+([-\d.]+)\s+compute\s+([-\d.]+)\s+issued\s+([-\d.]+)")
TRACE_HEAD = re.compile(r"trace, layers .*copy bus time ([\d.]+) ms")


def read_markdown(path):
    tables, traces = [], []
    heading = None
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    i = 0
    pending = None  # a trace waiting for the table row that names it
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif re.match(r"^\S.*: input \d+", line):  # bench_serve's title line
            heading = line.strip()
        m = TRACE_HEAD.search(line)
        if m:
            layers = []
            j = i + 1
            while j < len(lines) and not TRACE_LINE.match(lines[j]):
                j += 1
            while j < len(lines) and TRACE_LINE.match(lines[j]):
                t = TRACE_LINE.match(lines[j])
                layers.append(tuple(float(t.group(k)) for k in range(2, 6)))
                j += 1
            pending = Trace(path, None, float(m.group(1)), layers)
            traces.append(pending)
            i = j
            continue
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|\s*$", lines[i + 1]):
            header = cells(line)
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(cells(lines[j]))
                j += 1
            tables.append(Table(path, heading, header, rows))
            i = j
            continue
        if line.startswith("|"):
            # bench_staged prints each row after its trace: it names the trace and belongs to
            # the table above it
            if pending is not None and pending.name is None:
                pending.name = " ".join(c for c in cells(line)[:3] if c)
            if tables and len(cells(line)) == len(tables[-1].header):
                tables[-1].rows.append(cells(line))
        i += 1
    for n, t in enumerate(traces):
        if t.name is None:
            t.name = f"trace {n + 1}"
    return tables, traces


def read_serve_json(path):
    """A bench_serve --json file: (who, concurrency, input length, its first row), or None."""
    try:
        with open(path) as f:
            d = json.load(f)
        a, r = d["args"], d["rows"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    title = str(a.get("title") or "")
    who = "llama-server" if "llama-server" in title or "/peer/" in path else "akv"
    conc = a.get("max_concurrency")
    if not conc:
        return None
    return who, int(conc), int(a.get("input_len") or 0), r


def read_all(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            for ext in ("md", "log", "json"):
                files += sorted(glob.glob(os.path.join(p, "**", f"*.{ext}"), recursive=True))
        elif os.path.exists(p):
            files.append(p)
        else:
            sys.exit(f"bench_plot: no such file or directory: {p}")
    tables, traces, serve = [], [], []
    for f in files:
        if f.endswith(".json"):
            s = read_serve_json(f)
            if s:
                serve.append(s)
            continue
        t, tr = read_markdown(f)
        tables += t
        traces += tr
    return tables, traces, serve


# ---- what each plot takes ---------------------------------------------------------------------

RATE_COLS = ("decode tokens/s", "resident tok/s", "staged tok/s", "tok/s")


def decode_series(tables):
    """{label: [(context, tokens/s)]} from every table with a context column and a rate."""
    out = {}
    for t in tables:
        c = t.col("context")
        if c is None or t.col("akv tok/s") is not None:
            continue
        if t.col("b") is not None:
            continue  # batched steps: not one stream's rate
        group = t.col("route", "tier", "share")
        rate_cols = [i for i, h in enumerate(t.header) if h.lower() in RATE_COLS or h.lower().endswith(" tok/s")]
        step = t.col("step ms") if not rate_cols else None
        for row in t.rows:
            if len(row) != len(t.header):
                continue
            x = number(row[c])
            if x is None or x <= 0:
                continue
            tag = f" ({row[group]})" if group is not None else ""
            for i in rate_cols:
                y = number(row[i])
                if y is not None and y > 0:
                    out.setdefault(f"{t.title()}: {t.header[i]}{tag}", []).append((x, y))
            if step is not None:
                y = number(row[step])
                if y is not None and y > 0:
                    out.setdefault(f"{t.title()}{tag}", []).append((x, 1e3 / y))
    return {k: sorted(v) for k, v in out.items() if len(v) >= 2}


def peer_rows(tables):
    """[(label, akv tok/s, llama.cpp tok/s)] from the peer tables."""
    out = []
    for t in tables:
        a, l = t.col("akv tok/s"), t.col("llama.cpp tok/s")
        if a is None or l is None:
            continue
        for row in t.rows:
            if len(row) != len(t.header):
                continue
            x, y = number(row[a]), number(row[l])
            if x is not None and y is not None:
                out.append((" ".join(row[:min(a, l)]), x, y))
    return out


STEP_PARTS = ("products ms", "attention ms", "small ms", "host ms", "rest ms")


def step_rows(tables):
    """[(label, {part: ms}, step ms, floor ms)] from the step-breakdown tables."""
    out = []
    for t in tables:
        idx = [t.col(p) for p in STEP_PARTS]
        if any(i is None for i in idx[:2]):
            continue
        c, b, s, fl = t.col("context"), t.col("b"), t.col("step ms"), t.col("floor ms")
        for row in t.rows:
            if len(row) != len(t.header):
                continue
            parts = {p: number(row[i]) or 0.0 for p, i in zip(STEP_PARTS, idx) if i is not None}
            label = "/".join(row[i] for i in (c, b) if i is not None)
            out.append((label, parts, number(row[s]) if s is not None else None,
                        number(row[fl]) if fl is not None else None))
    return out


# ---- drawing ----------------------------------------------------------------------------------

def draw(out_dir, tables, traces, serve):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def save(fig, name):
        p = os.path.join(out_dir, name)
        fig.savefig(p, dpi=110, bbox_inches="tight")
        plt.close(fig)
        made.append(name)

    ds = decode_series(tables)
    if ds:
        fig, ax = plt.subplots(figsize=(10, 6))
        for k, v in ds.items():
            ax.plot([x for x, _ in v], [y for _, y in v], marker="o", label=k)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("decode tokens/s (one stream)")
        ax.set_title("Decode against context")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="best")
        save(fig, "decode.png")

    pr = peer_rows(tables)
    if pr:
        fig, ax = plt.subplots(figsize=(max(6, len(pr) * 0.9), 5))
        xs = range(len(pr))
        ax.bar([x - 0.2 for x in xs], [a for _, a, _ in pr], 0.4, label="akv")
        ax.bar([x + 0.2 for x in xs], [l for _, _, l in pr], 0.4, label="llama.cpp")
        for x, (_, a, l) in zip(xs, pr):
            ax.text(x, max(a, l), f"{a / l:.2f}x", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([n for n, _, _ in pr], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("decode tokens/s")
        ax.set_title("akv against llama.cpp, same file, same machine")
        ax.legend()
        save(fig, "peers.png")

    sr = step_rows(tables)
    if sr:
        fig, ax = plt.subplots(figsize=(max(6, len(sr) * 0.8), 5))
        xs = list(range(len(sr)))
        bottom = [0.0] * len(sr)
        for p in STEP_PARTS:
            h = [max(0.0, parts.get(p, 0.0)) for _, parts, _, _ in sr]
            if any(h):
                ax.bar(xs, h, 0.6, bottom=bottom, label=p.replace(" ms", ""))
                bottom = [b + v for b, v in zip(bottom, h)]
        for x, (_, _, step, floor) in zip(xs, sr):
            if step:
                ax.plot([x - 0.35, x + 0.35], [step, step], color="black", lw=2)
            if floor:
                ax.plot([x - 0.35, x + 0.35], [floor, floor], color="red", lw=1, ls="--")
        ax.plot([], [], color="black", lw=2, label="step")
        ax.plot([], [], color="red", lw=1, ls="--", label="floor")
        ax.set_xticks(xs)
        ax.set_xticklabels([l for l, _, _, _ in sr], rotation=30, ha="right", fontsize=8)
        ax.set_xlabel("context / batch")
        ax.set_ylabel("ms")
        ax.set_title("Where a step goes (op-by-op parts; a negative rest drawn as 0)")
        ax.legend(fontsize=8)
        save(fig, "step.png")

    tr = [t for t in traces if len(t.layers) >= 2][:6]
    if tr:
        n = len(tr)
        cols = 2 if n > 1 else 1
        rows = math.ceil(n / cols)
        fig, axs = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
        for ax, t in zip([a for r in axs for a in r], tr):
            ls = list(range(1, len(t.layers) + 1))
            ax.step([l[0] for l in t.layers], ls, where="post", label="copies done (H2D)")
            ax.step([l[2] for l in t.layers], ls, where="post", label="computed")
            t0 = t.layers[0][0]
            ax.plot([t0, t0 + t.bus_ms * len(ls)], [1, len(ls) + 1], ls="--", color="gray",
                    label=f"bus at its rate ({t.bus_ms:.2f} ms a layer)")
            ax.set_title(t.name, fontsize=9)
            ax.set_xlabel("ms from the step's first layer")
            ax.set_ylabel("layers")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        for ax in [a for r in axs for a in r][n:]:
            ax.axis("off")
        fig.suptitle("Bus use over a step (per-layer trace)")
        save(fig, "bus.png")

    if serve:
        fig, axs = plt.subplots(1, 2, figsize=(12, 5))
        groups = {}
        for who, conc, inlen, r in serve:
            groups.setdefault((who, inlen), []).append((conc, r))
        for (who, inlen), v in sorted(groups.items()):
            v.sort()
            for ax, key, name in ((axs[0], "ttft", "TTFT"), (axs[1], "itl", "ITL")):
                for p, ls in (("p50", "-"), ("p99", ":")):
                    ys = [r[key][p] * 1e3 if r.get(key) else float("nan") for _, r in v]
                    ax.plot([c for c, _ in v], ys, ls=ls, marker="o", label=f"{who}, prompt {inlen}, {p}")
                ax.set_title(name)
        for ax in axs:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("concurrent streams")
            ax.set_ylabel("ms")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle("Serving latency against concurrency (bench_serve, request rate inf)")
        save(fig, "serve.png")
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("-o", "--out", help="where index.md and the PNGs go")
    ap.add_argument("--check", action="store_true", help="parse and say what would be drawn; no matplotlib")
    a = ap.parse_args()
    tables, traces, serve = read_all(a.paths)
    plan = {
        "decode.png": len(decode_series(tables)),
        "peers.png": len(peer_rows(tables)),
        "step.png": len(step_rows(tables)),
        "bus.png": len([t for t in traces if len(t.layers) >= 2]),
        "serve.png": len(serve),
    }
    print(f"bench_plot: {len(tables)} tables, {len(traces)} traces, {len(serve)} serve runs")
    for k, v in plan.items():
        print(f"  {k}: {v} {'series' if k == 'decode.png' else 'inputs'}" + ("" if v else " (not drawn)"))
    if a.check:
        return 0 if tables or traces or serve else 1
    out = a.out or (a.paths[0] if os.path.isdir(a.paths[0]) else ".")
    os.makedirs(out, exist_ok=True)
    try:
        made = draw(out, tables, traces, serve)
    except ImportError:
        print("bench_plot: matplotlib is not installed (pip install matplotlib); no plots drawn", file=sys.stderr)
        made = []
    with open(os.path.join(out, "index.md"), "w") as f:
        f.write("# Benchmark report\n\n")
        for m in made:
            f.write(f"![{m}]({m})\n\n")
        f.write("## Tables\n\n")
        for t in tables:
            f.write(f"- {t.heading or '(no heading)'} ({os.path.relpath(t.source, out)}: "
                    f"{len(t.rows)} rows; {', '.join(t.header[:4])}...)\n")
    print(f"bench_plot: {out}/index.md" + (f" and {', '.join(made)}" if made else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
