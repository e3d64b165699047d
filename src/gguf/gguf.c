/*
 * gguf.c — the GGUF reader: map, validate everything once, then answer lookups from an
 * immutable index (akv/gguf.h has the format and the invariants).
 *
 * Parsing is one forward pass over the image with a bounds-checked cursor. Nothing is
 * allocated from a count before that count is bounded by the bytes left: n_kv and
 * n_tensors by the smallest encoding of one item, a string array by 8 bytes per element.
 * Keys and names are copied into one NUL-terminated arena at the end of the pass (its size
 * is the sum of lengths actually read). The index is then hashed for O(1) lookups, and
 * duplicates found there are refused. The getters are in gguf_get.c.
 */
#define _POSIX_C_SOURCE 200809L
#include "gguf/gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"

/* Smallest encodings, used to bound counts before allocating: a kv is a key length (8), a
 * key byte, a value type (4) and a u8 value (1); a tensor info is a name length (8), a
 * name byte, n_dims (4), one extent (8), a type (4) and an offset (8). */
enum { GGUF_MIN_KV_BYTES = 14, GGUF_MIN_TENSOR_BYTES = 33, GGUF_HEADER_BYTES = 24 };

/* ---- types -------------------------------------------------------------------------------- */

typedef struct gguf_type_info {
    const char *name;
    uint16_t block_elems;
    uint16_t block_bytes;
} gguf_type_info;

/* Block sizes from ggml-common.h's block structs (e.g. block_q4_K: d, dmin, 12 scale
 * bytes, 128 quant bytes = 144 bytes for 256 elements). */
static const gguf_type_info gguf_types[AKV_GGUF_TYPE_COUNT] = {
    [AKV_GGUF_TYPE_F32] = {"f32", 1, 4},          [AKV_GGUF_TYPE_F16] = {"f16", 1, 2},
    [AKV_GGUF_TYPE_Q4_0] = {"q4_0", 32, 18},      [AKV_GGUF_TYPE_Q4_1] = {"q4_1", 32, 20},
    [AKV_GGUF_TYPE_Q5_0] = {"q5_0", 32, 22},      [AKV_GGUF_TYPE_Q5_1] = {"q5_1", 32, 24},
    [AKV_GGUF_TYPE_Q8_0] = {"q8_0", 32, 34},      [AKV_GGUF_TYPE_Q8_1] = {"q8_1", 32, 36},
    [AKV_GGUF_TYPE_Q2_K] = {"q2_K", 256, 84},     [AKV_GGUF_TYPE_Q3_K] = {"q3_K", 256, 110},
    [AKV_GGUF_TYPE_Q4_K] = {"q4_K", 256, 144},    [AKV_GGUF_TYPE_Q5_K] = {"q5_K", 256, 176},
    [AKV_GGUF_TYPE_Q6_K] = {"q6_K", 256, 210},    [AKV_GGUF_TYPE_Q8_K] = {"q8_K", 256, 292},
    [AKV_GGUF_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66}, [AKV_GGUF_TYPE_IQ2_XS] = {"iq2_xs", 256, 74},
    [AKV_GGUF_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98}, [AKV_GGUF_TYPE_IQ1_S] = {"iq1_s", 256, 50},
    [AKV_GGUF_TYPE_IQ4_NL] = {"iq4_nl", 32, 18},  [AKV_GGUF_TYPE_IQ3_S] = {"iq3_s", 256, 110},
    [AKV_GGUF_TYPE_IQ2_S] = {"iq2_s", 256, 82},   [AKV_GGUF_TYPE_IQ4_XS] = {"iq4_xs", 256, 136},
    [AKV_GGUF_TYPE_I8] = {"i8", 1, 1},            [AKV_GGUF_TYPE_I16] = {"i16", 1, 2},
    [AKV_GGUF_TYPE_I32] = {"i32", 1, 4},          [AKV_GGUF_TYPE_I64] = {"i64", 1, 8},
    [AKV_GGUF_TYPE_F64] = {"f64", 1, 8},          [AKV_GGUF_TYPE_IQ1_M] = {"iq1_m", 256, 56},
    [AKV_GGUF_TYPE_BF16] = {"bf16", 1, 2},        [AKV_GGUF_TYPE_TQ1_0] = {"tq1_0", 256, 54},
    [AKV_GGUF_TYPE_TQ2_0] = {"tq2_0", 256, 66},   [AKV_GGUF_TYPE_MXFP4] = {"mxfp4", 32, 17},
};

