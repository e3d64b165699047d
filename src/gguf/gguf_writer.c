/*
 * gguf_writer.c — the streaming GGUF writer (akv/gguf_writer.h).
 *
 * Phase 1 encodes every kv into `kvs` and every tensor info into `infos` (growable byte
 * buffers) and keeps each tensor's name, byte size and relative offset. Phase 2 writes
 * header + kvs + infos + padding once, then passes the caller's bytes straight to the
 * FILE, padding each tensor to the alignment as it completes.
 */
#define _POSIX_C_SOURCE 200809L
#include "akv/gguf_writer.h"

#include <errno.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "gguf/gguf_impl.h"

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
} wbuf;

typedef struct wtensor {
    char name[AKV_GGUF_MAX_NAME + 1];
    uint64_t n_bytes;
} wtensor;

typedef enum wphase { WPHASE_META, WPHASE_DATA, WPHASE_DONE, WPHASE_FAILED } wphase;

struct akv_gguf_writer {
    FILE *f;
    char *path, *partial_path;
    size_t alignment;
    wphase phase;
    bool created;      /* the partial file exists (removed by destroy unless finished) */
    wbuf kvs;          /* encoded kvs, file order */
    wbuf infos;        /* encoded tensor infos */
    char **keys;       /* [n_kv] copies, for the uniqueness check */
    size_t n_kv, cap_keys;
    wtensor *tensors;  /* [n_tensors] */
    size_t n_tensors, cap_tensors;
    uint64_t data_bytes; /* relative offset where the next declared tensor goes */
    size_t cur;          /* phase 2: tensor receiving bytes */
    uint64_t cur_done;   /* bytes of it written */
};

static const uint8_t zeros[64];

/* ---- encoding into a buffer ------------------------------------------------------------------ */

static akv_status wbuf_put(wbuf *b, const void *src, size_t n) {
    size_t need;
    if (!akv__size_add(b->n, n, &need)) return AKV_EOVERFLOW;
    akv_status st = akv__array_reserve((void **)&b->p, &b->cap, need, 1);
    if (st) return st;
    if (n) memcpy(b->p + b->n, src, n);
    b->n = need;
    return AKV_OK;
}

static akv_status wbuf_u32(wbuf *b, uint32_t v) {
    uint8_t x[4];
    akv__gguf_st32(x, v);
    return wbuf_put(b, x, 4);
}

static akv_status wbuf_u64(wbuf *b, uint64_t v) {
    uint8_t x[8];
    akv__gguf_st64(x, v);
    return wbuf_put(b, x, 8);
}

static akv_status wbuf_str(wbuf *b, const char *s, size_t len) {
    akv_status st = wbuf_u64(b, len);
    return st ? st : wbuf_put(b, s, len);
}

/* ---- lifetime ------------------------------------------------------------------------------- */

akv_gguf_writer_params akv_gguf_writer_default_params(void) {
    return (akv_gguf_writer_params){.alignment = AKV_GGUF_DEFAULT_ALIGNMENT};
}

akv_status akv_gguf_writer_create(const char *path, const akv_gguf_writer_params *params,
                                  akv_gguf_writer **out) {
    akv_gguf_writer_params p = params ? *params : akv_gguf_writer_default_params();
    if (p.alignment == 0) p.alignment = AKV_GGUF_DEFAULT_ALIGNMENT;
    if (!path || !out || p.alignment < 8 || p.alignment > (1u << 30) ||
        (p.alignment & (p.alignment - 1))) {
        AKV_LOG_E("gguf writer: alignment %u is not a power of two in 8..2^30", p.alignment);
        return AKV_EINVAL;
    }
    /* the finished file is renamed over `path`: only a regular file may be replaced there (a
     * FIFO, device or directory, or a symbolic link, is refused) */
    struct stat sb;
    if (lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        AKV_LOG_E("gguf writer: '%s' exists and is not a regular file; it is not replaced", path);
        return AKV_EINVAL;
    }
    akv_gguf_writer *w = akv__calloc(1, sizeof *w);
    if (!w) return AKV_ENOMEM;
    w->alignment = p.alignment;
    size_t len = strlen(path);
    w->path = akv__strdup(path);
    w->partial_path = akv__malloc(len + sizeof ".partial");
    if (!w->path || !w->partial_path) {
        akv_gguf_writer_destroy(w);
        return AKV_ENOMEM;
    }
    memcpy(w->partial_path, path, len);
    memcpy(w->partial_path + len, ".partial", sizeof ".partial");
    w->f = fopen(w->partial_path, "wb");
    if (!w->f) {
        AKV_LOG_E("gguf writer: cannot create '%s': %s", w->partial_path, strerror(errno));
        akv_gguf_writer_destroy(w);
        return AKV_EIO;
    }
    w->created = true;
    /* The general.alignment key is owned by the params: written here, refused as a key. */
    if (w->alignment != AKV_GGUF_DEFAULT_ALIGNMENT) {
        akv_status st = wbuf_str(&w->kvs, "general.alignment", 17);
        if (!st) st = wbuf_u32(&w->kvs, AKV_GGUF_VTYPE_U32);
        if (!st) st = wbuf_u32(&w->kvs, (uint32_t)w->alignment);
        if (!st) w->n_kv = 1;
        if (st) {
            akv_gguf_writer_destroy(w);
            return st;
        }
    }
    *out = w;
    return AKV_OK;
}

