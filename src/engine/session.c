/* session.c — a conversation's context saved to a file and restored (akv/engine.h,
 * akv_engine_session_save / _load; docs/engine.md, "Sessions on disk").
 *
 * The file, little-endian:
 *   header  64 bytes: "AKVSESS1", the version (SESS_VERSION), the K/V geometry (layers, K/V heads, head dim,
 *           element type), the vocabulary size, the model's fingerprint (its shape, RoPE and
 *           norm settings, its tokenizer's pieces, each tensor's name, shape, type and a
 *           sample of its bytes), the history's length n, its cache salt, whether it is kept
 *           exact and its retention (zero: the shared default, as a request's);
 *   tokens  n token ids (int32), padded to 8 bytes;
 *   K/V     per layer, [2][n_kv_heads][n][head_dim] elements of the history's exact copy
 *           (page size free: a file restores under any --page-tokens);
 *   check   the checksum (core/hash.h): a chain over the header and the tokens, into which
 *           each layer's block checksum (akv_hash64_block, several times the chain's rate) is
 *           folded in order, then the file's length.
 * Written to PATH.tmp, flushed to the disk and renamed over PATH: a failure (a full disk)
 * leaves the old file and the context as they were. Read in full and checked before the
 * context is made idle: a damaged, truncated or foreign file loads nothing. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "akv/gguf.h"
#include "akv/model.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/hash.h"
#include "core/log.h"
#include "engine/engine_impl.h"

enum { SESS_VERSION = 2, SESS_HEADER = 64 }; /* 2: layers checked as blocks */
static const char sess_magic[8] = {'A', 'K', 'V', 'S', 'E', 'S', 'S', '1'};

typedef struct sess_header {
    char magic[8];
    uint32_t version, n_layers, n_kv_heads, head_dim, dtype, n_vocab;
    uint64_t fingerprint, n_tokens;
    uint64_t salt;     /* the cache_salt of the requests that wrote it (akv__ctx) */
    uint8_t exact;     /* its history kept exact (kv_exact) */
    int8_t retention;  /* its last request's retention */
    uint8_t pad[SESS_HEADER - 8 - 6 * 4 - 3 * 8 - 2];
} sess_header;

_Static_assert(sizeof(sess_header) == SESS_HEADER, "the header is 64 bytes");

/* What tells this model from another that could not have written the K/V. */
static uint64_t sess_fingerprint(const akv_engine *e) {
    const akv_model_config *c = &e->cfg;
    uint64_t h = akv_hash64_init();
    const uint32_t u[] = {(uint32_t)c->arch, c->n_layers, c->n_embd, c->n_ff, c->n_heads,
                          c->n_kv_heads, c->head_dim, c->n_rot, c->n_vocab, (uint32_t)c->rope_mode,
                          c->has_rope_factors, c->tied_output, c->has_qkv_bias, c->has_qk_norm};
    const double d[] = {c->rms_eps, c->rope_base, c->rope_freq_scale};
    h = akv_hash64_add(h, u, sizeof u);
    h = akv_hash64_add(h, d, sizeof d);
    for (uint32_t id = 0; e->tok && id < c->n_vocab; id++) {
        size_t n = 0;
        const uint8_t *p = akv_tok_token_piece(e->tok, (int32_t)id, &n);
        h = akv_hash64_add(h, &n, sizeof n);
        if (p && n) h = akv_hash64_add(akv_hash64_mix(h), p, n);
    }
    /* the weights as the file stores them: each tensor's name, type, shape and 256 bytes from
     * the middle of its data (a fine-tune of the same base differs there) */
    const akv_gguf *g = e->model ? akv_model_gguf(e->model) : NULL;
    for (size_t i = 0; g && i < akv_gguf_n_tensors(g); i++) {
        const akv_gguf_tensor *t = akv_gguf_tensor_at(g, i);
        uint8_t sample[256 + 8] = {0};
        const size_t k = t->n_bytes < 256 ? (size_t)t->n_bytes : 256;
        memcpy(sample, &t->type, sizeof t->type < 8 ? sizeof t->type : 8);
        if (k && akv_gguf_tensor_read(g, t, (t->n_bytes - k) / 2, sample + 8, k) != AKV_OK)
            memset(sample + 8, 0xff, k); /* unreadable: still a fingerprint, never a match by luck */
        h = akv_hash64_add(akv_hash64_mix(h), t->name, strlen(t->name));
        h = akv_hash64_add(akv_hash64_mix(h), t->ne, sizeof t->ne);
        h = akv_hash64_add(akv_hash64_mix(h), sample, sizeof sample);
    }
    return akv_hash64_final(h, c->n_vocab);
}

