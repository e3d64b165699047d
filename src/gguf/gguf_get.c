/*
 * gguf_get.c — lookups in an open GGUF file: file facts, metadata by key or index, typed
 * getters, array elements, tensors by name or index, and the validity walker. Everything
 * here reads the immutable index built by gguf.c; nothing allocates or logs except a
 * typed getter refusing a value of the wrong type.
 */
#include "gguf/gguf_impl.h"

#include <string.h>

#include "core/log.h"

uint32_t akv_gguf_version(const akv_gguf *g) {
    return g->version;
}
size_t akv_gguf_alignment(const akv_gguf *g) {
    return g->alignment;
}
uint64_t akv_gguf_data_offset(const akv_gguf *g) {
    return g->data_offset;
}
uint64_t akv_gguf_file_bytes(const akv_gguf *g) {
    return g->n_bytes;
}
const uint8_t *akv_gguf_bytes(const akv_gguf *g) {
    return g->base;
}

/* ---- metadata getters ------------------------------------------------------------------------ */

size_t akv_gguf_n_kv(const akv_gguf *g) {
    return g->n_kv;
}

const char *akv_gguf_kv_key(const akv_gguf *g, size_t idx) {
    AKV_ASSERT(idx < g->n_kv);
    return g->kvs[idx].key;
}

/* A scalar of a fixed-size type at p, into the member its type selects. */
static void load_scalar(akv_gguf_vtype type, const uint8_t *p, akv_gguf_value *v) {
    v->type = type;
    switch (type) {
    case AKV_GGUF_VTYPE_U8: v->as.u = p[0]; break;
    case AKV_GGUF_VTYPE_I8: v->as.i = (int8_t)p[0]; break;
    case AKV_GGUF_VTYPE_U16: v->as.u = akv__gguf_ld16(p); break;
    case AKV_GGUF_VTYPE_I16: v->as.i = (int16_t)akv__gguf_ld16(p); break;
    case AKV_GGUF_VTYPE_U32: v->as.u = akv__gguf_ld32(p); break;
    case AKV_GGUF_VTYPE_I32: v->as.i = (int32_t)akv__gguf_ld32(p); break;
    case AKV_GGUF_VTYPE_U64: v->as.u = akv__gguf_ld64(p); break;
    case AKV_GGUF_VTYPE_I64: v->as.i = (int64_t)akv__gguf_ld64(p); break;
    case AKV_GGUF_VTYPE_BOOL: v->as.b = p[0] != 0; break;
    case AKV_GGUF_VTYPE_F32: {
        uint32_t u = akv__gguf_ld32(p);
        float f;
        memcpy(&f, &u, 4);
        v->as.f = f;
        break;
    }
    case AKV_GGUF_VTYPE_F64: {
        uint64_t u = akv__gguf_ld64(p);
        memcpy(&v->as.f, &u, 8);
        break;
    }
    default: AKV_ASSERT(!"not a fixed-size value type");
    }
}

akv_gguf_value akv_gguf_kv_value(const akv_gguf *g, size_t idx) {
    AKV_ASSERT(idx < g->n_kv);
    const gguf_kv *kv = &g->kvs[idx];
    akv_gguf_value v;
    memset(&v, 0, sizeof v);
    v.type = kv->type;
    if (kv->type == AKV_GGUF_VTYPE_STRING) {
        v.as.str.ptr = (const char *)g->meta + kv->data_pos;
        v.as.str.len = (size_t)kv->n;
    } else if (kv->type == AKV_GGUF_VTYPE_ARRAY) {
        v.as.arr.type = kv->elem;
        v.as.arr.n = kv->n;
        v.as.arr.data = g->meta + kv->data_pos;
        v.as.arr.kv_idx = idx;
    } else {
        load_scalar(kv->type, g->meta + kv->data_pos, &v);
    }
    return v;
}

akv_status akv_gguf_find_kv(const akv_gguf *g, const char *key, size_t *out_idx) {
    if (!g || !key || !out_idx) return AKV_EINVAL;
    if (g->n_kv == 0) return AKV_ENOTFOUND;
    size_t s = akv__gguf_slot(g, false, key);
    if (!g->kv_slots[s]) return AKV_ENOTFOUND;
    *out_idx = g->kv_slots[s] - 1;
    return AKV_OK;
}

