#!/bin/sh
# kv_tier.sh AKV SOURCE_DIR — the compact K/V tier's quality contract on the default model
# (SmolLM2-135M, CPU): `akv perplexity` over a Debian text (the GPL-3 licence) at ctx 1024 and
# 4096, each tier against the exact one in the same run, and a passkey hidden in long filler
# answered by each tier as by the exact one. Skips (77) without the model or the text.
#
# The bounds are regressions guards at what the tiers measure (docs/benchmarks.md, "Compact
# K/V tier"), with llama.cpp's K/V cache types on the same model and text as the peer: its
# q8_0 cache gives a mean KL of 0.0047 and 95.97 % top-1 agreement, its q4_0 0.082 and a
# perplexity 6.4 % above exact. The top-1 goals (99.5 % for q8, 97 % for q4) are not
# met on this model by either engine: its next-token distributions are flat (perplexity 18),
# so a near-tie flips at the slightest change. The perplexity bounds are looser than the
# issue's (+0.1 % for q8) because three windows are noisy: a change of the exact attention's
# rounding alone moved q8's three-window figure from -0.08 % to +0.27 % while its mean KL stayed
# at 0.0036-0.0038; over the text's seven windows it is -0.066 % (docs/benchmarks.md). The KL
# bounds are the tight guards.
akv=$1
model=$2/models/SmolLM2-135M-Instruct.Q4_1.gguf
text=/usr/share/common-licenses/GPL-3
[ -r "$model" ] || { echo "skip: no default model in models/ (run scripts/fetch-model)"; exit 77; }
[ -r "$text" ] || { echo "skip: no $text (Debian's base-files)"; exit 77; }
n_bad=0
bad() { echo "FAIL: $*"; printf '%s\n' "$out"; n_bad=$((n_bad + 1)); }

# ppl TIER CTX WINDOWS MAX_PCT MAX_KL MIN_TOP1: the tier's perplexity within MAX_PCT % above
# exact, its mean KL below MAX_KL, its top-1 agreement at least MIN_TOP1 %
ppl() {
    out=$("$akv" perplexity -m "$model" -f "$text" --device cpu --device-gib 2 --kv-tier "$1" \
          --ctx "$2" --chunks "$3" 2>&1)
    rc=$?
    line=$(printf '%s\n' "$out" | grep "^perplexity, $1:")
    if [ "$rc" != 0 ] || [ -z "$line" ]; then bad "akv perplexity --kv-tier $1 --ctx $2: exit $rc"; return; fi
    pct=$(printf '%s\n' "$line" | sed -n 's/.*(\([-+0-9.]*\) % of exact).*/\1/p')
    kl=$(printf '%s\n' "$line" | sed -n 's/.*mean \([0-9.]*\),.*/\1/p')
    top1=$(printf '%s\n' "$line" | sed -n 's/.*agreement \([0-9.]*\) %.*/\1/p')
    if awk -v p="$pct" -v k="$kl" -v t="$top1" -v mp="$4" -v mk="$5" -v mt="$6" \
           'BEGIN { exit !(p != "" && p <= mp && k <= mk && t >= mt) }'; then
        echo "ok   $1 at ctx $2 ($3 window(s)): $pct % of exact, mean KL $kl, top-1 $top1 %"
    else
        bad "$1 at ctx $2: $pct % of exact (at most $4), mean KL $kl (at most $5), top-1 $top1 % (at least $6)"
    fi
}
ppl q8 1024 3 0.5 0.006 95
ppl q4 1024 3 2 0.02 92
ppl q8 4096 1 0.25 0.006 95
ppl q4 4096 1 2 0.02 92

# A passkey at three depths of about 1800 tokens of filler, asked for at the end: each tier
# answers as the exact one does (greedy, the same tokens), and the answer holds the key.
for depth in 10 60 110; do
    prompt=$(awk -v d="$depth" -v f="The grass is green. The sky is blue. The sun is yellow. " \
        'BEGIN { for (i = 0; i < 120; i++) { if (i == d) printf "The pass key is 71432. Remember it. 71432 is the pass key. "; printf "%s", f } printf "What is the pass key? The pass key is" }')
    answers=""
    for tier in exact q8 q4; do
        a=$(printf '%s' "$prompt" | "$akv" run -m "$model" -f - --device cpu --device-gib 2 \
            --kv-tier "$tier" --temp 0 -n 6 -q 2>/dev/null | tail -c 40)
        answers="$answers|$a"
    done
    first=$(printf '%s' "$answers" | cut -d'|' -f2)
    if [ "$answers" = "|$first|$first|$first" ] && printf '%s' "$first" | grep -q 71432; then
        echo "ok   passkey at depth $depth: every tier answers 71432, as exact does"
    else
        out=$answers; bad "passkey at depth $depth: the tiers answer differently"
    fi
done

[ "$n_bad" = 0 ] || { echo "$n_bad case(s) failed"; exit 1; }
echo "all kv_tier cases passed"
