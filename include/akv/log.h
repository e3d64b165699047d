/*
 * akv/log.h — the library's only output channel.
 *
 * The library never prints to stdout. It reports a condition once, where the detail is
 * known, through one replaceable hook. By default messages at AKV_LOG_WARN and above go
 * to stderr, one line each, prefixed with the level.
 *
 * Settings in messages. A message that names a setting names it by its params field inside a
 * marker, {=field} ("raise {=host_gib} to at least 3"), so that each front end says it its own
 * way by identity (a command line: --host-gib; an HTTP client: its request's field), never by
 * matching words in prose. akv_log_render turns a message's markers into names; the default
 * hook renders them as the fields themselves. Refusal messages the library hands back
 * (akv_refusal.message, akv_fit.verdict) carry markers the same way.
 *
 * Thread-safety: akv_log_set() must not race with logging (set it once at start-up);
 * the default hook writes each message with a single fputs, so lines do not interleave.
 */
#ifndef AKV_LOG_H
#define AKV_LOG_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum akv_log_level {
    AKV_LOG_DEBUG = 0,
    AKV_LOG_INFO = 1,
    AKV_LOG_WARN = 2,
    AKV_LOG_ERROR = 3,
    AKV_LOG_OFF = 4, /* as a threshold: nothing is delivered */
} akv_log_level;

/* A log hook. `msg` is one line without a trailing newline, valid only during the call. */
typedef void (*akv_log_fn)(akv_log_level level, const char *msg, void *user);

/* Replace the hook (NULL restores the stderr default) and the threshold below which
 * messages are dropped before formatting. */
void akv_log_set(akv_log_fn fn, void *user, akv_log_level threshold);

/* The current threshold. */
akv_log_level akv_log_threshold(void);

/* How a front end names a setting: its name for the params field `field` (NUL-terminated,
 * without the marker), or NULL to say the field itself. */
typedef const char *(*akv_log_namer)(const char *field, void *user);

/* Writes msg into buf[cap] with every {=field} marker replaced by namer's name for it (namer
 * NULL: the field). Text that is no marker is copied as it is. NUL-terminated, truncated to
 * cap; returns the length the whole text needs, like snprintf. */
size_t akv_log_render(const char *msg, akv_log_namer namer, void *user, char *buf, size_t cap);

/* "debug", "info", "warn", "error", "off". */
const char *akv_log_level_str(akv_log_level level);

#ifdef __cplusplus
}
#endif
#endif /* AKV_LOG_H */