/* The header of a context of n_tokens (its salt, exact and retention: c's; NULL: zero). The
 * fingerprint is computed once an engine. */
static sess_header sess_header_of(akv_engine *e, uint64_t n_tokens, const akv__ctx *c) {
    const akv_geom *g = &e->plan.geom;
    if (!e->sess_fingerprint_ok) e->sess_fingerprint = sess_fingerprint(e), e->sess_fingerprint_ok = true;
    sess_header hd;
    memset(&hd, 0, sizeof hd);
    memcpy(hd.magic, sess_magic, sizeof hd.magic);
    hd.version = SESS_VERSION, hd.n_layers = g->n_layers, hd.n_kv_heads = g->n_kv_heads;
    hd.head_dim = g->head_dim, hd.dtype = (uint32_t)g->dtype, hd.n_vocab = e->cfg.n_vocab;
    hd.fingerprint = e->sess_fingerprint, hd.n_tokens = n_tokens;
    if (c) hd.salt = c->salt, hd.exact = c->exact, hd.retention = c->retention;
    return hd;
}

/* A layer's rows in the file's order against its pages: [2][H][n][D] <-> pages of
 * [2][H][P][D]. */
typedef struct sess_io {
    akv_engine *e;
    FILE *f;
    const char *path;
    uint64_t n_tokens, hash, bytes;
    uint8_t *layer;      /* [2][H][n][D] elements of the current layer */
    size_t layer_bytes;
    struct sess_ahead *ahead; /* reading: the thread that reads the layers ahead, or NULL */
    uint8_t *mem;        /* writing an image: the whole file's bytes go here (else to f) */
    double wait_s;       /* reading: seconds the caller waited for the K/V's reads (the reads
                            themselves without the read-ahead), not its checking or placing */
} sess_io;

/* A layer of the K/V [2][H][n][D] folded into the checksum (its block checksum). */
static void sess_fold_layer(sess_io *io, const uint8_t *layer) {
    const uint64_t b = akv_hash64_block(layer, io->layer_bytes);
    io->hash = akv_hash64_add(akv_hash64_mix(io->hash), &b, sizeof b), io->bytes += io->layer_bytes;
}

/* Reading a session's K/V ahead: a thread reads layer l + 1 from the file into the other of two
 * buffers while the caller checks and places layer l, so the disk and the copies overlap (the
 * caller folds each layer's checksum in order, so the checksum is the file's). */
typedef struct sess_ahead {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    FILE *f;
    size_t bytes;        /* a layer's */
    uint32_t n_layers;
    uint8_t *buf[2];     /* layer l in buf[l & 1] */
    uint32_t filled;     /* layers read */
    uint32_t released;   /* layers the caller is done with */
    bool failed, stop;   /* a short read; the caller ends it */
} sess_ahead;

static void *ahead_main(void *arg) {
    sess_ahead *a = arg;
    for (uint32_t l = 0; l < a->n_layers; l++) {
        pthread_mutex_lock(&a->mu);
        while (!a->stop && l >= a->released + 2) pthread_cond_wait(&a->cv, &a->mu);
        const bool stop = a->stop;
        pthread_mutex_unlock(&a->mu);
        if (stop) break;
        const bool ok = fread(a->buf[l & 1], 1, a->bytes, a->f) == a->bytes;
        pthread_mutex_lock(&a->mu);
        if (ok) a->filled = l + 1;
        else a->failed = true;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        if (!ok) break;
    }
    return NULL;
}