void akv_gguf_writer_destroy(akv_gguf_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    if (w->created && w->phase != WPHASE_DONE) remove(w->partial_path);
    for (size_t i = 0; i < w->n_kv; i++)
        if (w->keys) akv__free(w->keys[i]);
    akv__free(w->keys);
    akv__free(w->tensors);
    akv__free(w->kvs.p);
    akv__free(w->infos.p);
    akv__free(w->path);
    akv__free(w->partial_path);
    akv__free(w);
}

/* AKV_OK if the writer may still take metadata. */
static akv_status in_meta_phase(const akv_gguf_writer *w, const char *what) {
    if (w->phase == WPHASE_FAILED) return AKV_EIO;
    if (w->phase == WPHASE_META) return AKV_OK;
    AKV_LOG_E("gguf writer: %s after the tensor data began", what);
    return AKV_ESTATE;
}

/* ---- phase 1 ------------------------------------------------------------------------------- */

/* Validates a new key; records a copy on success (the kv itself is then appended). The
 * general.alignment key is refused: the params own it. */
static akv_status claim_key(akv_gguf_writer *w, const char *key) {
    akv_status st = in_meta_phase(w, "a kv");
    if (st) return st;
    size_t len = key ? strlen(key) : 0;
    bool ok = len > 0 && len <= AKV_GGUF_MAX_KEY;
    for (size_t i = 0; ok && i < len; i++) ok = key[i] >= 0x20 && key[i] <= 0x7e;
    if (!ok) {
        AKV_LOG_E("gguf writer: key '%.64s' is not 1..65535 printable ASCII bytes",
                  key ? key : "(null)");
        return AKV_EINVAL;
    }
    if (!strcmp(key, "general.alignment")) {
        AKV_LOG_E("gguf writer: general.alignment is set through the writer params");
        return AKV_EINVAL;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (w->keys && w->keys[i] && !strcmp(w->keys[i], key)) {
            AKV_LOG_E("gguf writer: key '%s' added twice", key);
            return AKV_EINVAL;
        }
    }
    if ((st = akv__array_reserve((void **)&w->keys, &w->cap_keys, w->n_kv + 1, sizeof *w->keys)))
        return st;
    if (!(w->keys[w->n_kv] = akv__strdup(key))) return AKV_ENOMEM;
    return AKV_OK;
}

/* Appends encoded bytes for the key just claimed; on failure unclaims it and restores the
 * buffer, so a failed add changes nothing. */
static akv_status commit_kv(akv_gguf_writer *w, size_t kvs_before, akv_status st) {
    if (st) {
        w->kvs.n = kvs_before;
        akv__free(w->keys[w->n_kv]);
        w->keys[w->n_kv] = NULL;
        return st;
    }
    w->n_kv++;
    return AKV_OK;
}

