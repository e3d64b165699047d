/* spill.c — the session directory (akv_engine_params.session_dir; docs/engine.md, "The session
 * directory"): idle conversations that would be closed are written there as session files
 * (session.c) and come back when a prompt begins with one, so a returning conversation costs
 * a file read instead of its prefill.
 *
 * The index holds each file's path, token ids, salt, exact flag and retention, oldest first;
 * finding a prompt's best file is a scan of it (a prefix comparison each, as for the idle
 * contexts). A conversation is in one place at a time: read back, its file is removed; written
 * again when it is closed again (then its history may have grown). File names are the hash of
 * the tokens and the salt, so the same conversation written twice replaces its file.
 *
 * Writing: the engine's thread makes the file's bytes in memory (the context's pages read, its
 * rows laid out: a memory copy) and a writer thread puts them on the disk (write, flush to the
 * disk, rename) and only then adds the file to the index, so the batch steps do not wait on the
 * disk. At most SPILL_PENDING bytes wait to be written (more waits for the writer, but one
 * file alone always goes); a prompt that continues a conversation still being written waits
 * for its file. The writer's lock guards the index, the queue and its counters. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/hash.h"
#include "core/log.h"
#include "engine/engine_impl.h"

static const char spill_ext[] = ".akvs";
static const size_t SPILL_PENDING = (size_t)1 << 30;

typedef struct spill_job {
    struct spill_job *next;
    uint64_t seq;       /* its place in the queue (jobs are written in that order) */
    akv__spilled entry; /* its index entry once written */
    uint8_t *image;     /* the file's bytes */
    size_t n;
    bool unlink;        /* not a write: entry.path removed (a file read back; freeing a large
                           file's cached pages takes a while, off the engine's thread) */
} spill_job;

struct akv__spill_writer {
    pthread_t th;
    pthread_mutex_t mu; /* the index (e->spill, n_spill, spill_bytes), the queue, the counters */
    pthread_cond_t cv;  /* a job queued or done; stop */
    spill_job *head, *tail;
    spill_job *writing; /* the job on the disk now, or NULL */
    uint64_t queued, done; /* jobs queued and written (or failed) so far: job seq is done once
                              done >= seq */
    size_t pending;     /* bytes queued or being written */
    uint64_t n_written;
    bool stop;
};

static void spilled_free(akv__spilled *s) {
    akv__free(s->path), akv__free(s->tokens);
    memset(s, 0, sizeof *s);
}

/* Takes entry i out of the index (the caller owns it then). */
static akv__spilled spill_take(akv_engine *e, size_t i) {
    const akv__spilled s = e->spill[i];
    e->spill_bytes -= s.bytes;
    memmove(e->spill + i, e->spill + i + 1, (e->n_spill - i - 1) * sizeof *e->spill);
    e->n_spill--;
    return s;
}

/* The index's entry of this path, or SIZE_MAX. */
static size_t spill_find(const akv_engine *e, const char *path) {
    for (size_t i = 0; i < e->n_spill; i++)
        if (!strcmp(e->spill[i].path, path)) return i;
    return SIZE_MAX;
}

/* The files' bytes at most (session_dir_gib); 0: no limit. */
static uint64_t spill_limit(const akv_engine *e) {
    return (uint64_t)e->p.session_dir_gib << 30;
}

/* Drops entry i from the index (and its file when `unlink`). */
static void spill_drop(akv_engine *e, size_t i, bool unlink) {
    akv__spilled s = spill_take(e, i);
    if (unlink && remove(s.path) != 0)
        AKV_LOG_W("engine: the session directory's '%s' could not be removed", s.path);
    spilled_free(&s);
}

/* Adds an entry (taking path and tokens) as the newest; one of the same path is replaced. */
static akv_status spill_add(akv_engine *e, akv__spilled s) {
    const size_t old = spill_find(e, s.path);
    if (old != SIZE_MAX) spill_drop(e, old, false);
    akv_status st = akv__array_reserve((void **)&e->spill, &e->cap_spill, e->n_spill + 1, sizeof *e->spill);
    if (st) {
        spilled_free(&s);
        return st;
    }
    e->spill[e->n_spill++] = s;
    e->spill_bytes += s.bytes;
    return AKV_OK;
}

static int spill_older(const void *a, const void *b) {
    const double x = ((const akv__spilled *)a)->mtime, y = ((const akv__spilled *)b)->mtime;
    return x < y ? -1 : x > y;
}