/* Starts reading n_layers layers of `bytes` each from f (false: no thread or no memory; the
 * caller reads them itself). */
static bool ahead_start(sess_ahead *a, FILE *f, size_t bytes, uint32_t n_layers) {
    memset(a, 0, sizeof *a);
    a->f = f, a->bytes = bytes, a->n_layers = n_layers;
    a->buf[0] = akv__malloc(bytes), a->buf[1] = akv__malloc(bytes);
    if (a->buf[0] && a->buf[1]) {
        pthread_mutex_init(&a->mu, NULL);
        pthread_cond_init(&a->cv, NULL);
        if (pthread_create(&a->th, NULL, ahead_main, a) == 0) return true;
        pthread_mutex_destroy(&a->mu);
        pthread_cond_destroy(&a->cv);
    }
    akv__free(a->buf[0]), akv__free(a->buf[1]);
    return false;
}

/* Stops the thread (where it is) and frees the buffers. */
static void ahead_end(sess_ahead *a) {
    pthread_mutex_lock(&a->mu);
    a->stop = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->th, NULL);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    akv__free(a->buf[0]), akv__free(a->buf[1]);
}

/* Layer l read ahead, into io->layer and the checksum (the layers before it are released). */
static akv_status ahead_take(sess_io *io, uint32_t l) {
    sess_ahead *a = io->ahead;
    const double t0 = akv_clock_s();
    pthread_mutex_lock(&a->mu);
    a->released = l;
    pthread_cond_broadcast(&a->cv);
    while (a->filled <= l && !a->failed) pthread_cond_wait(&a->cv, &a->mu);
    const bool have = a->filled > l;
    pthread_mutex_unlock(&a->mu);
    io->wait_s += akv_clock_s() - t0;
    if (!have) {
        AKV_LOG_E("engine: the session '%s' ends inside its K/V (truncated, or not a session)", io->path);
        return AKV_EFORMAT;
    }
    io->layer = a->buf[l & 1];
    sess_fold_layer(io, io->layer);
    return AKV_OK;
}

static void sess_rows(const sess_io *io, uint32_t page, uint8_t *pg, bool to_page) {
    const akv_geom *g = &io->e->plan.geom;
    const size_t eb = akv_dtype_size(g->dtype);
    const size_t row = (size_t)g->head_dim * eb;
    const uint64_t t0 = (uint64_t)page * g->page_tokens;
    const uint64_t n = io->n_tokens - t0 < g->page_tokens ? io->n_tokens - t0 : g->page_tokens;
    for (uint32_t kh = 0; kh < 2 * g->n_kv_heads; kh++) {
        uint8_t *in_page = pg + (size_t)kh * g->page_tokens * row;
        uint8_t *in_file = io->layer + ((size_t)kh * io->n_tokens + t0) * row;
        if (!to_page) {
            memcpy(in_file, in_page, n * row);
            continue;
        }
        memcpy(in_page, in_file, n * row);
        memset(in_page + n * row, 0, (g->page_tokens - n) * row); /* a last page's unused rows */
    }
}

/* n bytes out at io->bytes (the checksum is the caller's). */
static akv_status sess_put(sess_io *io, const void *p, size_t n) {
    if (io->mem) {
        if (n && p != io->mem + io->bytes) memcpy(io->mem + io->bytes, p, n);
    } else if (n && fwrite(p, 1, n, io->f) != n) {
        AKV_LOG_E("engine: writing the session '%s' failed: %s", io->path, strerror(errno));
        return AKV_EIO;
    }
    return AKV_OK;
}

