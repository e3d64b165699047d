#!/bin/sh
# run_cli.sh AKV SOURCE_DIR — `akv run` end to end on hostile inputs, over a small synthetic
# model that borrows the default model's tokenizer (skips, 77, without the default model).
# Each case prints what it ran when it fails.
akv=$1
model=$2/models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -r "$model" ] || { echo "skip: no default model in models/ (run scripts/fetch-model)"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$akv" gguf synth --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab-from "$model" \
    -o "$tmp/s.gguf" >/dev/null 2>&1 || { echo "FAIL: akv gguf synth"; exit 1; }
n_bad=0
bad() { echo "FAIL: $*"; printf '%s\n' "$out"; n_bad=$((n_bad + 1)); }

# An empty prompt encodes to no tokens (this tokenizer adds no BOS): nothing to sample from.
out=$("$akv" run -m "$tmp/s.gguf" -q --temp 0 -p "" -n 2 2>&1); rc=$?
if [ "$rc" != 2 ] || ! printf '%s\n' "$out" | grep -q "prompt is empty"; then
    bad "akv run -p '': exit $rc (want 2, 'prompt is empty')"
else echo "ok   akv run -p '' -> $rc"; fi

[ "$n_bad" = 0 ] || { echo "$n_bad case(s) failed"; exit 1; }
