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

# Outputs never destroy inputs: --dump-logits naming the model, a slice written over its
# input, a FIFO (or any non-regular file) at the writer's path; all refused, all intact.
cp "$tmp/s.gguf" "$tmp/keep.gguf"
out=$("$akv" run -m "$tmp/s.gguf" -q --temp 0 -p hi -n 2 --dump-logits "$tmp/s.gguf" 2>&1); rc=$?
if [ "$rc" != 2 ] || ! cmp -s "$tmp/s.gguf" "$tmp/keep.gguf"; then
    bad "akv run --dump-logits MODEL: exit $rc (want 2, the model unchanged)"
else echo "ok   akv run --dump-logits MODEL -> $rc"; fi
out=$("$akv" gguf slice "$tmp/s.gguf" --layers 1 -o "$tmp/s.gguf" 2>&1); rc=$?
if [ "$rc" != 2 ] || ! cmp -s "$tmp/s.gguf" "$tmp/keep.gguf"; then
    bad "akv gguf slice F -o F: exit $rc (want 2, F unchanged)"
else echo "ok   akv gguf slice F -o F -> $rc"; fi
mkfifo "$tmp/fifo"
out=$("$akv" gguf slice "$tmp/s.gguf" --layers 1 -o "$tmp/fifo" 2>&1); rc=$?
if [ "$rc" != 2 ] || [ ! -p "$tmp/fifo" ] || ! printf '%s\n' "$out" | grep -q "not a regular file"; then
    bad "akv gguf slice -o FIFO: exit $rc (want 2, 'not a regular file', the FIFO left alone)"
else echo "ok   akv gguf slice -o FIFO -> $rc"; fi

# Usage errors are exit 2 and name what is wrong (a review of the CLI found these at 0 or 1).
for case in "run -m $tmp/s.gguf -p hi --device cuda:abc|not a device index" \
            "run -m $tmp/s.gguf -p hi --top-k 3000000000|is more than" \
            "gguf synth --list --bogus|unrecognized option" \
            "gguf synth --sha smollm2-135m -o $tmp/x.gguf|spell the flag out" \
            "tok $tmp/s.gguf --chat nocolon|is not ROLE:CONTENT"; do
    args=${case%%|*}; want=${case#*|}
    # shellcheck disable=SC2086
    out=$("$akv" $args 2>&1 >/dev/null); rc=$?
    if [ "$rc" != 2 ] || ! printf '%s\n' "$out" | grep -q -- "$want"; then
        bad "akv $args: exit $rc (want 2, '$want')"
    else echo "ok   akv $args -> $rc"; fi
done

# Standard output that cannot be written (a full device) is a failure, not a success.
if [ -w /dev/full ]; then
    out=$("$akv" run -m "$tmp/s.gguf" -q --temp 0 -p hi -n 2 2>&1 >/dev/full); rc=$?
    if [ "$rc" != 1 ] || ! printf '%s\n' "$out" | grep -q "writing the output failed"; then
        bad "akv run > /dev/full: exit $rc (want 1, 'writing the output failed')"
    else echo "ok   akv run > /dev/full -> $rc"; fi
fi

[ "$n_bad" = 0 ] || { echo "$n_bad case(s) failed"; exit 1; }
