#!/bin/sh
# replay.sh TARGET REPLAY SEEDS SRC — a fuzz target's corpus through its replay executable:
# the seeds the tests generate (gguf: gguf_fuzz_seeds; tok: a few texts written here) and
# SRC/regress/TARGET/, every input that ever failed. Fails when any input crashes or trips a
# check (the replay prints each input before it runs).
target=$1 replay=$2 seeds=$3 src=$4
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
case "$target" in
gguf) "$seeds" "$tmp" || { echo "FAIL: gguf_fuzz_seeds"; exit 1; } ;;
tok) # byte 0 picks the tokenizer (and flags), the rest is the text
     printf '\000hello world' >"$tmp/a"; printf '\001<|im_start|>user\nhi<|im_end|>' >"$tmp/b"
     printf '\002 123 4567 89\t\r\n' >"$tmp/c"; printf '\003\377\376 \303\251t\303\251' >"$tmp/d" ;;
*) echo "replay.sh: unknown target $target"; exit 2 ;;
esac
regress="$src/regress/$target"
[ -d "$regress" ] || regress=""   # no input of this target has failed yet
exec "$replay" "$tmp" $regress
