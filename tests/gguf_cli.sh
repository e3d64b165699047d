#!/bin/sh
# gguf_cli.sh AKV — `akv gguf synth` stopped by a signal while it writes: the "<out>.partial"
# file is removed and the process ends as the signal says (exit status 128 + signal number).
akv=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
n_bad=0
for sig in TERM HUP; do
    out="$tmp/big-$sig.gguf"
    # 4 GB: seconds of writing, so the signal lands while the partial file grows
    "$akv" gguf synth --layers 8 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336 --vocab 32000 \
        -o "$out" >/dev/null 2>"$tmp/err" &
    pid=$!
    i=0
    while [ ! -s "$out.partial" ] && kill -0 "$pid" 2>/dev/null && [ "$i" -lt 3000 ]; do
        sleep 0.01; i=$((i + 1))
    done
    kill -"$sig" "$pid" 2>/dev/null
    wait "$pid"
    rc=$?
    if grep -q "file system has" "$tmp/err"; then
        echo "skip SIG$sig: the file system cannot hold the 4 GB test file"
    elif [ "$rc" = 0 ]; then
        echo "skip SIG$sig: the write finished before the signal"
    elif [ -e "$out.partial" ] || [ -e "$out" ] || [ "$rc" -le 128 ]; then
        echo "FAIL: SIG$sig during akv gguf synth: exit $rc, left: $(ls "$tmp" | tr '\n' ' ')"
        n_bad=$((n_bad + 1))
    else
        echo "ok   SIG$sig during akv gguf synth -> exit $rc, no partial file left"
    fi
    rm -f "$out" "$out.partial"
done
[ "$n_bad" = 0 ] || { echo "$n_bad case(s) failed"; exit 1; }