akv_status akv_gguf_writer_add_value(akv_gguf_writer *w, const char *key, const akv_gguf_value *v) {
    if (!w || !v || v->type >= AKV_GGUF_VTYPE_COUNT) return AKV_EINVAL;
    if (v->type == AKV_GGUF_VTYPE_ARRAY && akv__gguf_vtype_size(v->as.arr.type) == 0) {
        AKV_LOG_E("gguf writer: key '%s': arrays of %s are written with add_arr_str or not at all",
                  key ? key : "(null)", akv_gguf_vtype_name(v->as.arr.type));
        return AKV_EINVAL;
    }
    akv_status st = claim_key(w, key);
    if (st) return st;
    size_t before = w->kvs.n;
    st = wbuf_str(&w->kvs, key, strlen(key));
    if (!st) st = wbuf_u32(&w->kvs, v->type);
    uint8_t x[8];
    size_t n_bytes;
    switch (v->type) {
    case AKV_GGUF_VTYPE_STRING:
        if (!st) st = wbuf_str(&w->kvs, v->as.str.ptr, v->as.str.len);
        break;
    case AKV_GGUF_VTYPE_ARRAY:
        if (!st) st = wbuf_u32(&w->kvs, v->as.arr.type);
        if (!st) st = wbuf_u64(&w->kvs, v->as.arr.n);
        if (!st && !akv__size_mul((size_t)v->as.arr.n, akv__gguf_vtype_size(v->as.arr.type),
                                  &n_bytes))
            st = AKV_EOVERFLOW;
        if (!st) st = wbuf_put(&w->kvs, v->as.arr.data, n_bytes);
        break;
    case AKV_GGUF_VTYPE_F32: {
        float f = (float)v->as.f;
        uint32_t u;
        memcpy(&u, &f, 4);
        akv__gguf_st32(x, u);
        if (!st) st = wbuf_put(&w->kvs, x, 4);
        break;
    }
    case AKV_GGUF_VTYPE_F64: {
        uint64_t u;
        memcpy(&u, &v->as.f, 8);
        akv__gguf_st64(x, u);
        if (!st) st = wbuf_put(&w->kvs, x, 8);
        break;
    }
    case AKV_GGUF_VTYPE_BOOL:
        x[0] = v->as.b ? 1 : 0;
        if (!st) st = wbuf_put(&w->kvs, x, 1);
        break;
    default: {
        /* Integers: the low bytes of the two's-complement value, little-endian. */
        uint64_t u = (v->type == AKV_GGUF_VTYPE_I8 || v->type == AKV_GGUF_VTYPE_I16 ||
                      v->type == AKV_GGUF_VTYPE_I32 || v->type == AKV_GGUF_VTYPE_I64)
                         ? (uint64_t)v->as.i
                         : v->as.u;
        akv__gguf_st64(x, u);
        if (!st) st = wbuf_put(&w->kvs, x, akv__gguf_vtype_size(v->type));
    }
    }
    return commit_kv(w, before, st);
}

akv_status akv_gguf_writer_add_u32(akv_gguf_writer *w, const char *key, uint32_t u) {
    akv_gguf_value v = {.type = AKV_GGUF_VTYPE_U32, .as.u = u};
    return akv_gguf_writer_add_value(w, key, &v);
}

akv_status akv_gguf_writer_add_u64(akv_gguf_writer *w, const char *key, uint64_t u) {
    akv_gguf_value v = {.type = AKV_GGUF_VTYPE_U64, .as.u = u};
    return akv_gguf_writer_add_value(w, key, &v);
}

akv_status akv_gguf_writer_add_f32(akv_gguf_writer *w, const char *key, float f) {
    akv_gguf_value v = {.type = AKV_GGUF_VTYPE_F32, .as.f = f};
    return akv_gguf_writer_add_value(w, key, &v);
}

akv_status akv_gguf_writer_add_str(akv_gguf_writer *w, const char *key, const char *s) {
    if (!s) return AKV_EINVAL;
    akv_gguf_value v = {.type = AKV_GGUF_VTYPE_STRING, .as.str = {s, strlen(s)}};
    return akv_gguf_writer_add_value(w, key, &v);
}

akv_status akv_gguf_writer_add_arr_str(akv_gguf_writer *w, const char *key,
                                       const akv_gguf_str *strs, uint64_t n) {
    if (!w || (!strs && n)) return AKV_EINVAL;
    akv_status st = claim_key(w, key);
    if (st) return st;
    size_t before = w->kvs.n;
    st = wbuf_str(&w->kvs, key, strlen(key));
    if (!st) st = wbuf_u32(&w->kvs, AKV_GGUF_VTYPE_ARRAY);
    if (!st) st = wbuf_u32(&w->kvs, AKV_GGUF_VTYPE_STRING);
    if (!st) st = wbuf_u64(&w->kvs, n);
    for (uint64_t i = 0; i < n && !st; i++) st = wbuf_str(&w->kvs, strs[i].ptr, strs[i].len);
    return commit_kv(w, before, st);
}

