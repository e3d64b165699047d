/* bench_peer.h (bench) — a peer measured beside us in the same run: a Python script of bench/
 * (PyTorch's kernels, llama.cpp) started from the bench, its lines read back. The bench that
 * includes it defines _POSIX_C_SOURCE (popen) before any header. */
#ifndef AKV_BENCH_PEER_H
#define AKV_BENCH_PEER_H

#include <stdio.h>
#include <stdlib.h>

/* bench/SCRIPT ARGS run by $AKV_PYTHON (default python3) from $AKV_SOURCE_DIR (default .),
 * its stderr joined to its stdout: the pipe to read its lines from, to be ended by
 * bench_peer_close; NULL (with a note) when the command does not fit or cannot start. */
static inline FILE *bench_peer_open(const char *script, const char *args) {
    const char *src = getenv("AKV_SOURCE_DIR"), *py = getenv("AKV_PYTHON");
    char cmd[8192];
    const int len = snprintf(cmd, sizeof cmd, "%s %s/bench/%s %s 2>&1", py ? py : "python3",
                             src ? src : ".", script, args);
    FILE *p = len > 0 && len < (int)sizeof cmd ? popen(cmd, "r") : NULL;
    if (!p) printf("%s: not run (the command is too long or cannot start)\n", script);
    return p;
}

static inline void bench_peer_close(FILE *p, const char *script) {
    const int rc = pclose(p);
    if (rc != 0) printf("%s exited with status %d\n", script, rc);
}

#endif