static bool vtype_is_unsigned(akv_gguf_vtype t) {
    return t == AKV_GGUF_VTYPE_U8 || t == AKV_GGUF_VTYPE_U16 || t == AKV_GGUF_VTYPE_U32 ||
           t == AKV_GGUF_VTYPE_U64;
}
static bool vtype_is_signed(akv_gguf_vtype t) {
    return t == AKV_GGUF_VTYPE_I8 || t == AKV_GGUF_VTYPE_I16 || t == AKV_GGUF_VTYPE_I32 ||
           t == AKV_GGUF_VTYPE_I64;
}

/* Finds `key` and logs a type mismatch; AKV_OK with *v filled. */
static akv_status get_value(const akv_gguf *g, const char *key, akv_gguf_value *v) {
    size_t idx;
    akv_status st = akv_gguf_find_kv(g, key, &idx);
    if (st) return st;
    *v = akv_gguf_kv_value(g, idx);
    return AKV_OK;
}

static akv_status wrong_type(const char *key, akv_gguf_vtype got, const char *want) {
    AKV_LOG_E("gguf: key '%s' is %s, expected %s", key, akv_gguf_vtype_name(got), want);
    return AKV_EFORMAT;
}

/* Finds `key` and requires its value to be of type `want`. */
static akv_status get_typed(const akv_gguf *g, const char *key, akv_gguf_vtype want,
                            akv_gguf_value *v) {
    akv_status st = get_value(g, key, v);
    if (st) return st;
    return v->type == want ? AKV_OK : wrong_type(key, v->type, akv_gguf_vtype_name(want));
}

akv_status akv_gguf_get_u64(const akv_gguf *g, const char *key, uint64_t *out) {
    akv_gguf_value v;
    akv_status st = get_value(g, key, &v);
    if (st) return st;
    if (vtype_is_unsigned(v.type)) *out = v.as.u;
    else if (vtype_is_signed(v.type) && v.as.i >= 0) *out = (uint64_t)v.as.i;
    else return wrong_type(key, v.type, "a non-negative integer");
    return AKV_OK;
}

akv_status akv_gguf_get_u32(const akv_gguf *g, const char *key, uint32_t *out) {
    uint64_t u;
    akv_status st = akv_gguf_get_u64(g, key, &u);
    if (st) return st;
    if (u > UINT32_MAX) {
        AKV_LOG_E("gguf: key '%s' = %llu does not fit in 32 bits", key, (unsigned long long)u);
        return AKV_EFORMAT;
    }
    *out = (uint32_t)u;
    return AKV_OK;
}

akv_status akv_gguf_get_i64(const akv_gguf *g, const char *key, int64_t *out) {
    akv_gguf_value v;
    akv_status st = get_value(g, key, &v);
    if (st) return st;
    if (vtype_is_signed(v.type)) *out = v.as.i;
    else if (vtype_is_unsigned(v.type) && v.as.u <= (uint64_t)INT64_MAX) *out = (int64_t)v.as.u;
    else return wrong_type(key, v.type, "an integer <= INT64_MAX");
    return AKV_OK;
}

akv_status akv_gguf_get_f64(const akv_gguf *g, const char *key, double *out) {
    akv_gguf_value v;
    akv_status st = get_value(g, key, &v);
    if (st) return st;
    if (v.type != AKV_GGUF_VTYPE_F32 && v.type != AKV_GGUF_VTYPE_F64)
        return wrong_type(key, v.type, "f32 or f64");
    *out = v.as.f;
    return AKV_OK;
}

akv_status akv_gguf_get_f32(const akv_gguf *g, const char *key, float *out) {
    double d;
    akv_status st = akv_gguf_get_f64(g, key, &d);
    if (!st) *out = (float)d;
    return st;
}

