/*
 * akv/log.h — the library's only output channel.
 *
 * The library never prints to stdout. It reports a condition once, where the detail is
 * known, through one replaceable hook. By default messages at AKV_LOG_WARN and above go
 * to stderr, one line each, prefixed with the level.
 *
 * Thread-safety: akv_log_set() must not race with logging (set it once at start-up);
 * the default hook writes each message with a single fputs, so lines do not interleave.
 */
#ifndef AKV_LOG_H
#define AKV_LOG_H

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

/* "debug", "info", "warn", "error", "off". */
const char *akv_log_level_str(akv_log_level level);

#ifdef __cplusplus
}
#endif
#endif /* AKV_LOG_H */
