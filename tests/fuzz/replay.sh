#!/bin/sh
# replay.sh TARGET REPLAY SEEDS SRC — a fuzz target's corpus through its replay executable:
# the starting corpus (seeds.sh; SEEDS is gguf_fuzz_seeds) and SRC/regress/TARGET/, every
# input that ever failed. Fails when any input crashes or trips a check (the replay prints
# each input before it runs).
target=$1 replay=$2 seeds=$3 src=$4
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
sh "$src/seeds.sh" "$target" "$tmp" "$seeds" || exit 1
regress="$src/regress/$target"
[ -d "$regress" ] || regress=""   # no input of this target has failed yet
exec "$replay" "$tmp" $regress