static akv_status sess_write(sess_io *io, const void *p, size_t n) {
    akv_status st = sess_put(io, p, n);
    if (!st) io->hash = akv_hash64_add(io->hash, p, n), io->bytes += n;
    return st;
}

static akv_status sess_read(sess_io *io, void *p, size_t n, const char *what) {
    if (n && fread(p, 1, n, io->f) != n) {
        AKV_LOG_E("engine: the session '%s' ends inside its %s (truncated, or not a session)",
                  io->path, what);
        return AKV_EFORMAT;
    }
    io->hash = akv_hash64_add(io->hash, p, n), io->bytes += n;
    return AKV_OK;
}

/* The next layer of the K/V into io->layer, here (no read-ahead), its checksum folded. */
static akv_status sess_read_layer(sess_io *io) {
    const double t0 = akv_clock_s();
    const bool whole = fread(io->layer, 1, io->layer_bytes, io->f) == io->layer_bytes;
    io->wait_s += akv_clock_s() - t0;
    if (!whole) {
        AKV_LOG_E("engine: the session '%s' ends inside its K/V (truncated, or not a session)", io->path);
        return AKV_EFORMAT;
    }
    sess_fold_layer(io, io->layer);
    return AKV_OK;
}

static akv_status sess_page_out(void *user, uint32_t layer, uint32_t page, const void *bytes,
                                size_t page_bytes) {
    (void)layer, (void)page_bytes;
    sess_io *io = user;
    const akv_geom *g = &io->e->plan.geom;
    if (io->mem && page == 0) io->layer = io->mem + io->bytes; /* the rows in place */
    sess_rows(io, page, (uint8_t *)bytes, false);
    if ((uint64_t)(page + 1) * g->page_tokens < io->n_tokens) return AKV_OK;
    /* the layer's last page: the layer out, its block checksum folded */
    akv_status st = sess_put(io, io->layer, io->layer_bytes);
    if (!st) sess_fold_layer(io, io->layer);
    return st;
}

static akv_status sess_page_in(void *user, uint32_t layer, uint32_t page, void *bytes,
                               size_t page_bytes) {
    sess_io *io = user;
    akv_status st;
    (void)page_bytes;
    if (page == 0 && (st = io->ahead ? ahead_take(io, layer) : sess_read_layer(io))) return st;
    sess_rows(io, page, bytes, true);
    return AKV_OK;
}

/* c's file through io's sink: header, tokens, K/V, checksum. AKV_ESTATE when a step was
 * undone under it (its route holds another length), or when not every layer came. */
static akv_status sess_emit(akv_engine *e, const akv__ctx *c, sess_io *io) {
    if (akv_route_seq_n_tokens(c->seq) != c->n_tokens) { /* a step was undone under it */
        AKV_LOG_E("engine: the conversation to save holds %llu tokens in the route, %u in the "
                  "engine: not saved",
                  (unsigned long long)akv_route_seq_n_tokens(c->seq), c->n_tokens);
        return AKV_ESTATE;
    }
    const sess_header hd = sess_header_of(e, c->n_tokens, c);
    const uint64_t zero = 0;
    akv_status st = sess_write(io, &hd, sizeof hd);
    if (!st) st = sess_write(io, c->tokens, (size_t)c->n_tokens * sizeof *c->tokens);
    if (!st) st = sess_write(io, &zero, (c->n_tokens & 1) * sizeof(int32_t));
    if (!st && c->n_tokens) st = akv_route_seq_read_pages(e->route, c->seq, sess_page_out, io);
    const uint64_t check = akv_hash64_final(io->hash, io->bytes);
    if (!st && io->bytes != akv__session_file_bytes(e, c->n_tokens) - sizeof check)
        st = AKV_ESTATE; /* every layer written, or nothing renamed */
    if (!st) st = sess_write(io, &check, sizeof check);
    return st;
}