akv_status akv_gguf_writer_copy_kv(akv_gguf_writer *w, const akv_gguf *src, size_t idx) {
    if (!w || !src || idx >= akv_gguf_n_kv(src)) return AKV_EINVAL;
    akv_status st = claim_key(w, akv_gguf_kv_key(src, idx));
    if (st) return st;
    const uint8_t *p;
    size_t n;
    akv__gguf_kv_span(src, idx, &p, &n);
    size_t before = w->kvs.n;
    return commit_kv(w, before, wbuf_put(&w->kvs, p, n));
}

akv_status akv_gguf_writer_add_tensor(akv_gguf_writer *w, const char *name, akv_gguf_type type,
                                      uint32_t n_dims, const uint64_t *ne) {
    if (!w || !ne) return AKV_EINVAL;
    akv_status st = in_meta_phase(w, "a tensor");
    if (st) return st;
    size_t len = name ? strlen(name) : 0, blk = akv_gguf_type_block_elems(type);
    if (len == 0 || len > AKV_GGUF_MAX_NAME) {
        AKV_LOG_E("gguf writer: tensor name '%.80s' is not 1..%d bytes", name ? name : "(null)",
                  AKV_GGUF_MAX_NAME);
        return AKV_EINVAL;
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        if (!strcmp(w->tensors[i].name, name)) {
            AKV_LOG_E("gguf writer: tensor '%s' declared twice", name);
            return AKV_EINVAL;
        }
    }
    if (n_dims < 1 || n_dims > AKV_GGUF_MAX_DIMS || blk == 0 || ne[0] % blk != 0) {
        AKV_LOG_E("gguf writer: tensor '%s': %u dims, type %u, ne[0] %llu: needs 1..4 dims, a "
                  "known type, ne[0] a multiple of its block size %zu",
                  name, n_dims, (unsigned)type, (unsigned long long)ne[0], blk);
        return AKV_EINVAL;
    }
    uint64_t n_elems = 1, n_bytes = 0;
    bool fits = true;
    for (uint32_t d = 0; d < n_dims; d++)
        fits = fits && !__builtin_mul_overflow(n_elems, ne[d], &n_elems);
    fits = fits && n_elems <= (uint64_t)INT64_MAX &&
           !__builtin_mul_overflow(n_elems / blk, (uint64_t)akv_gguf_type_block_bytes(type),
                                   &n_bytes) &&
           n_bytes <= (uint64_t)INT64_MAX - w->data_bytes - w->alignment;
    if (!fits) {
        AKV_LOG_E("gguf writer: tensor '%s' is too large", name);
        return AKV_EOVERFLOW;
    }
    if ((st = akv__array_reserve((void **)&w->tensors, &w->cap_tensors, w->n_tensors + 1,
                                 sizeof *w->tensors)))
        return st;
    size_t before = w->infos.n;
    st = wbuf_str(&w->infos, name, len);
    if (!st) st = wbuf_u32(&w->infos, n_dims);
    for (uint32_t d = 0; d < n_dims && !st; d++) st = wbuf_u64(&w->infos, ne[d]);
    if (!st) st = wbuf_u32(&w->infos, type);
    if (!st) st = wbuf_u64(&w->infos, w->data_bytes);
    if (st) {
        w->infos.n = before;
        return st;
    }
    wtensor *t = &w->tensors[w->n_tensors++];
    memcpy(t->name, name, len + 1);
    t->n_bytes = n_bytes;
    w->data_bytes += (n_bytes + w->alignment - 1) / w->alignment * w->alignment;
    return AKV_OK;
}

static uint64_t meta_bytes(const akv_gguf_writer *w) {
    uint64_t n = 24 + (uint64_t)w->kvs.n + w->infos.n;
    return (n + w->alignment - 1) / w->alignment * w->alignment;
}

uint64_t akv_gguf_writer_file_bytes(const akv_gguf_writer *w) {
    return meta_bytes(w) + w->data_bytes;
}

/* ---- phase 2 ------------------------------------------------------------------------------- */

