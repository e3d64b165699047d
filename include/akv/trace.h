/*
 * akv/trace.h — following the engine's work at a chosen level, as a Chrome trace-event file
 * that Perfetto (ui.perfetto.dev) and chrome://tracing open.
 *
 * Levels:
 *   off       nothing is recorded; the emit calls return at their first test (no allocation,
 *             no lock: what the engine's step pays with a trace of this level, or none);
 *   counters  one snapshot a step of the figures the end report and /metrics give (tokens,
 *             steps, requests running and waiting, pages held), as counter tracks;
 *   spans     and every step, every request's time queued, each step it takes part in, each
 *             token's sampling and emission, and the staged layers' copies and attention (their
 *             device times from the stage's events), one track each.
 * Events go into a ring of fixed size made at create (nothing is allocated after): when it is
 * full the oldest are dropped and counted, unless a file is attached, which takes the events
 * as the ring fills (akv_trace_flush) and at the end. One lock orders the emitter (the engine's
 * thread) against a reader (akv_trace_json, the server's /trace); it is taken only at the
 * counters and spans levels.
 *
 * Times are the host clock (core/clock.h), in nanoseconds; the file says microseconds.
 * Names of spans and counters must be static strings (they are kept as pointers); track names
 * are copied (at most AKV_TRACE_NAME_MAX - 1 bytes).
 *
 * Thread-safety: every call may come from any thread.
 */
#ifndef AKV_TRACE_H
#define AKV_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum akv_trace_level {
    AKV_TRACE_OFF = 0,
    AKV_TRACE_COUNTERS = 1,
    AKV_TRACE_SPANS = 2,
} akv_trace_level;

#define AKV_TRACE_NAME_MAX 32

/* Tracks (Chrome's threads of one process): fixed ones, then one a request from
 * AKV_TRACE_TRACK_REQUEST + its id. */
enum {
    AKV_TRACE_TRACK_ENGINE = 1,  /* the engine's steps */
    AKV_TRACE_TRACK_H2D = 2,     /* the device's copy queue host -> device */
    AKV_TRACE_TRACK_COMPUTE = 3, /* the device's compute queue */
    AKV_TRACE_TRACK_D2H = 4,     /* the device's copy queue device -> host */
    AKV_TRACE_TRACK_REQUEST = 1000,
};

typedef struct akv_trace akv_trace;

typedef struct akv_trace_stats {
    uint64_t n_events;  /* recorded */
    uint64_t n_dropped; /* overwritten in the ring before a file or a reader took them */
    uint64_t n_written; /* written to the attached file */
    uint64_t n_locks;   /* times the lock was taken (0 at level off) */
} akv_trace_stats;

/* "off", "counters", "spans" (NULL for another value); and back (AKV_EINVAL, logged, for
 * another name). */
const char *akv_trace_level_name(akv_trace_level level);
akv_status akv_trace_level_parse(const char *name, akv_trace_level *out);

/* A trace at `level` with a ring of `capacity` events (0 = 65536). AKV_EINVAL for a level out
 * of range; AKV_ENOMEM. */
akv_status akv_trace_create(akv_trace_level level, uint32_t capacity, akv_trace **out);
/* Writes what is left to the attached file (and closes the JSON array), then frees. */
void akv_trace_destroy(akv_trace *t);

/* The level (AKV_TRACE_OFF for NULL): callers test it before measuring anything. */
akv_trace_level akv_trace_level_of(const akv_trace *t);

/* Events from now on also go to the file at path (created or truncated; AKV_EIO, logged, if it
 * cannot be). */
akv_status akv_trace_attach_file(akv_trace *t, const char *path);
/* Writes the ring's events to the attached file (nothing without one). */
akv_status akv_trace_flush(akv_trace *t);

/* A track's name. */
void akv_trace_track(akv_trace *t, uint32_t track, const char *name);
/* A span on a track from t0 to t1 (host ns) with up to two named numbers (NULL names: none);
 * recorded at the spans level only. */
void akv_trace_span(akv_trace *t, uint32_t track, const char *name, uint64_t t0_ns,
                    uint64_t t1_ns, const char *arg0, double v0, const char *arg1, double v1);
/* A counter's value at t (host ns); recorded at the counters and spans levels. */
void akv_trace_counter(akv_trace *t, const char *name, uint64_t t_ns, double value);

/* The ring's events as one Chrome trace JSON document ({"traceEvents": [...]}) in a buffer
 * (akv__free it); the ring keeps them. AKV_ENOMEM. */
akv_status akv_trace_json(akv_trace *t, char **out, size_t *n_bytes);

void akv_trace_get_stats(akv_trace *t, akv_trace_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* AKV_TRACE_H */