/* PATH.tmp.PID.X opened for writing (*tmp: its name, akv__malloc'ed). AKV_EIO (logged). */
static akv_status sess_open_tmp(const char *path, char **tmp, FILE **f) {
    *f = NULL;
    if (!(*tmp = akv__malloc(strlen(path) + 48))) return AKV_ENOMEM;
    /* the process and this call's own frame: two writers of a path at once (the session
     * directory's thread and the engine's) never share a temporary file */
    sprintf(*tmp, "%s.tmp.%ld.%llx", path, (long)getpid(), (unsigned long long)(uintptr_t)tmp);
    if ((*f = fopen(*tmp, "wb"))) return AKV_OK;
    AKV_LOG_E("engine: cannot write the session '%s': %s", *tmp, strerror(errno));
    return AKV_EIO;
}

/* The temporary file flushed to the disk and renamed over path (st: how the writing went); on
 * any failure it is removed and the failure logged. Frees tmp. */
static akv_status sess_finish(const char *path, char *tmp, FILE *f, akv_status st) {
    if (f) {
        int err = 0;
        if (!st && (fflush(f) != 0 || fsync(fileno(f)) != 0)) st = AKV_EIO, err = errno;
        if (fclose(f) != 0 && !st) st = AKV_EIO, err = errno;
        if (!st && rename(tmp, path) != 0) st = AKV_EIO, err = errno;
        if (st) {
            AKV_LOG_E("engine: saving the session '%s' failed (%s): the conversation stays in "
                      "memory, any earlier file is left as it was",
                      path, err ? strerror(err) : akv_status_str(st));
            (void)remove(tmp);
        }
    }
    akv__free(tmp);
    return st;
}

akv_status akv__session_write(akv_engine *e, const akv__ctx *c, const char *path) {
    sess_io io = {.e = e, .path = path, .n_tokens = c->n_tokens, .hash = akv_hash64_init()};
    io.layer_bytes = (size_t)c->n_tokens * akv_geom_token_bytes(&e->plan.geom);
    char *tmp = NULL;
    akv_status st = sess_open_tmp(path, &tmp, &io.f);
    if (!st && !(io.layer = akv__malloc(io.layer_bytes ? io.layer_bytes : 1))) st = AKV_ENOMEM;
    if (!st) st = sess_emit(e, c, &io);
    akv__free(io.layer);
    return sess_finish(path, tmp, io.f, st);
}

akv_status akv__session_image(akv_engine *e, const akv__ctx *c, uint8_t **out, size_t *n) {
    const uint64_t bytes = akv__session_file_bytes(e, c->n_tokens);
    sess_io io = {.e = e, .n_tokens = c->n_tokens, .hash = akv_hash64_init(), .path = "(memory)"};
    io.layer_bytes = (size_t)c->n_tokens * akv_geom_token_bytes(&e->plan.geom);
    if (bytes > SIZE_MAX || !(io.mem = akv__malloc((size_t)bytes))) return AKV_ENOMEM;
    const akv_status st = sess_emit(e, c, &io);
    if (st) {
        akv__free(io.mem);
        return st;
    }
    *out = io.mem, *n = (size_t)bytes;
    return AKV_OK;
}

akv_status akv__session_write_image(const char *path, const uint8_t *image, size_t n) {
    char *tmp = NULL;
    FILE *f = NULL;
    akv_status st = sess_open_tmp(path, &tmp, &f);
    if (!st && fwrite(image, 1, n, f) != n) {
        AKV_LOG_E("engine: writing the session '%s' failed: %s", path, strerror(errno));
        st = AKV_EIO;
    }
    return sess_finish(path, tmp, f, st);
}

uint64_t akv__session_file_bytes(const akv_engine *e, uint64_t n_tokens) {
    return SESS_HEADER + (n_tokens + (n_tokens & 1)) * 4 +
           (uint64_t)e->plan.geom.n_layers * n_tokens * akv_geom_token_bytes(&e->plan.geom) + 8;
}