const char *akv_gguf_type_name(uint32_t type) {
    return type < AKV_GGUF_TYPE_COUNT ? gguf_types[type].name : NULL;
}

size_t akv_gguf_type_block_elems(uint32_t type) {
    return type < AKV_GGUF_TYPE_COUNT ? gguf_types[type].block_elems : 0;
}

size_t akv_gguf_type_block_bytes(uint32_t type) {
    return type < AKV_GGUF_TYPE_COUNT ? gguf_types[type].block_bytes : 0;
}

akv_status akv_gguf_type_from_name(const char *name, akv_gguf_type *out) {
    if (!name || !out) return AKV_EINVAL;
    for (uint32_t t = 0; t < AKV_GGUF_TYPE_COUNT; t++) {
        if (gguf_types[t].name && !strcasecmp(name, gguf_types[t].name)) {
            *out = (akv_gguf_type)t;
            return AKV_OK;
        }
    }
    return AKV_ENOTFOUND;
}

akv_status akv_gguf_type_bytes(uint32_t type, uint64_t n_elems, size_t *out) {
    size_t blk = akv_gguf_type_block_elems(type);
    if (!out || blk == 0 || n_elems % blk != 0) return AKV_EINVAL;
    size_t n_bytes;
    if (n_elems / blk > SIZE_MAX ||
        !akv__size_mul((size_t)(n_elems / blk), akv_gguf_type_block_bytes(type), &n_bytes))
        return AKV_EOVERFLOW;
    *out = n_bytes;
    return AKV_OK;
}