static akv_status put(akv_gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->f) != n) {
        AKV_LOG_E("gguf writer: writing '%s' failed: %s", w->partial_path, strerror(errno));
        w->phase = WPHASE_FAILED;
        return AKV_EIO;
    }
    return AKV_OK;
}

static akv_status put_zeros(akv_gguf_writer *w, uint64_t n) {
    akv_status st = AKV_OK;
    while (n && !st) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        st = put(w, zeros, k);
        n -= k;
    }
    return st;
}

/* Moves past completed (and empty) tensors, padding each to the alignment. */
static akv_status advance(akv_gguf_writer *w) {
    akv_status st = AKV_OK;
    while (!st && w->cur < w->n_tensors && w->cur_done == w->tensors[w->cur].n_bytes) {
        uint64_t n = w->tensors[w->cur].n_bytes;
        st = put_zeros(w, (w->alignment - n % w->alignment) % w->alignment);
        w->cur++;
        w->cur_done = 0;
    }
    return st;
}

static akv_status begin_data(akv_gguf_writer *w) {
    /* the file's size is known now: refuse at once what the file system cannot hold (a
     * tensor of 2^40 bytes would otherwise write until the disk is full) */
    const uint64_t total = meta_bytes(w) + w->data_bytes;
    struct statvfs fs;
    if (fstatvfs(fileno(w->f), &fs) == 0 && (uint64_t)fs.f_bavail * fs.f_frsize < total) {
        AKV_LOG_E("gguf writer: '%s' would be %.2f GiB; its file system has %.2f GiB free",
                  w->path, (double)total / (1 << 30), (double)fs.f_bavail * fs.f_frsize / (1 << 30));
        w->phase = WPHASE_FAILED;
        return AKV_EIO;
    }
    uint8_t h[24];
    memcpy(h, AKV_GGUF_MAGIC, 4);
    akv__gguf_st32(h + 4, 3);
    akv__gguf_st64(h + 8, w->n_tensors);
    akv__gguf_st64(h + 16, w->n_kv);
    w->phase = WPHASE_DATA;
    akv_status st = put(w, h, sizeof h);
    if (!st) st = put(w, w->kvs.p, w->kvs.n);
    if (!st) st = put(w, w->infos.p, w->infos.n);
    if (!st) st = put_zeros(w, meta_bytes(w) - (24 + (uint64_t)w->kvs.n + w->infos.n));
    return st ? st : advance(w);
}

akv_status akv_gguf_writer_write(akv_gguf_writer *w, const void *bytes, size_t n) {
    if (!w || (!bytes && n)) return AKV_EINVAL;
    if (w->phase == WPHASE_FAILED) return AKV_EIO;
    if (w->phase == WPHASE_DONE) return AKV_ESTATE;
    akv_status st = w->phase == WPHASE_META ? begin_data(w) : AKV_OK;
    const uint8_t *p = bytes;
    while (!st && n) {
        if (w->cur == w->n_tensors) {
            AKV_LOG_E("gguf writer: %zu bytes beyond the declared tensor data", n);
            return AKV_ESTATE;
        }
        uint64_t left = w->tensors[w->cur].n_bytes - w->cur_done;
        size_t k = n < left ? n : (size_t)left;
        st = put(w, p, k);
        w->cur_done += k;
        p += k;
        n -= k;
        if (!st) st = advance(w);
    }
    return st;
}

akv_status akv_gguf_writer_finish(akv_gguf_writer *w) {
    if (!w) return AKV_EINVAL;
    akv_status st = akv_gguf_writer_write(w, NULL, 0);
    if (st) return st;
    if (w->cur < w->n_tensors) {
        AKV_LOG_E("gguf writer: tensor '%s' got %llu of its %llu bytes", w->tensors[w->cur].name,
                  (unsigned long long)w->cur_done, (unsigned long long)w->tensors[w->cur].n_bytes);
        return AKV_ESTATE;
    }
    int rc = fclose(w->f);
    w->f = NULL;
    if (rc != 0 || rename(w->partial_path, w->path) != 0) {
        AKV_LOG_E("gguf writer: completing '%s' failed: %s", w->path, strerror(errno));
        remove(w->partial_path);
        w->phase = WPHASE_FAILED;
        return AKV_EIO;
    }
    w->phase = WPHASE_DONE;
    return AKV_OK;
}