akv_status akv_engine_session_save(akv_engine *e, const int32_t *tokens, uint32_t n,
                                   const char *path) {
    if (!e || !path || (n && !tokens)) return AKV_EINVAL;
    /* the idle context holding the longest prefix of tokens */
    akv__ctx *best = NULL;
    uint32_t lcp = 0;
    for (akv__ctx *c = e->idle_head; c; c = c->next) {
        const uint32_t k = akv__common_prefix(c->tokens, c->n_tokens, tokens, n);
        if (k > lcp) lcp = k, best = c;
    }
    if (!best) {
        AKV_LOG_E("engine: no finished conversation holds these tokens: nothing to save to '%s'", path);
        return AKV_ENOTFOUND;
    }
    return akv__session_write(e, best, path);
}

/* Opens path and reads its header, checked against this engine. AKV_ENOTFOUND, AKV_EIO,
 * AKV_EFORMAT, AKV_EFULL (all logged; the file closed). */
static akv_status sess_open(akv_engine *e, sess_io *io, sess_header *hd) {
    const char *path = io->path;
    if (!(io->f = fopen(path, "rb"))) {
        AKV_LOG_E("engine: cannot read the session '%s': %s", path, strerror(errno));
        return errno == ENOENT ? AKV_ENOTFOUND : AKV_EIO;
    }
    akv_status st = sess_read(io, hd, sizeof *hd, "header");
    if (!st && memcmp(hd->magic, sess_magic, sizeof sess_magic)) {
        AKV_LOG_E("engine: '%s' is not an akv session", path);
        st = AKV_EFORMAT;
    }
    if (!st && hd->version != SESS_VERSION) {
        AKV_LOG_E("engine: the session '%s' is of version %u; this build reads %u", path,
                  hd->version, SESS_VERSION);
        st = AKV_EFORMAT;
    }
    const sess_header want = sess_header_of(e, hd->n_tokens, NULL);
    if (!st && (hd->fingerprint != want.fingerprint || hd->n_layers != want.n_layers ||
                hd->n_kv_heads != want.n_kv_heads || hd->head_dim != want.head_dim ||
                hd->dtype != want.dtype || hd->n_vocab != want.n_vocab)) {
        AKV_LOG_E("engine: the session '%s' was saved by another model (or another K/V type): "
                  "nothing loaded",
                  path);
        st = AKV_EFORMAT;
    }
    if (!st && (hd->n_tokens == 0 || hd->n_tokens > e->plan.max_context)) {
        AKV_LOG_E("engine: the session '%s' holds %llu tokens; this engine takes 1 to "
                  "{=max_context} %llu",
                  path, (unsigned long long)hd->n_tokens, (unsigned long long)e->plan.max_context);
        st = hd->n_tokens ? AKV_EFULL : AKV_EFORMAT;
    }
    if (st) fclose(io->f), io->f = NULL;
    return st;
}

/* The token ids after the header into tok[n] (checked against the vocabulary). */
static akv_status sess_tokens(akv_engine *e, sess_io *io, int32_t *tok, uint32_t n) {
    uint64_t pad = 0;
    akv_status st = sess_read(io, tok, (size_t)n * sizeof *tok, "tokens");
    if (!st) st = sess_read(io, &pad, (n & 1) * sizeof(int32_t), "tokens");
    for (uint32_t i = 0; !st && i < n; i++)
        if (tok[i] < 0 || (uint32_t)tok[i] >= e->cfg.n_vocab) {
            AKV_LOG_E("engine: the session '%s' holds token %d at %u, outside the vocabulary",
                      io->path, tok[i], i);
            st = AKV_EFORMAT;
        }
    return st;
}