akv_status akv_gguf_get_bool(const akv_gguf *g, const char *key, bool *out) {
    akv_gguf_value v;
    akv_status st = get_typed(g, key, AKV_GGUF_VTYPE_BOOL, &v);
    if (!st) *out = v.as.b;
    return st;
}

akv_status akv_gguf_get_str(const akv_gguf *g, const char *key, akv_gguf_str *out) {
    akv_gguf_value v;
    akv_status st = get_typed(g, key, AKV_GGUF_VTYPE_STRING, &v);
    if (!st) *out = v.as.str;
    return st;
}

akv_status akv_gguf_get_arr(const akv_gguf *g, const char *key, akv_gguf_arr *out) {
    akv_gguf_value v;
    akv_status st = get_typed(g, key, AKV_GGUF_VTYPE_ARRAY, &v);
    if (!st) *out = v.as.arr;
    return st;
}

akv_gguf_str akv_gguf_arr_str(const akv_gguf *g, const akv_gguf_arr *a, uint64_t i) {
    AKV_ASSERT(a->type == AKV_GGUF_VTYPE_STRING && i < a->n && a->kv_idx < g->n_kv);
    const gguf_kv *kv = &g->kvs[a->kv_idx];
    AKV_ASSERT(kv->type == AKV_GGUF_VTYPE_ARRAY && kv->elem == AKV_GGUF_VTYPE_STRING);
    uint64_t pos = g->str_pos[kv->first_str + (size_t)i];
    akv_gguf_str s = {(const char *)g->meta + pos + 8, (size_t)akv__gguf_ld64(g->meta + pos)};
    return s;
}

int64_t akv_gguf_arr_int(const akv_gguf_arr *a, uint64_t i) {
    AKV_ASSERT(i < a->n);
    AKV_ASSERT(vtype_is_signed(a->type) || vtype_is_unsigned(a->type) ||
               a->type == AKV_GGUF_VTYPE_BOOL);
    akv_gguf_value v;
    load_scalar(a->type, (const uint8_t *)a->data + i * akv__gguf_vtype_size(a->type), &v);
    if (a->type == AKV_GGUF_VTYPE_BOOL) return v.as.b;
    return vtype_is_signed(a->type) ? v.as.i : (int64_t)v.as.u;
}

double akv_gguf_arr_float(const akv_gguf_arr *a, uint64_t i) {
    AKV_ASSERT(i < a->n);
    if (a->type == AKV_GGUF_VTYPE_F32 || a->type == AKV_GGUF_VTYPE_F64) {
        akv_gguf_value v;
        load_scalar(a->type, (const uint8_t *)a->data + i * akv__gguf_vtype_size(a->type), &v);
        return v.as.f;
    }
    if (vtype_is_unsigned(a->type)) return (double)(uint64_t)akv_gguf_arr_int(a, i);
    return (double)akv_gguf_arr_int(a, i);
}

void akv__gguf_kv_span(const akv_gguf *g, size_t idx, const uint8_t **out_p, size_t *out_n) {
    AKV_ASSERT(idx < g->n_kv);
    *out_p = g->meta + g->kvs[idx].pos;
    *out_n = (size_t)(g->kvs[idx].end - g->kvs[idx].pos);
}

/* ---- tensors --------------------------------------------------------------------------------- */

size_t akv_gguf_n_tensors(const akv_gguf *g) {
    return g->n_tensors;
}

const akv_gguf_tensor *akv_gguf_tensor_at(const akv_gguf *g, size_t idx) {
    AKV_ASSERT(idx < g->n_tensors);
    return &g->tensors[idx].pub;
}

akv_status akv_gguf_find_tensor(const akv_gguf *g, const char *name,
                                const akv_gguf_tensor **out) {
    if (!g || !name || !out) return AKV_EINVAL;
    if (g->n_tensors == 0) return AKV_ENOTFOUND;
    size_t s = akv__gguf_slot(g, true, name);
    if (!g->t_slots[s]) return AKV_ENOTFOUND;
    *out = &g->tensors[g->t_slots[s] - 1].pub;
    return AKV_OK;
}

