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

# --chat from standard input, replies cut by -n: the next turn's context holds every token
# of the previous reply. Two turns of -n 2 (this model stops at no token): decode steps are
# 1 per reply (its last token needs no pass at once), plus 1 in turn 2 for the cut token of
# reply 1, which the history must hold.
out=$(printf 'hello\nworld\n' | "$akv" run -m "$tmp/s.gguf" --temp 0 --chat -n 2 2>&1 >/dev/null); rc=$?
if [ "$rc" != 0 ] || ! printf '%s\n' "$out" | grep -q "^decode: 3 tokens"; then
    bad "akv run --chat -n 2, two turns: exit $rc (want 0, 'decode: 3 tokens')"
else echo "ok   akv run --chat -n 2, two turns -> $rc"; fi

[ "$n_bad" = 0 ] || { echo "$n_bad case(s) failed"; exit 1; }