akv_status akv__session_peek(akv_engine *e, const char *path, akv__ctx *meta) {
    sess_io io = {.e = e, .path = path, .hash = akv_hash64_init()};
    sess_header hd;
    memset(meta, 0, sizeof *meta);
    akv_status st = sess_open(e, &io, &hd);
    if (st) return st;
    meta->n_tokens = meta->cap = (uint32_t)hd.n_tokens;
    meta->salt = hd.salt, meta->exact = hd.exact != 0, meta->retention = hd.retention;
    if (!(meta->tokens = akv__malloc((size_t)meta->cap * sizeof *meta->tokens))) st = AKV_ENOMEM;
    if (!st) st = sess_tokens(e, &io, meta->tokens, meta->n_tokens);
    fclose(io.f);
    if (st) akv__free(meta->tokens), meta->tokens = NULL;
    return st;
}

/* ---- a session read into a sequence opened unfilled, on a thread of its own or here ---------- */

struct akv__restore {
    akv_engine *e;
    sess_io io;      /* the file, read to the start of its K/V */
    uint64_t n_tokens;
    akv__ctx *c;     /* its context: tokens known, sequence opened unfilled */
    void **pages;    /* [n_layers][n_pages] its host pages' addresses */
    uint32_t n_pages;
    bool threaded;   /* th runs restore_main */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;       /* under mu: st is the fill's */
    akv_status st;
};

/* The K/V into the pages, layer by layer (read ahead where a thread can be had), then the
 * checksum and the file's end; the file closed. Touches nothing of the engine's but the
 * sequence's pages, which nothing else touches until they are marked filled. */
static akv_status restore_fill(akv__restore *j) {
    sess_io *io = &j->io;
    const akv_geom *g = &j->e->plan.geom;
    const size_t pb = akv_geom_page_bytes(g);
    akv_status st = AKV_OK;
    sess_ahead ahead;
    if (ahead_start(&ahead, io->f, io->layer_bytes, g->n_layers)) io->ahead = &ahead;
    else if (!(io->layer = akv__malloc(io->layer_bytes))) st = AKV_ENOMEM; /* read here */
    for (uint32_t l = 0; !st && l < g->n_layers; l++)
        for (uint32_t p = 0; !st && p < j->n_pages; p++)
            st = sess_page_in(io, l, p, j->pages[(size_t)l * j->n_pages + p], pb);
    if (io->ahead) { /* every layer read (or the fill stopped): the file is ours again */
        ahead_end(&ahead);
        io->ahead = NULL, io->layer = NULL;
    }
    uint64_t check = 0;
    const uint64_t got = akv_hash64_final(io->hash, io->bytes);
    char extra;
    if (!st && (fread(&check, 1, sizeof check, io->f) != sizeof check || check != got ||
                fread(&extra, 1, 1, io->f) != 0)) {
        AKV_LOG_E("engine: the session '%s' is damaged (its checksum does not match, or it is "
                  "cut or has bytes after its end): nothing loaded",
                  io->path);
        st = AKV_EFORMAT;
    }
    fclose(io->f), io->f = NULL;
    akv__free(io->layer), io->layer = NULL;
    return st;
}

