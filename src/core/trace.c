/* trace.c — the trace of akv/trace.h: a ring of fixed-size events, one lock, Chrome JSON. */
#include "akv/trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"

enum { EV_SPAN, EV_COUNTER };
enum { TRACE_TRACKS = 512 }; /* request track names kept (the newest), written with every dump */
enum { TRACE_FIXED = 16 };   /* the fixed tracks' names (ids below AKV_TRACE_TRACK_REQUEST), kept */

typedef struct trace_ev {
    uint64_t t0, t1;
    const char *name, *a0, *a1;
    double v0, v1;
    uint32_t track;
    uint8_t kind;
} trace_ev;

typedef struct trace_track {
    uint32_t id; /* 0 = unused */
    char name[AKV_TRACE_NAME_MAX];
} trace_track;

struct akv_trace {
    akv_trace_level level;
    pthread_mutex_t mu;
    trace_ev *ring; /* [cap] */
    uint32_t cap;
    uint64_t head;    /* events recorded: the ring holds [head - cap, head) */
    uint64_t written; /* events written to the file: [written, head) wait for it */
    uint64_t origin;  /* host ns of ts 0 */
    trace_track tracks[TRACE_TRACKS];
    uint32_t n_tracks_set;
    uint32_t tracks_written; /* names set so far that the file has */
    trace_track fixed[TRACE_FIXED];
    bool fixed_written[TRACE_FIXED]; /* the file has that fixed track's name */
    bool io_failed; /* the file could not be written (said once); its events count as dropped */
    FILE *file;
    bool file_first; /* nothing written to the file's array yet */
    akv_trace_stats stats;
};

const char *akv_trace_level_name(akv_trace_level level) {
    switch (level) {
    case AKV_TRACE_OFF: return "off";
    case AKV_TRACE_COUNTERS: return "counters";
    case AKV_TRACE_SPANS: return "spans";
    }
    return NULL;
}

akv_status akv_trace_level_parse(const char *name, akv_trace_level *out) {
    for (int l = AKV_TRACE_OFF; l <= AKV_TRACE_SPANS; l++)
        if (name && out && !strcmp(name, akv_trace_level_name((akv_trace_level)l))) {
            *out = (akv_trace_level)l;
            return AKV_OK;
        }
    AKV_LOG_E("trace: level \"%s\" is not one of off, counters, spans", name ? name : "(null)");
    return AKV_EINVAL;
}

akv_trace_level akv_trace_level_of(const akv_trace *t) {
    return t ? t->level : AKV_TRACE_OFF;
}

akv_status akv_trace_create(akv_trace_level level, uint32_t capacity, akv_trace **out) {
    if (!out || !akv_trace_level_name(level)) {
        AKV_LOG_E("trace: create with level %d (off, counters or spans)", (int)level);
        return AKV_EINVAL;
    }
    akv_trace *t = akv__calloc(1, sizeof *t);
    if (!t) return AKV_ENOMEM;
    t->cap = capacity ? capacity : 65536;
    t->ring = akv__calloc(t->cap, sizeof *t->ring);
    if (!t->ring || pthread_mutex_init(&t->mu, NULL)) {
        akv__free(t->ring);
        akv__free(t);
        return AKV_ENOMEM;
    }
    t->level = level;
    t->origin = akv_clock_ns();
    t->file_first = true;
    *out = t;
    return AKV_OK;
}

static void trace_lock(akv_trace *t) {
    pthread_mutex_lock(&t->mu);
    t->stats.n_locks++;
}

/* ---- JSON ------------------------------------------------------------------------------ */

/* Microseconds from the origin, as Chrome's ts (a time before the origin is 0). */
static double trace_us(const akv_trace *t, uint64_t ns) {
    return ns > t->origin ? (double)(ns - t->origin) / 1e3 : 0.0;
}

