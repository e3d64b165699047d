/* log.c — the replaceable log hook, the default stderr sink, and the assertion handler. */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t akv_log_render(const char *msg, akv_log_namer namer, void *user, char *buf, size_t cap) {
    size_t o = 0;
#define PUT(c) (o + 1 < cap ? (void)(buf[o] = (c)) : (void)0, o++)
    for (const char *t = msg; *t;) {
        const char *end = t[0] == '{' && t[1] == '=' ? strchr(t + 2, '}') : NULL;
        size_t k = end ? (size_t)(end - t - 2) : 0;
        if (!end || k == 0 || k >= 64) { /* not a marker: the text as it is */
            PUT(*t);
            t++;
            continue;
        }
        char field[64];
        memcpy(field, t + 2, k);
        field[k] = '\0';
        const char *name = namer ? namer(field, user) : NULL;
        for (const char *q = name ? name : field; *q; q++) PUT(*q);
        t = end + 1;
    }
#undef PUT
    if (cap) buf[o < cap ? o : cap - 1] = '\0';
    return o;
}

static void log_stderr(akv_log_level level, const char *msg, void *user) {
    (void)user;
    char said[1100], line[1200];
    akv_log_render(msg, NULL, NULL, said, sizeof said);
    snprintf(line, sizeof line, "akv %s: %s\n", akv_log_level_str(level), said);
    fputs(line, stderr);
}

static akv_log_fn log_fn = log_stderr;
static void *log_user;
static akv_log_level log_min = AKV_LOG_WARN;

void akv_log_set(akv_log_fn fn, void *user, akv_log_level threshold) {
    log_fn = fn ? fn : log_stderr;
    log_user = fn ? user : 0;
    log_min = threshold;
}

akv_log_level akv_log_threshold(void) {
    return log_min;
}

const char *akv_log_level_str(akv_log_level level) {
    switch (level) {
    case AKV_LOG_DEBUG: return "debug";
    case AKV_LOG_INFO: return "info";
    case AKV_LOG_WARN: return "warn";
    case AKV_LOG_ERROR: return "error";
    case AKV_LOG_OFF: return "off";
    }
    return "?";
}

void akv__log(akv_log_level level, const char *fmt, ...) {
    if (level < log_min || level >= AKV_LOG_OFF) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_fn(level, msg, log_user);
}

void akv__assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "akv: assertion failed at %s:%d: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}