static void *restore_main(void *arg) {
    akv__restore *j = arg;
    while (atomic_load(&j->e->restore_hold)) akv_clock_sleep_ns(1000000); /* tests */
    const akv_status st = restore_fill(j);
    pthread_mutex_lock(&j->mu);
    j->st = st, j->done = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

static void restore_free(akv__restore *j) {
    if (j->io.f) fclose(j->io.f);
    akv__free((void *)j->io.path);
    akv__free(j->pages);
    akv__free(j);
}

akv_status akv__restore_begin(akv_engine *e, const char *path, bool threaded, akv__restore **out) {
    akv__restore *j = akv__calloc(1, sizeof *j);
    if (!j) return AKV_ENOMEM;
    j->e = e;
    j->io = (sess_io){.e = e, .path = akv__strdup(path), .hash = akv_hash64_init()};
    if (!j->io.path) {
        akv__free(j);
        return AKV_ENOMEM;
    }
    sess_header hd;
    akv_status st = sess_open(e, &j->io, &hd);
    akv__ctx *c = NULL;
    if (!st && !(c = j->c = akv__calloc(1, sizeof *c))) st = AKV_ENOMEM;
    if (!st) {
        j->n_tokens = j->io.n_tokens = hd.n_tokens;
        j->io.layer_bytes = (size_t)hd.n_tokens * akv_geom_token_bytes(&e->plan.geom);
        j->n_pages = (uint32_t)akv_geom_pages_for_tokens(&e->plan.geom, hd.n_tokens);
        c->cap = (uint32_t)hd.n_tokens, c->n_tokens = (uint32_t)hd.n_tokens;
        c->salt = hd.salt, c->exact = hd.exact != 0, c->retention = hd.retention;
        if (!(c->tokens = akv__malloc((size_t)c->cap * sizeof *c->tokens)) ||
            !(j->pages = akv__malloc((size_t)e->plan.geom.n_layers * j->n_pages * sizeof *j->pages)))
            st = AKV_ENOMEM;
    }
    if (!st) st = sess_tokens(e, &j->io, c->tokens, c->n_tokens);
    if (!st) {
        const akv_route_seq_params sp = {.max_history = e->plan.max_context,
                                         .target = e->plan.route.target,
                                         .burst = e->plan.route.burst,
                                         .exact = c->exact};
        st = akv_route_seq_open_unfilled(e->route, &sp, hd.n_tokens, j->pages, &c->seq);
    }
    if (st) {
        akv__ctx_close(e, c); /* NULL-safe; its sequence only once opened */
        restore_free(j);
        return st;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->threaded = threaded && pthread_create(&j->th, NULL, restore_main, j) == 0;
    if (!j->threaded) j->st = restore_fill(j), j->done = true; /* here, now */

    *out = j;
    return AKV_OK;
}

akv__ctx *akv__restore_ctx(const akv__restore *j) {
    return j->c;
}

bool akv__restore_wait(akv__restore *j, double max_s) {
    pthread_mutex_lock(&j->mu);
    if (!j->done && max_s > 0) {
        const struct timespec until = akv_clock_deadline(max_s);
        while (!j->done && pthread_cond_timedwait(&j->cv, &j->mu, &until) == 0) {
        }
    }
    const bool done = j->done;
    pthread_mutex_unlock(&j->mu);
    return done;
}

akv_status akv__restore_end(akv_engine *e, akv__restore *j, akv__ctx **out, double *disk_s) {
    if (j->threaded) pthread_join(j->th, NULL);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    akv__ctx *c = j->c;
    akv_status st = j->st;
    if (!st) st = akv_route_seq_mark_filled(e->route, c->seq);
    if (disk_s) *disk_s = j->io.wait_s;
    restore_free(j);
    if (st) {
        akv__ctx_close(e, c);
        return st;
    }
    *out = c;
    return AKV_OK;
}

akv_status akv__session_read(akv_engine *e, const char *path, akv__ctx **out, double *disk_s) {
    akv__restore *j = NULL;
    akv_status st = akv__restore_begin(e, path, false, &j);
    return st ? st : akv__restore_end(e, j, out, disk_s);
}

akv_status akv_engine_session_load(akv_engine *e, const char *path, uint32_t *n_tokens) {
    if (!e || !path) return AKV_EINVAL;
    akv__ctx *c = NULL;
    akv_status st = akv__session_read(e, path, &c, NULL);
    if (st) return st;
    const uint32_t n_loaded = c->n_tokens;
    if ((st = akv__engine_idle_adopt(e, c, true))) { /* loaded for the prompts that follow */
        AKV_LOG_E("engine: the session '%s' (%u tokens) does not fit beside the running "
                  "requests' reservations in the host pool: nothing loaded",
                  path, n_loaded);
        return st;
    }
    if (n_tokens) *n_tokens = n_loaded;
    return AKV_OK;
}