/* One event as JSON into buf (at most cap bytes); returns its length. */
static size_t ev_json(const akv_trace *t, const trace_ev *e, char *buf, size_t cap) {
    int n;
    if (e->kind == EV_COUNTER) {
        n = snprintf(buf, cap, "{\"name\":\"%s\",\"ph\":\"C\",\"pid\":1,\"ts\":%.3f,\"args\":{\"value\":%.17g}}",
                     e->name, trace_us(t, e->t0), e->v0);
    } else {
        char args[160] = "";
        if (e->a0 && e->a1)
            snprintf(args, sizeof args, ",\"args\":{\"%s\":%.17g,\"%s\":%.17g}", e->a0, e->v0, e->a1, e->v1);
        else if (e->a0)
            snprintf(args, sizeof args, ",\"args\":{\"%s\":%.17g}", e->a0, e->v0);
        const double t0 = trace_us(t, e->t0), t1 = trace_us(t, e->t1);
        n = snprintf(buf, cap, "{\"name\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f%s}",
                     e->name, e->track, t0, t1 > t0 ? t1 - t0 : 0.0, args);
    }
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* A track's name as Chrome's thread_name metadata; the name's quotes and backslashes
 * dropped (names are the library's own). */
static size_t track_json(const trace_track *tr, char *buf, size_t cap) {
    char clean[AKV_TRACE_NAME_MAX];
    size_t k = 0;
    for (size_t i = 0; tr->name[i] && k + 1 < sizeof clean; i++)
        if (tr->name[i] != '"' && tr->name[i] != '\\' && (unsigned char)tr->name[i] >= 0x20)
            clean[k++] = tr->name[i];
    clean[k] = 0;
    int n = snprintf(buf, cap, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"args\":{\"name\":\"%s\"}}",
                     tr->id, clean);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* Writes the events not yet written, and the track names set since, to the file (lock held). */
static akv_status trace_write_locked(akv_trace *t) {
    if (!t->file || t->io_failed) return AKV_OK;
    char buf[512];
    for (uint32_t i = 0; i < TRACE_FIXED; i++) { /* a fixed track's name once, when set */
        if (!t->fixed[i].id || t->fixed_written[i]) continue;
        size_t n = track_json(&t->fixed[i], buf, sizeof buf);
        if (fprintf(t->file, "%s%.*s", t->file_first ? "[\n" : ",\n", (int)n, buf) < 0) goto io;
        t->file_first = false;
        t->fixed_written[i] = true;
    }
    for (; t->tracks_written < t->n_tracks_set; t->tracks_written++) {
        const trace_track *tr = &t->tracks[t->tracks_written % TRACE_TRACKS];
        size_t n = track_json(tr, buf, sizeof buf);
        if (fprintf(t->file, "%s%.*s", t->file_first ? "[\n" : ",\n", (int)n, buf) < 0) goto io;
        t->file_first = false;
    }
    if (t->head - t->written > t->cap) { /* overwritten before the file took them */
        t->stats.n_dropped += t->head - t->written - t->cap;
        t->written = t->head - t->cap;
    }
    for (; t->written < t->head; t->written++) {
        size_t n = ev_json(t, &t->ring[t->written % t->cap], buf, sizeof buf);
        if (fprintf(t->file, "%s%.*s", t->file_first ? "[\n" : ",\n", (int)n, buf) < 0) goto io;
        t->file_first = false;
        t->stats.n_written++;
    }
    if (fflush(t->file)) goto io;
    return AKV_OK;
io:
    if (!t->io_failed) AKV_LOG_E("trace: writing the trace file failed: %s", strerror(errno));
    t->io_failed = true;
    t->stats.n_dropped += t->head - t->written; /* what it could not take */
    t->written = t->head;
    return AKV_EIO;
}

akv_status akv_trace_attach_file(akv_trace *t, const char *path) {
    if (!t || !path) return AKV_EINVAL;
    FILE *f = fopen(path, "w");
    if (!f) {
        AKV_LOG_E("trace: cannot write %s: %s", path, strerror(errno));
        return AKV_EIO;
    }
    const bool on = t->level != AKV_TRACE_OFF; /* at off nothing emits: no lock to take */
    if (on) trace_lock(t);
    if (t->file) fclose(t->file);
    t->file = f;
    t->file_first = true;
    t->io_failed = false;
    memset(t->fixed_written, 0, sizeof t->fixed_written);
    t->written = t->head; /* from now on */
    /* the names it has not had: the fixed tracks' are written with the first events (below),
     * the requests' kept ones from here */
    t->tracks_written = t->n_tracks_set - (t->n_tracks_set < TRACE_TRACKS ? t->n_tracks_set : TRACE_TRACKS);
    if (on) pthread_mutex_unlock(&t->mu);
    return AKV_OK;
}

akv_status akv_trace_flush(akv_trace *t) {
    if (!t || t->level == AKV_TRACE_OFF) return AKV_OK;
    trace_lock(t);
    akv_status st = trace_write_locked(t);
    pthread_mutex_unlock(&t->mu);
    return st;
}

void akv_trace_destroy(akv_trace *t) {
    if (!t) return;
    if (t->file) {
        (void)trace_write_locked(t);
        if ((fputs(t->file_first ? "[]\n" : "\n]\n", t->file) < 0 || fclose(t->file)) && !t->io_failed)
            AKV_LOG_E("trace: finishing the trace file failed: %s", strerror(errno));
    }
    pthread_mutex_destroy(&t->mu);
    akv__free(t->ring);
    akv__free(t);
}

/* ---- emitting ------------------------------------------------------------------------------ */

/* Records e (lock held); a file takes the ring's first half once it is full to there. */
static void trace_push_locked(akv_trace *t, const trace_ev *e) {
    if (!t->file && t->head >= t->cap) t->stats.n_dropped++; /* the oldest goes */
    t->ring[t->head % t->cap] = *e;
    t->head++;
    t->stats.n_events++;
    if (t->file && t->head - t->written >= t->cap / 2) (void)trace_write_locked(t);
}

void akv_trace_track(akv_trace *t, uint32_t track, const char *name) {
    if (!t || t->level == AKV_TRACE_OFF || !name) return;
    trace_lock(t);
    if (track < AKV_TRACE_TRACK_REQUEST) { /* a fixed track: its own slot, never evicted */
        trace_track *fx = &t->fixed[track % TRACE_FIXED];
        fx->id = track;
        snprintf(fx->name, sizeof fx->name, "%s", name);
        t->fixed_written[track % TRACE_FIXED] = false;
        pthread_mutex_unlock(&t->mu);
        return;
    }
    /* before a name the file lacks is overwritten, the file takes it */
    if (t->file && t->n_tracks_set - t->tracks_written >= TRACE_TRACKS) (void)trace_write_locked(t);
    trace_track *tr = &t->tracks[t->n_tracks_set % TRACE_TRACKS];
    tr->id = track;
    snprintf(tr->name, sizeof tr->name, "%s", name);
    t->n_tracks_set++;
    pthread_mutex_unlock(&t->mu);
}

void akv_trace_span(akv_trace *t, uint32_t track, const char *name, uint64_t t0_ns,
                    uint64_t t1_ns, const char *arg0, double v0, const char *arg1, double v1) {
    if (!t || t->level < AKV_TRACE_SPANS || !name) return;
    const trace_ev e = {t0_ns, t1_ns, name, arg0, arg0 ? arg1 : NULL, v0, v1, track, EV_SPAN};
    trace_lock(t);
    trace_push_locked(t, &e);
    pthread_mutex_unlock(&t->mu);
}

void akv_trace_counter(akv_trace *t, const char *name, uint64_t t_ns, double value) {
    if (!t || t->level < AKV_TRACE_COUNTERS || !name) return;
    const trace_ev e = {t_ns, t_ns, name, NULL, NULL, value, 0, 0, EV_COUNTER};
    trace_lock(t);
    trace_push_locked(t, &e);
    pthread_mutex_unlock(&t->mu);
}

/* ---- reading ------------------------------------------------------------------------------ */

typedef struct jbuf {
    char *p;
    size_t n, cap;
    bool failed;
} jbuf;

static void jput(jbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = akv__realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

akv_status akv_trace_json(akv_trace *t, char **out, size_t *n_bytes) {
    if (!t || !out) return AKV_EINVAL;
    /* a copy of the ring and the names under the lock; the text made without it, so the
     * emitter waits for a copy, not for the formatting */
    trace_ev *ev = akv__malloc((size_t)t->cap * sizeof *ev);
    trace_track *names = akv__malloc((TRACE_TRACKS + TRACE_FIXED) * sizeof *names);
    if (!ev || !names) {
        akv__free(ev), akv__free(names);
        return AKV_ENOMEM;
    }
    trace_lock(t);
    const uint64_t first = t->head > t->cap ? t->head - t->cap : 0, n_ev = t->head - first;
    for (uint64_t i = 0; i < n_ev; i++) ev[i] = t->ring[(first + i) % t->cap];
    uint32_t n_names = 0;
    for (uint32_t i = 0; i < TRACE_FIXED; i++)
        if (t->fixed[i].id) names[n_names++] = t->fixed[i];
    const uint32_t n_tracks = t->n_tracks_set < TRACE_TRACKS ? t->n_tracks_set : TRACE_TRACKS;
    for (uint32_t i = 0; i < n_tracks; i++)
        names[n_names++] = t->tracks[(t->n_tracks_set - n_tracks + i) % TRACE_TRACKS];
    pthread_mutex_unlock(&t->mu);
    jbuf b = {0};
    char buf[512];
    bool at_first = true;
    jput(&b, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 39);
    for (uint32_t i = 0; i < n_names; i++) {
        const size_t n = track_json(&names[i], buf, sizeof buf);
        jput(&b, at_first ? "\n" : ",\n", at_first ? 1 : 2), jput(&b, buf, n), at_first = false;
    }
    for (uint64_t i = 0; i < n_ev; i++) {
        const size_t n = ev_json(t, &ev[i], buf, sizeof buf);
        jput(&b, at_first ? "\n" : ",\n", at_first ? 1 : 2), jput(&b, buf, n), at_first = false;
    }
    jput(&b, "\n]}\n", 4);
    akv__free(ev), akv__free(names);
    if (b.failed) {
        akv__free(b.p);
        return AKV_ENOMEM;
    }
    *out = b.p;
    if (n_bytes) *n_bytes = b.n;
    return AKV_OK;
}

void akv_trace_get_stats(akv_trace *t, akv_trace_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!t) return;
    if (t->level == AKV_TRACE_OFF) { /* nothing moves; no lock taken */
        *out = t->stats;
        return;
    }
    pthread_mutex_lock(&t->mu);
    *out = t->stats;
    pthread_mutex_unlock(&t->mu);
}
