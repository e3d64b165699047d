#!/bin/sh
# fit_cli.sh AKV — `akv fit` end to end: exit codes (0 fits, 2 usage, 3 refused) and that a
# refusal names the flag to change. Each case prints what it ran when it fails.
akv=$1
n_bad=0
expect() { # expect CODE PATTERN ARGS...: exit code CODE and PATTERN in stdout+stderr
    want=$1 pat=$2
    shift 2
    out=$("$akv" fit "$@" 2>&1)
    rc=$?
    if [ "$rc" != "$want" ] || ! printf '%s\n' "$out" | grep -q -- "$pat"; then
        echo "FAIL: akv fit $*: exit $rc (want $want), output lacks '$pat':"
        printf '%s\n' "$out"
        n_bad=$((n_bad + 1))
    else
        echo "ok   akv fit $* -> $rc"
    fi
}
smol="--layers 30 --kv-heads 3 --head-dim 64 --max-context 128K"
llama="--layers 32 --kv-heads 8 --head-dim 128 --dtype bf16 --max-context 128K"
expect 0 "histories = floor(174762 / 15360) = 11" $smol --host-gib 32 --device-gib 4 --concurrency 8
expect 3 "raise --host-gib to at least 128" $llama --host-gib 64 --device-gib 16 --concurrency 8
expect 0 "fits after shrinking: --parallel 8 -> 4" $llama --host-gib 64 --device-gib 16 --concurrency 8 --mode shrink
expect 3 "not even one" $llama --host-gib 8 --device-gib 16 --mode shrink
expect 3 "raise --device-gib" $llama --host-gib 2048 --device-gib 1 --concurrency 100
expect 3 "lower --parallel to 4" $llama --host-gib 64 --device-gib 16 --parallel 8
expect 2 "--host-gib is required" $llama --device-gib 16
expect 2 "--mode: 'maybe'" $llama --host-gib 64 --device-gib 16 --mode maybe
expect 2 "--layers: 0 is out of range" --layers 0 --kv-heads 8 --head-dim 128 --max-context 1K --host-gib 1 --device-gib 1
expect 2 "page_tokens = 3" $llama --host-gib 64 --device-gib 16 --page-tokens 3
expect 2 "--device-gib = 5000" $llama --host-gib 64 --device-gib 5000
expect 0 "usage: akv fit" --help
# -m FILE: the geometry and the default context from a GGUF's metadata (a small synthetic one)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if "$akv" gguf synth --layers 3 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 64 --ctx 2048 -o "$tmp/m.gguf" >/dev/null 2>&1; then
    expect 0 "3 layers x 2 K/V heads x head dim 16" -m "$tmp/m.gguf" --host-gib 1 --device-gib 1
    expect 0 "trained context 2048" -m "$tmp/m.gguf" --host-gib 1 --device-gib 1
    expect 0 "5 layers x 2 K/V heads" -m "$tmp/m.gguf" --layers 5 --host-gib 1 --device-gib 1
    printf 'GGUF\003' >"$tmp/bad.gguf"
    expect 1 "bad.gguf" -m "$tmp/bad.gguf" --host-gib 1 --device-gib 1
else
    echo "FAIL: akv gguf synth could not write the test model"; n_bad=$((n_bad + 1))
fi
[ "$n_bad" = 0 ] || { echo "$n_bad case(s) failed"; exit 1; }
