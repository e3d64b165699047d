/* spill.c — the session directory (akv_engine_params.session_dir; docs/engine.md, "The session
 * directory"): idle conversations that would be closed are written there as session files
 * (session.c) and come back when a prompt begins with one, so a returning conversation costs
 * a file read instead of its prefill.
 *
 * The index holds each file's path, token ids, salt, exact flag and retention, oldest first;
 * finding a prompt's best file is a scan of it (a prefix comparison each, as for the idle
 * contexts). A conversation is in one place at a time: read back, its file is removed; written
 * again when it is closed again (then its history may have grown). File names are the hash of
 * the tokens and the salt, so the same conversation written twice replaces its file. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/log.h"
#include "engine/engine_impl.h"

static const char spill_ext[] = ".akvs";

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

/* Whether the index has an entry of this path. */
static bool spill_has(const akv_engine *e, const char *path) {
    for (size_t i = 0; i < e->n_spill; i++)
        if (!strcmp(e->spill[i].path, path)) return true;
    return false;
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
    for (size_t i = 0; i < e->n_spill; i++)
        if (!strcmp(e->spill[i].path, s.path)) {
            spill_drop(e, i, false);
            break;
        }
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
    const uint64_t limit = (uint64_t)e->p.session_dir_gib << 30;
    size_t dropped = 0;
    while (!st && limit && e->n_spill > 1 && e->spill_bytes > limit) spill_drop(e, 0, true), dropped++;
    if (dropped)
        AKV_LOG_W("engine: %zu of the oldest conversations in the session directory removed: "
                  "over {=session_dir_gib} %u GiB", dropped, e->p.session_dir_gib);
    if (!st)
        AKV_LOG_I("engine: the session directory '%s' holds %zu conversations (%.1f MB)%s", e->session_dir,
                  e->n_spill, e->spill_bytes / 1e6, skipped ? "; files it cannot use are left alone" : "");
    return st;
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
    const uint64_t limit = (uint64_t)e->p.session_dir_gib << 30;
    if (limit && bytes > limit) return; /* never fits: closed as without a directory */
    while (limit && e->n_spill && e->spill_bytes + bytes > limit) spill_drop(e, 0, true);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    akv__spilled s = {.path = spill_path(e, name), .n_tokens = c->n_tokens, .salt = c->salt,
                      .bytes = bytes, .exact = c->exact, .retention = c->retention,
                      .mtime = (double)now.tv_sec};
    s.tokens = akv__malloc((size_t)c->n_tokens * sizeof *s.tokens);
    if (!s.path || !s.tokens) {
        spilled_free(&s);
        return;
    }
    memcpy(s.tokens, c->tokens, (size_t)c->n_tokens * sizeof *s.tokens);
    if (akv__session_write(e, c, s.path) != AKV_OK) { /* logged: the context is closed all the same */
        spilled_free(&s);
        return;
    }
    if (spill_add(e, s) == AKV_OK) e->stats.n_spilled++;
}

void akv__spill_in(akv_engine *e, const akv_request *rq, uint32_t in_memory) {
    size_t best = SIZE_MAX;
    uint32_t lcp = in_memory;
    for (size_t i = 0; i < e->n_spill; i++) {
        const akv__spilled *s = &e->spill[i];
        if (s->salt != rq->p.cache_salt || s->exact != rq->p.kv_exact) continue;
        const uint32_t k = akv__common_prefix(s->tokens, s->n_tokens, rq->prompt, rq->p.n_prompt);
        if (k > lcp) lcp = k, best = i;
    }
    if (best == SIZE_MAX) return;
    akv__ctx *c = NULL;
    const akv_status st = akv__session_read(e, e->spill[best].path, &c);
    if (st == AKV_ENOMEM) return; /* the file stays for a later prompt */
    if (st) { /* logged: damaged or gone; the prompt is computed */
        spill_drop(e, best, true);
        return;
    }
    /* out of the index while it is adopted: the adoption may write older contexts out */
    akv__spilled s = spill_take(e, best);
    c->retention = s.retention;
    if (akv__engine_idle_adopt(e, c) != AKV_OK) { /* no room beside the reservations now */
        (void)akv_route_seq_close(e->route, c->seq);
        akv__free(c->tokens), akv__free(c);
        (void)spill_add(e, s); /* the file stays for a later prompt */
        return;
    }
    if (!spill_has(e, s.path) && remove(s.path) != 0) /* not written again meanwhile */
        AKV_LOG_W("engine: the session directory's '%s' could not be removed", s.path);
    spilled_free(&s);
    e->stats.n_restored++;
}

void akv__spill_close(akv_engine *e) {
    for (size_t i = 0; i < e->n_spill; i++) spilled_free(&e->spill[i]);
    akv__free(e->spill), akv__free(e->session_dir);
    e->spill = NULL, e->session_dir = NULL, e->n_spill = e->cap_spill = 0, e->spill_bytes = 0;
}