/* Whether a file name ends in the extension. */
static bool spill_name(const char *name) {
    const size_t n = strlen(name), k = sizeof spill_ext - 1;
    return n > k && !strcmp(name + n - k, spill_ext);
}

static char *spill_path(const akv_engine *e, const char *name) {
    char *p = akv__malloc(strlen(e->session_dir) + strlen(name) + 2);
    if (p) sprintf(p, "%s/%s", e->session_dir, name);
    return p;
}

static void writer_start(akv_engine *e);

akv_status akv__spill_open(akv_engine *e) {
    if (!e->p.session_dir) return AKV_OK;
    struct stat sb;
    if (stat(e->p.session_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        AKV_LOG_E("engine: the session directory {=session_dir} '%s' is not a directory",
                  e->p.session_dir);
        return AKV_EINVAL;
    }
    if (!(e->session_dir = akv__strdup(e->p.session_dir))) return AKV_ENOMEM;
    DIR *d = opendir(e->session_dir);
    if (!d) {
        AKV_LOG_E("engine: the session directory {=session_dir} '%s' cannot be read", e->session_dir);
        return AKV_EIO;
    }
    akv_status st = AKV_OK;
    size_t skipped = 0;
    for (struct dirent *de; !st && (de = readdir(d)) != NULL;) {
        if (!spill_name(de->d_name)) continue;
        char *path = spill_path(e, de->d_name);
        akv__ctx meta;
        if (!path) {
            st = AKV_ENOMEM;
            break;
        }
        const akv_status pst = akv__session_peek(e, path, &meta);
        if (pst == AKV_ENOMEM) st = pst;
        if (pst) { /* another model's, damaged, too long: not ours to use (left alone) */
            akv__free(path);
            skipped++;
            continue;
        }
        const akv__spilled s = {.path = path, .tokens = meta.tokens, .n_tokens = meta.n_tokens,
                                .salt = meta.salt, .bytes = akv__session_file_bytes(e, meta.n_tokens),
                                .exact = meta.exact, .retention = meta.retention,
                                .mtime = stat(path, &sb) == 0 ? (double)sb.st_mtime : 0};
        st = spill_add(e, s);
    }
    closedir(d);
    /* oldest first, as written; then within session_dir_gib */
    if (!st && e->n_spill) qsort(e->spill, e->n_spill, sizeof *e->spill, spill_older);
    const uint64_t limit = spill_limit(e);
    size_t dropped = 0;
    while (!st && limit && e->n_spill > 1 && e->spill_bytes > limit) spill_drop(e, 0, true), dropped++;
    if (dropped)
        AKV_LOG_W("engine: %zu of the oldest conversations in the session directory removed: "
                  "over {=session_dir_gib} %u GiB", dropped, e->p.session_dir_gib);
    if (!st)
        AKV_LOG_I("engine: the session directory '%s' holds %zu conversations (%.1f MB)%s", e->session_dir,
                  e->n_spill, e->spill_bytes / 1e6, skipped ? "; files it cannot use are left alone" : "");
    if (!st) writer_start(e);
    return st;
}

/* Room for a file of `bytes` within session_dir_gib: the oldest files removed (lock held). */
static void spill_room(akv_engine *e, uint64_t bytes) {
    const uint64_t limit = spill_limit(e);
    while (limit && e->n_spill && e->spill_bytes + bytes > limit) spill_drop(e, 0, true);
}

static void *writer_main(void *arg) {
    akv_engine *e = arg;
    akv__spill_writer *w = e->writer;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        spill_job *j = w->head;
        if (!j) break; /* stopped with nothing left */
        w->head = j->next;
        if (!w->head) w->tail = NULL;
        w->writing = j;
        pthread_mutex_unlock(&w->mu);
        akv_status st = AKV_EIO;
        if (!j->unlink) st = akv__session_write_image(j->entry.path, j->image, j->n); /* logged */
        else if (remove(j->entry.path) != 0)
            AKV_LOG_W("engine: the session directory's '%s' could not be removed", j->entry.path);
        akv__free(j->image);
        pthread_mutex_lock(&w->mu);
        w->writing = NULL;
        if (st == AKV_OK) {
            /* an entry of the same path is this file's older self: out of the index, its file
             * kept (it is the new one now), before room is made */
            const size_t old = spill_find(e, j->entry.path);
            if (old != SIZE_MAX) spill_drop(e, old, false);
            spill_room(e, j->entry.bytes);
            if (spill_add(e, j->entry) == AKV_OK) w->n_written++;
        } else {
            spilled_free(&j->entry);
        }
        w->done = j->seq;
        w->pending -= j->n;
        akv__free(j);
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* The writer thread (NULL when it cannot start: files are then written on the engine's
 * thread). */
static void writer_start(akv_engine *e) {
    akv__spill_writer *w = akv__calloc(1, sizeof *w);
    if (!w) return;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    e->writer = w;
    if (pthread_create(&w->th, NULL, writer_main, e) == 0) return;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    akv__free(w);
    e->writer = NULL;
}

static void spill_lock(const akv_engine *e) {
    if (e->writer) pthread_mutex_lock(&e->writer->mu);
}
static void spill_unlock(const akv_engine *e) {
    if (e->writer) pthread_mutex_unlock(&e->writer->mu);
}

/* The queue position of the last job of this path queued or under way, writes or removals
 * (unlink), 0 = none (lock held). */
static uint64_t spill_last_job(const akv_engine *e, const char *path, bool unlink) {
    const akv__spill_writer *w = e->writer;
    uint64_t last = 0;
    if (w && w->writing && w->writing->unlink == unlink && !strcmp(w->writing->entry.path, path))
        last = w->writing->seq;
    for (const spill_job *j = w ? w->head : NULL; j; j = j->next)
        if (j->unlink == unlink && !strcmp(j->entry.path, path)) last = j->seq;
    return last;
}

/* Whether a write of this path is queued or under way (lock held). */
static bool spill_pending(const akv_engine *e, const char *path) {
    return spill_last_job(e, path, false) != 0;
}

/* Waits until no removal of path is queued or under way (lock held): a file written on the
 * engine's thread must not be removed by a job queued before it. */
static void spill_after_unlinks(akv_engine *e, const char *path) {
    const uint64_t last = spill_last_job(e, path, true);
    while (last && e->writer->done < last) pthread_cond_wait(&e->writer->cv, &e->writer->mu);
}

/* A job to the writer's queue, after every job queued before it (lock held). */
static void spill_queue(akv__spill_writer *w, spill_job *j) {
    j->seq = ++w->queued;
    if (w->tail) w->tail->next = j;
    else w->head = j;
    w->tail = j;
    w->pending += j->n;
    pthread_cond_broadcast(&w->cv);
}

/* s's file removed, by the writer after the jobs queued before (so a later write of the same
 * path is not lost to it), or here when there is no writer; s is taken. */
static void spill_unlink(akv_engine *e, akv__spilled s) {
    akv__spill_writer *w = e->writer;
    spill_job *j = w ? akv__calloc(1, sizeof *j) : NULL;
    if (!j) {
        if (remove(s.path) != 0)
            AKV_LOG_W("engine: the session directory's '%s' could not be removed", s.path);
        spilled_free(&s);
        return;
    }
    j->entry = s, j->unlink = true;
    pthread_mutex_lock(&w->mu);
    spill_queue(w, j);
    pthread_mutex_unlock(&w->mu);
}

void akv__spill_out(akv_engine *e, const akv__ctx *c) {
    if (!e->session_dir || !c->n_tokens || e->failed) return;
    uint64_t h = akv_hash64_init();
    h = akv_hash64_add(h, c->tokens, (size_t)c->n_tokens * sizeof *c->tokens);
    h = akv_hash64_add(h, &c->salt, sizeof c->salt);
    h = akv_hash64_final(h, (uint64_t)c->n_tokens * 2 + c->exact);
    char name[40];
    snprintf(name, sizeof name, "%016llx%s", (unsigned long long)h, spill_ext);
    const uint64_t bytes = akv__session_file_bytes(e, c->n_tokens);
    if (spill_limit(e) && bytes > spill_limit(e)) return; /* never fits: closed as without one */
    /* (mtime is the files' order at open; entries added since are in order already) */
    akv__spilled s = {.path = spill_path(e, name), .n_tokens = c->n_tokens, .salt = c->salt,
                      .bytes = bytes, .exact = c->exact, .retention = c->retention};
    s.tokens = akv__malloc((size_t)c->n_tokens * sizeof *s.tokens);
    if (!s.path || !s.tokens) {
        spilled_free(&s);
        return;
    }
    memcpy(s.tokens, c->tokens, (size_t)c->n_tokens * sizeof *s.tokens);
    akv__spill_writer *w = e->writer;
    spill_job *j = w ? akv__calloc(1, sizeof *j) : NULL;
    if (j && akv__session_image(e, c, &j->image, &j->n) == AKV_OK) { /* to the writer */
        j->entry = s;
        pthread_mutex_lock(&w->mu);
        while (w->pending && w->pending + j->n > SPILL_PENDING) pthread_cond_wait(&w->cv, &w->mu);
        spill_queue(w, j);
        pthread_mutex_unlock(&w->mu);
        return;
    }
    akv__free(j); /* no writer, or no memory for the image: written here */
    spill_lock(e);
    spill_after_unlinks(e, s.path); /* a removal of this path queued earlier goes first */
    spill_room(e, bytes);
    spill_unlock(e);
    if (akv__session_write(e, c, s.path) != AKV_OK) { /* logged: the context is closed all the same */
        spilled_free(&s);
        return;
    }
    spill_lock(e);
    if (spill_add(e, s) == AKV_OK) e->stats.n_spilled++;
    spill_unlock(e);
}

/* Whether entry s may serve rq (its salt and exactness) sharing more than lcp tokens. */
static bool spill_serves(const akv__spilled *s, const akv_request *rq, uint32_t lcp, uint32_t *k) {
    if (s->salt != rq->p.cache_salt || s->exact != rq->p.kv_exact) return false;
    *k = akv__common_prefix(s->tokens, s->n_tokens, rq->prompt, rq->p.n_prompt);
    return *k > lcp;
}

/* Whether the same path was written again since its entry left the index. */
static bool spill_written_anew(akv_engine *e, const char *path) {
    return spill_find(e, path) != SIZE_MAX || spill_pending(e, path);
}

/* A read back that ended with st (c: its context, when st is AKV_OK): adopted as the most
 * recent idle context and its file removed (still pinned for its request, which starts from
 * it); a damaged or vanished file dropped from the index (the damaged one removed behind the
 * writes queued before); else (no memory, no room beside the running requests) its entry back
 * in the index, for later. A read that was not adopted leaves its request to compute its
 * prompt. */
static void spill_read_done(akv_engine *e, akv_status st, akv__ctx *c, akv__read_back rb,
                            double disk_s) {
    if (!st) {
        /* adopted as the most precious idle context while the others make room, so it is not
         * the one closed (written back out) for it; then its own retention again */
        c->retention = INT8_MAX;
        if (akv__engine_idle_adopt(e, c, true) != AKV_OK) st = AKV_EFULL; /* closed */
        else c->retention = rb.entry.retention;
    }
    if (st)
        for (uint32_t i = 0; i < e->n_run; i++)
            if (e->run[i]->info.serial == rb.serial) e->run[i]->no_read_back = true;
    spill_lock(e);
    const bool again = spill_written_anew(e, rb.entry.path);
    const bool keep = st && st != AKV_EFORMAT && st != AKV_ENOTFOUND && !again; /* for later */
    if (keep) {
        spill_room(e, rb.entry.bytes);
        (void)spill_add(e, rb.entry);
    } else if (!st) {
        e->stats.n_restored++;
        e->stats.restore_s += akv_clock_s() - rb.t0, e->stats.restore_disk_s += disk_s;
    }
    spill_unlock(e);
    if (keep) return;
    /* read back, or damaged (logged): removed unless written anew meanwhile; else forgotten */
    if (!again && (!st || st == AKV_EFORMAT)) spill_unlink(e, rb.entry);
    else spilled_free(&rb.entry);
}

void akv__spill_poll(akv_engine *e) {
    const akv__read_back rb = e->read_back;
    if (!rb.job || !akv__restore_wait(rb.job, 0)) return;
    e->read_back = (akv__read_back){0};
    akv__ctx *c = NULL;
    double disk_s = 0;
    const akv_status st = akv__restore_end(e, rb.job, &c, &disk_s); /* closed on failure: unpinned */
    spill_read_done(e, st, c, rb, disk_s);
}

bool akv__spill_in(akv_engine *e, akv_request *rq, uint32_t in_memory) {
    akv__spill_writer *w = e->writer;
    spill_lock(e);
    size_t best;
    uint32_t lcp, k;
    for (;;) { /* the best file; a better one still being written is waited for */
        lcp = in_memory;
        best = SIZE_MAX;
        for (size_t i = 0; i < e->n_spill; i++)
            if (spill_serves(&e->spill[i], rq, lcp, &k)) lcp = k, best = i;
        uint64_t wait_for = 0;
        if (w && w->writing && !w->writing->unlink && spill_serves(&w->writing->entry, rq, lcp, &k))
            wait_for = w->writing->seq;
        for (const spill_job *j = w ? w->head : NULL; j; j = j->next)
            if (!j->unlink && spill_serves(&j->entry, rq, lcp, &k)) wait_for = j->seq;
        if (!wait_for) break;
        while (w->done < wait_for) pthread_cond_wait(&w->cv, &w->mu);
    }
    /* a read under way: it waits for it (it serves rq better still, or it is ahead in line) */
    const bool under_way = e->read_back.job &&
                           (best != SIZE_MAX || spill_serves(&e->read_back.entry, rq, lcp, &k));
    uint64_t credit = 0;
    if (under_way || best == SIZE_MAX || !akv__engine_read_fits(e, rq, e->spill[best].n_tokens, lcp, &credit)) {
        spill_unlock(e);
        if (!under_way && best != SIZE_MAX) rq->no_read_back = true; /* no room now: computed */
        return under_way;
    }
    /* out of the index while it is read and adopted: the adoption may write older contexts */
    akv__read_back rb = {.entry = spill_take(e, best), .t0 = akv_clock_s(), .serial = rq->info.serial};
    spill_unlock(e);
    const akv_status st = akv__restore_begin(e, rb.entry.path, true, &rb.job);
    if (st) { /* refused before its K/V: nothing open */
        spill_read_done(e, st, NULL, rb, 0);
        return false;
    }
    akv__engine_read_for(e, rq, akv__restore_ctx(rb.job), credit);
    e->read_back = rb;
    return true;
}

void akv__spill_wait(akv_engine *e, double max_s) {
    if (e->read_back.job) (void)akv__restore_wait(e->read_back.job, max_s);
}

void akv__engine_flush_sessions(akv_engine *e) {
    akv__spill_writer *w = e->writer;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    while (w->head || w->writing) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

void akv__spill_stats(const akv_engine *e, akv_engine_stats *out) {
    spill_lock(e);
    out->n_spill_files = e->n_spill, out->spill_bytes = e->spill_bytes;
    out->n_spilled = e->stats.n_spilled + (e->writer ? e->writer->n_written : 0);
    spill_unlock(e);
}

akv_status akv__spill_check(const akv_engine *e) {
    akv_status st = AKV_OK;
    spill_lock(e);
    uint64_t bytes = 0;
    for (size_t i = 0; i < e->n_spill && !st; i++) {
        const akv__spilled *sp = &e->spill[i];
        bytes += sp->bytes;
        if (!sp->path || !sp->tokens || !sp->n_tokens || sp->bytes != akv__session_file_bytes(e, sp->n_tokens)) {
            AKV_LOG_E("engine check: the session directory's entry %zu is not a whole file", i);
            st = AKV_ESTATE;
        }
        for (size_t j = i + 1; j < e->n_spill && !st; j++)
            if (!strcmp(sp->path, e->spill[j].path)) {
                AKV_LOG_E("engine check: '%s' is indexed twice", sp->path);
                st = AKV_ESTATE;
            }
    }
    if (!st && (bytes != e->spill_bytes ||
                (spill_limit(e) && e->n_spill > 1 && bytes > spill_limit(e)))) {
        AKV_LOG_E("engine check: the session directory's index counts %llu bytes; its entries %llu",
                  (unsigned long long)e->spill_bytes, (unsigned long long)bytes);
        st = AKV_ESTATE;
    }
    spill_unlock(e);
    return st;
}

void akv__engine_hold_restores(akv_engine *e, bool hold) {
    atomic_store(&e->restore_hold, hold);
}

void akv__spill_close(akv_engine *e) {
    atomic_store(&e->restore_hold, false);
    if (e->read_back.job) { /* a read under way ended and dropped: its file stays */
        akv__ctx *c = NULL;
        if (akv__restore_end(e, e->read_back.job, &c, NULL) == AKV_OK) akv__ctx_close(e, c);
        spilled_free(&e->read_back.entry);
        e->read_back = (akv__read_back){0};
    }
    akv__spill_writer *w = e->writer;
    if (w) { /* what is queued is written first */
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->th, NULL);
        e->stats.n_spilled += w->n_written;
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        akv__free(w);
        e->writer = NULL;
    }
    for (size_t i = 0; i < e->n_spill; i++) spilled_free(&e->spill[i]);
    akv__free(e->spill), akv__free(e->session_dir);
    e->spill = NULL, e->session_dir = NULL, e->n_spill = e->cap_spill = 0, e->spill_bytes = 0;
}
