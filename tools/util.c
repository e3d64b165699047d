/* util.c — helpers shared by the akv subcommands. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "akv/log.h"
#include "cmd.h"
#ifdef AKV_HAVE_CUDA
#include "akv/dev_cuda.h"
#endif

static char partial_path[4096]; /* "<path>.partial", set before the handlers go in */
static const int partial_signals[] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction partial_saved[3];
static int partial_on; /* the handlers are in (partial_saved holds what they replaced) */

static void partial_on_signal(int sig) {
    unlink(partial_path); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

int akv_tool_partial_guard(const char *path) {
    enum { N = sizeof partial_signals / sizeof *partial_signals };
    if (!path) {
        for (size_t i = 0; partial_on && i < N; i++) sigaction(partial_signals[i], &partial_saved[i], NULL);
        partial_on = 0;
        return 1;
    }
    size_t n = strlen(path);
    if (partial_on || n + sizeof ".partial" > sizeof partial_path) return 0;
    memcpy(partial_path, path, n);
    memcpy(partial_path + n, ".partial", sizeof ".partial");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = partial_on_signal;
    for (size_t i = 0; i < N; i++) {
        sigaction(partial_signals[i], NULL, &partial_saved[i]);
        /* a signal ignored at start (nohup, a background job's SIGINT) stays ignored */
        if (partial_saved[i].sa_handler != SIG_IGN) sigaction(partial_signals[i], &sa, NULL);
    }
    partial_on = 1;
    return 1;
}

int akv_tool_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int akv_tool_parse_max(const char *cmd, const char *flag, const char *s, unsigned long long max,
                       unsigned long long *out) {
    unsigned long long v;
    if (!akv_tool_parse_u64(cmd, flag, s, &v)) return 0;
    if (v > max) {
        fprintf(stderr, "akv %s: --%s: %llu is more than %llu\n", cmd, flag, v, max);
        return 0;
    }
    *out = v;
    return 1;
}

int akv_tool_parse_float(const char *cmd, const char *flag, const char *s, double lo, double hi,
                         float *out) {
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : NAN;
    if (!s || errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "akv %s: --%s: '%s' is not a number in [%g, %g]\n", cmd, flag,
                s ? s : "", lo, hi);
        return 0;
    }
    *out = (float)v;
    return 1;
}

int akv_tool_parse_u64(const char *cmd, const char *flag, const char *s, unsigned long long *out) {
    char *end = NULL;
    errno = 0;
    if (!s || *s < '0' || *s > '9') goto bad; /* digits only: no sign, no blank */
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) goto bad;
    unsigned long long mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1ull << 30, end++;
    if (*end) goto bad;
    if (v > ~0ull / mul) goto bad;
    *out = v * mul;
    return 1;
bad:
    fprintf(stderr, "akv %s: --%s: '%s' is not a non-negative integer (K/M/G suffixes allowed)\n",
            cmd, flag, s ? s : "");
    return 0;
}

akv_status akv_tool_open_device(const char *spec, akv_dev **out) {
    akv_dev_params p = akv_dev_default_params();
    if (!spec || !strcmp(spec, "auto")) {
#ifdef AKV_HAVE_CUDA
        if (akv_dev_create(akv_dev_cuda_backend(), &p, out) == AKV_OK) return AKV_OK;
#endif
        return akv_dev_create(akv_dev_host_backend(), &p, out);
    }
    if (!strcmp(spec, "cpu") || !strcmp(spec, "host"))
        return akv_dev_create(akv_dev_host_backend(), &p, out);
    if (!strcmp(spec, "cuda") || !strncmp(spec, "cuda:", 5)) {
        if (spec[4] == ':') {
            /* a device index: digits only, nothing after them */
            const char *d = spec + 5;
            size_t n = strspn(d, "0123456789");
            if (n == 0 || n > 4 || d[n] != '\0') {
                fprintf(stderr, "akv: --device '%s': '%s' is not a device index (cuda:0, cuda:1, ...)\n", spec, d);
                return AKV_EINVAL;
            }
#ifdef AKV_HAVE_CUDA
            p.device_index = atoi(d);
#endif
        }
#ifdef AKV_HAVE_CUDA
        akv_status st = akv_dev_create(akv_dev_cuda_backend(), &p, out);
        if (st != AKV_OK) fprintf(stderr, "akv: cannot open CUDA device %d: %s\n", p.device_index,
                                  akv_status_str(st));
        return st;
#else
        fprintf(stderr, "akv: --device %s: this build has no CUDA backend (nvcc was not found "
                        "at configure time); use --device cpu\n", spec);
        return AKV_EUNSUPPORTED;
#endif
    }
    fprintf(stderr, "akv: --device '%s': expected auto, cpu, cuda or cuda:N\n", spec);
    return AKV_EINVAL;
}

int akv_tool_read_input(const char *cmd, const char *path, unsigned long long max,
                        const char *flag, akv_tok_text *out) {
    const bool is_stdin = !strcmp(path, "-");
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "akv %s: cannot open '%s': %s\n", cmd, path, strerror(errno));
        return 0;
    }
    char buf[65536];
    size_t n;
    int ok = 1;
    while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) {
        if (out->n_bytes + n > max) {
            fprintf(stderr, "akv %s: '%s' holds more than %llu bytes%s%s%s\n", cmd,
                    is_stdin ? "standard input" : path, max,
                    flag ? " (raise the limit with --" : ", the most it may hold", flag ? flag : "",
                    flag ? ")" : "");
            ok = 0;
        } else if (akv_tok_text_append(out, buf, n) != AKV_OK) {
            fprintf(stderr, "akv %s: '%s': out of memory\n", cmd, path);
            ok = 0;
        }
    }
    if (ok && ferror(f)) {
        fprintf(stderr, "akv %s: cannot read '%s': %s\n", cmd, path, strerror(errno));
        ok = 0;
    }
    if (!is_stdin) fclose(f);
    return ok;
}