uint64_t akv_gguf_tensor_row_bytes(const akv_gguf_tensor *t) {
    return t->ne[0] / akv_gguf_type_block_elems(t->type) * akv_gguf_type_block_bytes(t->type);
}

/* ---- validity walker ------------------------------------------------------------------------- */

#define CHECK_OR_FAIL(cond, ...)                                                                   \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            AKV_LOG_E("gguf check: " __VA_ARGS__);                                                 \
            return false;                                                                          \
        }                                                                                          \
    } while (0)

bool akv__gguf_check(const akv_gguf *g) {
    CHECK_OR_FAIL(g->version == 2 || g->version == 3, "version %u", g->version);
    CHECK_OR_FAIL(g->alignment && !(g->alignment & (g->alignment - 1)), "alignment %zu",
                  g->alignment);
    CHECK_OR_FAIL(g->data_offset % g->alignment == 0, "data offset %llu misaligned",
                  (unsigned long long)g->data_offset);
    CHECK_OR_FAIL(g->n_meta <= g->n_bytes && (g->meta || !g->n_meta), "metadata image");
    for (size_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kvs[i];
        CHECK_OR_FAIL(kv->pos < kv->end && kv->end <= g->n_meta, "kv %zu span", i);
        CHECK_OR_FAIL(strlen(kv->key) == kv->key_len && kv->key_len > 0, "kv %zu key", i);
        size_t found;
        CHECK_OR_FAIL(akv_gguf_find_kv(g, kv->key, &found) == AKV_OK && found == i,
                      "kv %zu '%s' not found by its key", i, kv->key);
        if (kv->type == AKV_GGUF_VTYPE_ARRAY && kv->elem == AKV_GGUF_VTYPE_STRING)
            CHECK_OR_FAIL(kv->first_str + kv->n <= g->n_str, "kv %zu string table", i);
    }
    for (size_t i = 0; i < g->n_str; i++) {
        uint64_t pos = g->str_pos[i];
        CHECK_OR_FAIL(pos + 8 <= g->n_meta && akv__gguf_ld64(g->meta + pos) <= g->n_meta - pos - 8,
                      "string element %zu", i);
    }
    for (size_t i = 0; i < g->n_tensors; i++) {
        const akv_gguf_tensor *t = &g->tensors[i].pub;
        CHECK_OR_FAIL(t->n_dims >= 1 && t->n_dims <= AKV_GGUF_MAX_DIMS, "tensor %zu dims", i);
        uint64_t n = 1;
        for (int d = 0; d < AKV_GGUF_MAX_DIMS; d++) n *= t->ne[d];
        CHECK_OR_FAIL(n == t->n_elems, "tensor %zu element count", i);
        size_t bytes;
        CHECK_OR_FAIL(akv_gguf_type_bytes(t->type, t->n_elems, &bytes) == AKV_OK &&
                          bytes == t->n_bytes, "tensor %zu byte size", i);
        CHECK_OR_FAIL(t->offset >= g->data_offset && (t->offset - g->data_offset) % g->alignment == 0,
                      "tensor %zu offset %llu", i, (unsigned long long)t->offset);
        CHECK_OR_FAIL(t->offset <= g->n_bytes && t->n_bytes <= g->n_bytes - t->offset,
                      "tensor %zu past the end", i);
        CHECK_OR_FAIL(t->data == g->base + t->offset, "tensor %zu data pointer", i);
        const akv_gguf_tensor *found;
        CHECK_OR_FAIL(akv_gguf_find_tensor(g, t->name, &found) == AKV_OK && found == t,
                      "tensor %zu '%s' not found by its name", i, t->name);
        /* Pairwise overlap (quadratic: only for indexes small enough to afford it). */
        for (size_t j = 0; j < i && g->n_tensors <= 4096; j++) {
            const akv_gguf_tensor *u = &g->tensors[j].pub;
            bool apart = !t->n_bytes || !u->n_bytes || t->offset + t->n_bytes <= u->offset ||
                         u->offset + u->n_bytes <= t->offset;
            CHECK_OR_FAIL(apart, "tensors %zu and %zu overlap", j, i);
        }
    }
    return true;
}