static const char *const gguf_vtype_names[AKV_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *akv_gguf_vtype_name(uint32_t vtype) {
    return vtype < AKV_GGUF_VTYPE_COUNT ? gguf_vtype_names[vtype] : "?";
}

size_t akv__gguf_vtype_size(uint32_t vtype) {
    static const uint8_t sizes[AKV_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return vtype < AKV_GGUF_VTYPE_COUNT ? sizes[vtype] : 0;
}

/* ---- the cursor ------------------------------------------------------------------------------ */

typedef struct gguf_rd {
    const uint8_t *p;
    uint64_t n;       /* bytes of the file held at p: all of it, or a prefix (akv_gguf_open) */
    uint64_t file_n;  /* bytes of the file */
    bool more;        /* a read ran past a prefix: the caller reads more and parses again */
    uint64_t pos;     /* next byte to read */
    const char *src;  /* the file's path, or "(memory)", for messages */
    char what[112];   /* the item being read, for messages: "kv 3 'general.name'" */
} gguf_rd;

/* Logs "gguf: <item>: <field> at offset <at>: <reason>" and returns `status`. */
AKV_PRINTF(5, 6)
static akv_status rd_fail(const gguf_rd *r, akv_status status, uint64_t at, const char *field,
                          const char *fmt, ...) {
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    AKV_LOG_E("gguf: %s: %s: %s at offset %llu: %s", r->src, r->what, field,
              (unsigned long long)at, reason);
    return status;
}

static uint64_t rd_left(const gguf_rd *r) {
    return r->n - r->pos;
}

/* What a read past the bytes held means: with only a prefix held, that the caller must read
 * more (quietly: r->more); with the whole file, that the file is truncated (`fmt` says how). */
#define RD_PAST_END(r, at, field, ...)                                                         \
    ((r)->n < (r)->file_n ? ((r)->more = true, AKV_EFORMAT)                                    \
                          : rd_fail((r), AKV_EFORMAT, (at), (field), __VA_ARGS__))

static akv_status rd_need(gguf_rd *r, uint64_t n_bytes, const char *field) {
    if (n_bytes <= rd_left(r)) return AKV_OK;
    return RD_PAST_END(r, r->pos, field,
                   "truncated: needs %llu bytes, %llu left in the %llu-byte file",
                   (unsigned long long)n_bytes, (unsigned long long)rd_left(r),
                   (unsigned long long)r->n);
}

static akv_status rd_u32(gguf_rd *r, const char *field, uint32_t *out) {
    akv_status st = rd_need(r, 4, field);
    if (st) return st;
    *out = akv__gguf_ld32(r->p + r->pos);
    r->pos += 4;
    return AKV_OK;
}

static akv_status rd_u64(gguf_rd *r, const char *field, uint64_t *out) {
    akv_status st = rd_need(r, 8, field);
    if (st) return st;
    *out = akv__gguf_ld64(r->p + r->pos);
    r->pos += 8;
    return AKV_OK;
}

/* A string of at most max_len bytes: its bytes' offset and length. */
static akv_status rd_str(gguf_rd *r, const char *field, uint64_t max_len, uint64_t *out_pos,
                         uint64_t *out_len) {
    uint64_t at = r->pos, len;
    akv_status st = rd_u64(r, field, &len);
    if (st) return st;
    if (len > max_len)
        return rd_fail(r, AKV_EFORMAT, at, field, "length %llu exceeds the limit of %llu",
                       (unsigned long long)len, (unsigned long long)max_len);
    if (len > rd_left(r))
        return RD_PAST_END(r, at, field,
                       "length %llu runs past the end (%llu bytes left)", (unsigned long long)len,
                       (unsigned long long)rd_left(r));
    *out_pos = r->pos;
    *out_len = len;
    r->pos += len;
    return AKV_OK;
}

/* ---- parsing -------------------------------------------------------------------------------- */

static akv_status parse_header(akv_gguf *g, gguf_rd *r, uint64_t *n_kv, uint64_t *n_tensors) {
    snprintf(r->what, sizeof r->what, "header");
    akv_status st = rd_need(r, GGUF_HEADER_BYTES, "header");
    if (st) return st;
    if (memcmp(r->p, AKV_GGUF_MAGIC, 4) != 0)
        return rd_fail(r, AKV_EFORMAT, 0, "magic",
                       "bytes %02x %02x %02x %02x are not \"GGUF\" (not a GGUF file)", r->p[0],
                       r->p[1], r->p[2], r->p[3]);
    r->pos = 4;
    uint32_t version;
    rd_u32(r, "version", &version);
    if (version != 2 && version != 3) {
        const char *hint = version == 1 ? " (version 1 is obsolete)"
                           : (version & 0xffff) == 0 ? " (a big-endian file?)" : "";
        return rd_fail(r, AKV_EFORMAT, 4, "version", "%u is not supported (2 and 3 are)%s",
                       version, hint);
    }
    g->version = version;
    rd_u64(r, "tensor count", n_tensors);
    rd_u64(r, "kv count", n_kv);
    uint64_t left = r->file_n - r->pos; /* the file's, not a prefix's: a bound, not a read */
    if (*n_kv > left / GGUF_MIN_KV_BYTES)
        return rd_fail(r, AKV_EFORMAT, 16, "kv count",
                       "%llu pairs cannot fit in the %llu bytes left (each needs >= %d)",
                       (unsigned long long)*n_kv, (unsigned long long)left, GGUF_MIN_KV_BYTES);
    if (*n_tensors > left / GGUF_MIN_TENSOR_BYTES)
        return rd_fail(r, AKV_EFORMAT, 8, "tensor count",
                       "%llu tensors cannot fit in the %llu bytes left (each needs >= %d)",
                       (unsigned long long)*n_tensors, (unsigned long long)left,
                       GGUF_MIN_TENSOR_BYTES);
    return AKV_OK;
}

static akv_status check_bools(const gguf_rd *r, uint64_t pos, uint64_t n, const char *field) {
    for (uint64_t i = 0; i < n; i++)
        if (r->p[pos + i] > 1)
            return rd_fail(r, AKV_EFORMAT, pos + i, field, "bool byte is %u (0 or 1 allowed)",
                           r->p[pos + i]);
    return AKV_OK;
}

/* The value of kv `kv` (its type already read), cursor after it. */
static akv_status parse_value(akv_gguf *g, gguf_rd *r, gguf_kv *kv) {
    akv_status st;
    if (kv->type == AKV_GGUF_VTYPE_STRING) {
        kv->n = 0;
        return rd_str(r, "string value", UINT64_MAX, &kv->data_pos, &kv->n);
    }
    if (kv->type != AKV_GGUF_VTYPE_ARRAY) {
        size_t size = akv__gguf_vtype_size(kv->type);
        if ((st = rd_need(r, size, "value"))) return st;
        if (kv->type == AKV_GGUF_VTYPE_BOOL && (st = check_bools(r, r->pos, 1, "value")))
            return st;
        kv->data_pos = r->pos;
        kv->n = 1;
        r->pos += size;
        return AKV_OK;
    }
    uint64_t at = r->pos;
    uint32_t elem;
    if ((st = rd_u32(r, "array element type", &elem))) return st;
    if (elem >= AKV_GGUF_VTYPE_COUNT)
        return rd_fail(r, AKV_EFORMAT, at, "array element type", "%u is not a value type", elem);
    if (elem == AKV_GGUF_VTYPE_ARRAY)
        return rd_fail(r, AKV_EUNSUPPORTED, at, "array element type",
                       "nested arrays are not supported");
    kv->elem = (akv_gguf_vtype)elem;
    at = r->pos;
    if ((st = rd_u64(r, "array length", &kv->n))) return st;
    kv->data_pos = r->pos;
    if (elem != AKV_GGUF_VTYPE_STRING) {
        size_t size = akv__gguf_vtype_size(elem);
        if (kv->n > rd_left(r) / size)
            return RD_PAST_END(r, at, "array length",
                           "%llu elements of %zu bytes run past the end (%llu bytes left)",
                           (unsigned long long)kv->n, size, (unsigned long long)rd_left(r));
        if (elem == AKV_GGUF_VTYPE_BOOL && (st = check_bools(r, r->pos, kv->n, "array element")))
            return st;
        r->pos += kv->n * size;
        return AKV_OK;
    }
    /* Strings: every element is at least its 8-byte length, which bounds the table. */
    if (kv->n > rd_left(r) / 8)
        return RD_PAST_END(r, at, "array length",
                       "%llu strings cannot fit in the %llu bytes left",
                       (unsigned long long)kv->n, (unsigned long long)rd_left(r));
    if (akv__array_reserve((void **)&g->str_pos, &g->cap_str, g->n_str + (size_t)kv->n,
                           sizeof *g->str_pos) != AKV_OK)
        return AKV_ENOMEM;
    kv->first_str = g->n_str;
    for (uint64_t i = 0; i < kv->n; i++) {
        uint64_t pos, len;
        g->str_pos[g->n_str + i] = r->pos;
        if ((st = rd_str(r, "array string element", UINT64_MAX, &pos, &len))) return st;
    }
    g->n_str += (size_t)kv->n;
    return AKV_OK;
}

static akv_status parse_kv(akv_gguf *g, gguf_rd *r, size_t idx) {
    gguf_kv *kv = &g->kvs[idx];
    snprintf(r->what, sizeof r->what, "kv %zu", idx);
    kv->pos = r->pos;
    uint64_t key_pos, key_len;
    akv_status st = rd_str(r, "key", AKV_GGUF_MAX_KEY, &key_pos, &key_len);
    if (st) return st;
    if (key_len == 0) return rd_fail(r, AKV_EFORMAT, kv->pos, "key", "empty key");
    for (uint64_t i = 0; i < key_len; i++) {
        uint8_t c = r->p[key_pos + i];
        if (c < 0x20 || c > 0x7e)
            return rd_fail(r, AKV_EFORMAT, key_pos + i, "key",
                           "byte 0x%02x is not printable ASCII", c);
    }
    kv->key_pos = key_pos;
    kv->key_len = (uint32_t)key_len;
    snprintf(r->what, sizeof r->what, "kv %zu '%.*s'", idx, (int)(key_len > 64 ? 64 : key_len),
             (const char *)r->p + key_pos);
    uint64_t at = r->pos;
    uint32_t type;
    if ((st = rd_u32(r, "value type", &type))) return st;
    if (type >= AKV_GGUF_VTYPE_COUNT)
        return rd_fail(r, AKV_EFORMAT, at, "value type", "%u is not a value type", type);
    kv->type = (akv_gguf_vtype)type;
    if ((st = parse_value(g, r, kv))) return st;
    kv->end = r->pos;
    /* general.alignment decides where the tensor data starts: a u32 power of two. */
    if (key_len == 17 && !memcmp(r->p + key_pos, "general.alignment", 17)) {
        uint32_t a = type == AKV_GGUF_VTYPE_U32 ? akv__gguf_ld32(r->p + kv->data_pos) : 0;
        if (type != AKV_GGUF_VTYPE_U32 || a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
            return rd_fail(r, AKV_EFORMAT, at, "value",
                           "must be a u32 power of two <= 2^30 (is %s %u)",
                           akv_gguf_vtype_name(type), a);
        g->alignment = a;
    }
    return AKV_OK;
}

static akv_status parse_tensor_info(akv_gguf *g, gguf_rd *r, size_t idx) {
    gguf_tensor *t = &g->tensors[idx];
    akv_gguf_tensor *pt = &t->pub;
    snprintf(r->what, sizeof r->what, "tensor %zu", idx);
    t->pos = r->pos;
    uint64_t name_pos, name_len;
    akv_status st = rd_str(r, "name", AKV_GGUF_MAX_NAME, &name_pos, &name_len);
    if (st) return st;
    if (name_len == 0) return rd_fail(r, AKV_EFORMAT, t->pos, "name", "empty name");
    if (memchr(r->p + name_pos, 0, name_len))
        return rd_fail(r, AKV_EFORMAT, name_pos, "name", "contains a NUL byte");
    t->name_pos = name_pos;
    t->name_len = (uint32_t)name_len;
    snprintf(r->what, sizeof r->what, "tensor %zu '%.*s'", idx, (int)name_len,
             (const char *)r->p + name_pos);
    uint64_t at = r->pos;
    if ((st = rd_u32(r, "n_dims", &pt->n_dims))) return st;
    if (pt->n_dims < 1 || pt->n_dims > AKV_GGUF_MAX_DIMS)
        return rd_fail(r, AKV_EFORMAT, at, "n_dims", "%u is not in 1..%d", pt->n_dims,
                       AKV_GGUF_MAX_DIMS);
    /* Element counts stay within int64 (ggml's int64 extents). */
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < AKV_GGUF_MAX_DIMS; d++) pt->ne[d] = 1;
    for (uint32_t d = 0; d < pt->n_dims; d++) {
        at = r->pos;
        if ((st = rd_u64(r, "extent", &pt->ne[d]))) return st;
        if (pt->ne[d] > (uint64_t)INT64_MAX)
            return rd_fail(r, AKV_EFORMAT, at, "extent", "ne[%u] = %llu exceeds INT64_MAX", d,
                           (unsigned long long)pt->ne[d]);
        if (__builtin_mul_overflow(n_elems, pt->ne[d], &n_elems) || n_elems > (uint64_t)INT64_MAX)
            return rd_fail(r, AKV_EFORMAT, at, "extent",
                           "the product of the extents up to ne[%u] overflows int64", d);
    }
    pt->n_elems = n_elems;
    at = r->pos;
    uint32_t type;
    if ((st = rd_u32(r, "type", &type))) return st;
    size_t blk = akv_gguf_type_block_elems(type);
    if (blk == 0) return rd_fail(r, AKV_EFORMAT, at, "type", "%u is not a known ggml type", type);
    pt->type = (akv_gguf_type)type;
    if (pt->ne[0] % blk != 0)
        return rd_fail(r, AKV_EFORMAT, at, "type",
                       "ne[0] = %llu is not a multiple of the %s block size %zu",
                       (unsigned long long)pt->ne[0], akv_gguf_type_name(type), blk);
    if (__builtin_mul_overflow(n_elems / blk, (uint64_t)akv_gguf_type_block_bytes(type),
                               &pt->n_bytes) ||
        pt->n_bytes > (uint64_t)INT64_MAX)
        return rd_fail(r, AKV_EFORMAT, at, "type", "the byte size overflows int64");
    at = t->offset_pos = r->pos;
    if ((st = rd_u64(r, "offset", &pt->offset))) return st;
    if (pt->offset % g->alignment != 0)
        return rd_fail(r, AKV_EFORMAT, at, "offset", "%llu is not a multiple of the alignment %zu",
                       (unsigned long long)pt->offset, g->alignment);
    return AKV_OK;
}

static int cmp_by_offset(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->pub.offset < y->pub.offset ? -1 : x->pub.offset > y->pub.offset;
}

/* Places the data section and checks every tensor's byte range: inside the file, and
 * overlapping no other tensor (sorted by offset, each must end before the next begins). */
static akv_status place_tensors(akv_gguf *g, gguf_rd *r) {
    snprintf(r->what, sizeof r->what, "tensor data");
    uint64_t pad = (g->alignment - r->pos % g->alignment) % g->alignment;
    g->data_offset = r->pos + pad;
    if (g->n_tensors == 0) return AKV_OK;
    if (pad > r->file_n - r->pos)
        return rd_fail(r, AKV_EFORMAT, r->pos, "padding",
                       "the data section would start at %llu, past the end of the %llu-byte file",
                       (unsigned long long)g->data_offset, (unsigned long long)r->file_n);
    uint64_t data_bytes = r->file_n - g->data_offset;
    for (size_t i = 0; i < g->n_tensors; i++) {
        akv_gguf_tensor *t = &g->tensors[i].pub;
        snprintf(r->what, sizeof r->what, "tensor %zu '%.*s'", i, (int)g->tensors[i].name_len,
                 (const char *)r->p + g->tensors[i].name_pos);
        if (t->offset > data_bytes || t->n_bytes > data_bytes - t->offset)
            return rd_fail(r, AKV_EFORMAT, g->tensors[i].offset_pos, "offset",
                           "data [%llu, +%llu) runs past the %llu bytes of tensor data",
                           (unsigned long long)t->offset, (unsigned long long)t->n_bytes,
                           (unsigned long long)data_bytes);
        t->offset += g->data_offset;
        t->data = g->base ? g->base + t->offset : NULL; /* a file's: set once it is mapped */
    }
    gguf_tensor **order = akv__calloc(g->n_tensors, sizeof *order);
    if (!order) return AKV_ENOMEM;
    for (size_t i = 0; i < g->n_tensors; i++) order[i] = &g->tensors[i];
    qsort(order, g->n_tensors, sizeof *order, cmp_by_offset);
    akv_status st = AKV_OK;
    const gguf_tensor *prev = NULL;
    for (size_t i = 0; i < g->n_tensors && !st; i++) {
        const gguf_tensor *t = order[i];
        if (t->pub.n_bytes == 0) continue;
        if (prev && prev->pub.offset + prev->pub.n_bytes > t->pub.offset) {
            snprintf(r->what, sizeof r->what, "tensor %zu '%.*s'", (size_t)(t - g->tensors),
                     (int)t->name_len, (const char *)r->p + t->name_pos);
            st = rd_fail(r, AKV_EFORMAT, t->offset_pos, "offset",
                         "data [%llu, %llu) overlaps tensor %zu '%.*s' at [%llu, %llu)",
                         (unsigned long long)t->pub.offset,
                         (unsigned long long)(t->pub.offset + t->pub.n_bytes),
                         (size_t)(prev - g->tensors), (int)prev->name_len,
                         (const char *)r->p + prev->name_pos, (unsigned long long)prev->pub.offset,
                         (unsigned long long)(prev->pub.offset + prev->pub.n_bytes));
        }
        prev = t;
    }
    akv__free(order);
    return st;
}

/* Copies keys and tensor names into one NUL-terminated arena. */
static akv_status build_names(akv_gguf *g) {
    size_t total = 1;
    for (size_t i = 0; i < g->n_kv; i++) total += g->kvs[i].key_len + 1;
    for (size_t i = 0; i < g->n_tensors; i++) total += g->tensors[i].name_len + 1;
    g->names = akv__malloc(total);
    if (!g->names) return AKV_ENOMEM;
    char *p = g->names;
    for (size_t i = 0; i < g->n_kv; i++) {
        memcpy(p, g->meta + g->kvs[i].key_pos, g->kvs[i].key_len);
        g->kvs[i].key = p;
        p += g->kvs[i].key_len;
        *p++ = '\0';
    }
    for (size_t i = 0; i < g->n_tensors; i++) {
        memcpy(p, g->meta + g->tensors[i].name_pos, g->tensors[i].name_len);
        g->tensors[i].pub.name = p;
        p += g->tensors[i].name_len;
        *p++ = '\0';
    }
    return AKV_OK;
}

/* ---- hashing (FNV-1a, open addressing, linear probing) ----------------------------------- */

static uint64_t hash_str(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static const char *item_name(const akv_gguf *g, bool tensors, size_t idx) {
    return tensors ? g->tensors[idx].pub.name : g->kvs[idx].key;
}

size_t akv__gguf_slot(const akv_gguf *g, bool tensors, const char *name) {
    const size_t *slots = tensors ? g->t_slots : g->kv_slots;
    size_t mask = (tensors ? g->cap_t_slots : g->cap_kv_slots) - 1;
    size_t s = (size_t)hash_str(name) & mask;
    while (slots[s] && strcmp(item_name(g, tensors, slots[s] - 1), name) != 0) s = (s + 1) & mask;
    return s;
}

/* Builds the table of keys or of tensor names; AKV_EFORMAT (logged) on a duplicate. */
static akv_status hash_build(akv_gguf *g, bool tensors, const char *src) {
    size_t n = tensors ? g->n_tensors : g->n_kv, cap = 8;
    while (cap < 2 * n) cap *= 2;
    size_t *slots = akv__calloc(cap, sizeof *slots);
    if (!slots) return AKV_ENOMEM;
    if (tensors) g->t_slots = slots, g->cap_t_slots = cap;
    else g->kv_slots = slots, g->cap_kv_slots = cap;
    const char *what = tensors ? "tensor" : "key";
    for (size_t i = 0; i < n; i++) {
        size_t s = akv__gguf_slot(g, tensors, item_name(g, tensors, i));
        if (slots[s]) {
            uint64_t at = tensors ? g->tensors[i].name_pos : g->kvs[i].key_pos;
            AKV_LOG_E("gguf: %s: %s %zu '%s': name at offset %llu duplicates %s %zu", src, what,
                      i, item_name(g, tensors, i), (unsigned long long)at, what, slots[s] - 1);
            return AKV_EFORMAT;
        }
        slots[s] = i + 1;
    }
    return AKV_OK;
}

/* ---- open / close ---------------------------------------------------------------------------- */

static akv_status gguf_parse_rd(akv_gguf *g, gguf_rd *r, const char *src) {
    uint64_t n_kv, n_tensors;
    akv_status st = parse_header(g, r, &n_kv, &n_tensors);
    if (st) return st;
    g->alignment = AKV_GGUF_DEFAULT_ALIGNMENT;
    /* Both counts are bounded by the file size (parse_header), so these are too. */
    if (n_kv && !(g->kvs = akv__calloc((size_t)n_kv, sizeof *g->kvs))) return AKV_ENOMEM;
    g->n_kv = (size_t)n_kv;
    for (size_t i = 0; i < g->n_kv; i++)
        if ((st = parse_kv(g, r, i))) return st;
    if (n_tensors && !(g->tensors = akv__calloc((size_t)n_tensors, sizeof *g->tensors)))
        return AKV_ENOMEM;
    g->n_tensors = (size_t)n_tensors;
    for (size_t i = 0; i < g->n_tensors; i++)
        if ((st = parse_tensor_info(g, r, i))) return st;
    if ((st = place_tensors(g, r))) return st;
    if ((st = build_names(g))) return st;
    if ((st = hash_build(g, false, src))) return st;
    return hash_build(g, true, src);
}

/* Parses the metadata held at g->meta (g->n_meta bytes of the g->n_bytes-byte file). *more:
 * the metadata runs past what is held (nothing logged; read more and parse again). */
static akv_status gguf_parse(akv_gguf *g, const char *src, bool *more) {
    gguf_rd r = {.p = g->meta, .n = g->n_meta, .file_n = g->n_bytes, .pos = 0, .src = src};
    akv_status st = gguf_parse_rd(g, &r, src);
    *more = st && r.more;
    return st;
}

/* A new index over a metadata image (meta, n_meta bytes of an n_bytes-byte file) and the
 * tensor image `base` (NULL until mapped: tensor data pointers are set by gguf_set_data). */
static akv_status gguf_new(const uint8_t *meta, uint64_t n_meta, uint64_t n_bytes,
                           const uint8_t *base, const char *src, bool *more, akv_gguf **out) {
    *more = false;
    akv_gguf *g = akv__calloc(1, sizeof *g);
    if (!g) return AKV_ENOMEM;
    g->meta = meta, g->n_meta = n_meta, g->n_bytes = n_bytes, g->base = base, g->fd = -1;
    akv_status st = gguf_parse(g, src, more);
    if (st) {
        g->meta_owned = false; /* the caller's on failure */
        akv_gguf_close(g);
        return st;
    }
    *out = g;
    return AKV_OK;
}

akv_status akv_gguf_open_memory(const void *data, size_t n_bytes, akv_gguf **out) {
    if ((!data && n_bytes) || !out) return AKV_EINVAL;
    bool more;
    return gguf_new(data, n_bytes, n_bytes, data, "(memory)", &more, out);
}

/* Reads n bytes at file offset `at` into dst; AKV_EIO (logged) on an error or an early end
 * of the file (*short_read then true). */
static akv_status gguf_pread(int fd, const char *path, void *dst, uint64_t n, uint64_t at,
                             const char *what, bool *short_read) {
    uint8_t *p = dst;
    *short_read = false;
    while (n) {
        ssize_t k = pread(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n, (off_t)at);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            AKV_LOG_E("gguf: %s: cannot read %s at offset %llu: %s", path, what,
                      (unsigned long long)at, strerror(errno));
            return AKV_EIO;
        }
        if (k == 0) {
            struct stat sb;
            long long now = fstat(fd, &sb) == 0 ? (long long)sb.st_size : -1;
            AKV_LOG_E("gguf: %s: the file ends at %lld bytes, before %s at offset %llu (+%llu "
                      "bytes): it changed after it was opened",
                      path, now, what, (unsigned long long)at, (unsigned long long)n);
            *short_read = true;
            return AKV_EIO;
        }
        p += k, at += (uint64_t)k, n -= (uint64_t)k;
    }
    return AKV_OK;
}

uint64_t akv__gguf_meta_first_read = 1u << 20;

akv_status akv_gguf_open(const char *path, akv_gguf **out) {
    if (!path || !out) return AKV_EINVAL;
    /* O_NONBLOCK: a FIFO without a writer would block the open itself; it is refused below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        AKV_LOG_E("gguf: cannot open '%s': %s", path, strerror(errno));
        return AKV_EIO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        AKV_LOG_E("gguf: '%s' is not a regular file", path);
        close(fd);
        return AKV_EIO;
    }
    if (sb.st_size < GGUF_HEADER_BYTES) {
        AKV_LOG_E("gguf: %s: header: header at offset 0: truncated: the file has %lld bytes, a "
                  "GGUF header needs %d", path, (long long)sb.st_size, GGUF_HEADER_BYTES);
        close(fd);
        return AKV_EFORMAT;
    }
    const uint64_t size = (uint64_t)sb.st_size;
    size_t path_len = strlen(path);
    char *path_copy = akv__malloc(path_len + 1);
    if (!path_copy) {
        close(fd);
        return AKV_ENOMEM;
    }
    memcpy(path_copy, path, path_len + 1);
    /* The metadata is read into memory (a prefix, grown until the parse holds all of it), so
     * no metadata access can fault if the file changes later; only tensor data is mapped. */
    akv_gguf *g = NULL;
    akv_status st;
    bool more = true;
    uint64_t first = akv__gguf_meta_first_read ? akv__gguf_meta_first_read : 1;
    for (uint64_t n = size < first ? size : first; more;
         n = n > size / 4 ? size : n * 4) {
        uint8_t *meta = akv__malloc((size_t)n);
        if (!meta) {
            st = AKV_ENOMEM;
            break;
        }
        bool short_read;
        st = gguf_pread(fd, path, meta, n, 0, "the metadata", &short_read);
        if (!st) st = gguf_new(meta, n, size, NULL, path, &more, &g);
        else more = false;
        if (st) akv__free(meta);
        else g->meta_owned = true;
    }
    if (st) {
        akv__free(path_copy);
        close(fd);
        return st;
    }
    g->fd = fd, g->path = path_copy;
    void *base = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) {
        AKV_LOG_E("gguf: cannot map '%s' (%llu bytes): %s", path, (unsigned long long)size,
                  strerror(errno));
        akv_gguf_close(g);
        return AKV_EIO;
    }
    g->base = base, g->mapped = true;
    for (size_t i = 0; i < g->n_tensors; i++)
        g->tensors[i].pub.data = g->base + g->tensors[i].pub.offset;
    *out = g;
    return AKV_OK;
}

akv_status akv_gguf_tensor_read(const akv_gguf *g, const akv_gguf_tensor *t, uint64_t off,
                                void *dst, size_t n) {
    if (!g || !t || (!dst && n) || off > t->n_bytes || n > t->n_bytes - off) return AKV_EINVAL;
    if (g->fd < 0) {
        if (n) memcpy(dst, t->data + off, n);
        return AKV_OK;
    }
    char what[AKV_GGUF_MAX_NAME + 32];
    snprintf(what, sizeof what, "tensor '%s'", t->name);
    bool short_read;
    return gguf_pread(g->fd, g->path, dst, n, t->offset + off, what, &short_read);
}

void akv_gguf_close(akv_gguf *g) {
    if (!g) return;
    if (g->mapped) munmap((void *)g->base, (size_t)g->n_bytes);
    if (g->meta_owned) akv__free((void *)g->meta);
    if (g->fd >= 0) close(g->fd);
    akv__free(g->path);
    akv__free(g->kvs);
    akv__free(g->tensors);
    akv__free(g->str_pos);
    akv__free(g->names);
    akv__free(g->kv_slots);
    akv__free(g->t_slots);
    akv__free(g);
}

