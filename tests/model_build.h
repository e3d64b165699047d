/*
 * tests/model_build.h — tiny synthetic Llama/Qwen2 GGUF files for the model's unit tests.
 *
 * tm_init() fills a description (metadata kvs and f32 tensors with seeded random values) of a
 * complete model of the given shape; a test may then edit it (drop a key, change a shape or a
 * type, rename a tensor) before tm_write() serialises it (GGUF v3, alignment 32) to a
 * temporary file. Tensor values: norms around 1, other weights uniform in +-scale.
 */
#ifndef AKV_TEST_MODEL_BUILD_H
#define AKV_TEST_MODEL_BUILD_H

#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

#include "akv/model.h"
#include "core/assert.h"
#include "gguf_build.h"
#include "test.h"

enum { TM_MAX_KV = 32, TM_MAX_T = 128 };

typedef struct tm_kv {
    char key[80];
    uint32_t vtype; /* 4 = u32, 6 = f32, 8 = string */
    uint32_t u;
    float f;
    char s[32];
} tm_kv;

typedef struct tm_tensor {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[2];
    uint32_t type;    /* ggml type; f32 (0) unless a test changes it */
    float *data;      /* ne[0]*ne[1] floats (malloc'ed); written raw for f32 */
    size_t raw_bytes; /* for a non-f32 type: bytes written (data's leading bytes) */
} tm_tensor;

typedef struct tm_shape {
    const char *arch; /* "llama", "qwen2", "qwen3" or "gemma3" (its window keys: the caller's) */
    uint32_t n_layers, n_embd, n_ff, n_heads, n_kv_heads, n_vocab;
    bool tied;         /* no output.weight */
    bool rope_factors; /* a rope_freqs.weight tensor */
    float rope_base;
    float weight_scale; /* matrices uniform in +-weight_scale; 0 = 0.5 (sharp: every layer
                           visibly changes the stream) */
    uint32_t head_dim;  /* attention.key_length / value_length; 0 = n_embd / n_heads (keys
                           not written) */
} tm_shape;

typedef struct tm_model {
    tm_shape shape;
    tm_kv kv[TM_MAX_KV];
    int n_kv;
    tm_tensor t[TM_MAX_T];
    int n_t;
} tm_model;

static inline tm_kv *tm_kv_add(tm_model *m, const char *key, uint32_t vtype) {
    AKV_ASSERT(m->n_kv < TM_MAX_KV);
    tm_kv *kv = &m->kv[m->n_kv++];
    memset(kv, 0, sizeof *kv);
    snprintf(kv->key, sizeof kv->key, "%s", key);
    kv->vtype = vtype;
    return kv;
}

static inline void tm_u32(tm_model *m, const char *suffix, uint32_t v) {
    char key[80];
    snprintf(key, sizeof key, "%s.%s", m->shape.arch, suffix);
    tm_kv_add(m, key, 4)->u = v;
}

static inline void tm_f32(tm_model *m, const char *suffix, float v) {
    char key[80];
    snprintf(key, sizeof key, "%s.%s", m->shape.arch, suffix);
    tm_kv_add(m, key, 6)->f = v;
}

static inline tm_tensor *tm_tensor_add(tm_model *m, uint64_t *rng, const char *name, uint64_t ne0,
                                       uint64_t ne1, float center, float scale) {
    AKV_ASSERT(m->n_t < TM_MAX_T);
    tm_tensor *t = &m->t[m->n_t++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = ne1 ? 2 : 1;
    t->ne[0] = ne0, t->ne[1] = ne1 ? ne1 : 1;
    size_t n = (size_t)(ne0 * t->ne[1]);
    t->data = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        t->data[i] = center + scale * test_rand_f32(rng);
    return t;
}

static inline tm_tensor *tm_find(tm_model *m, const char *name) {
    for (int i = 0; i < m->n_t; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

static inline tm_kv *tm_find_kv(tm_model *m, const char *key) {
    for (int i = 0; i < m->n_kv; i++)
        if (!strcmp(m->kv[i].key, key)) return &m->kv[i];
    return NULL;
}

/* Removes a kv or a tensor by name (the test of a missing one). */
static inline void tm_drop(tm_model *m, const char *name) {
    for (int i = 0; i < m->n_kv; i++)
        if (!strcmp(m->kv[i].key, name)) m->kv[i] = m->kv[--m->n_kv];
    for (int i = 0; i < m->n_t; i++)
        if (!strcmp(m->t[i].name, name)) {
            free(m->t[i].data);
            m->t[i] = m->t[--m->n_t];
        }
}

static inline void tm_init(tm_model *m, const tm_shape *s, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->shape = *s;
    uint64_t rng = seed;
    tm_kv *a = tm_kv_add(m, "general.architecture", 8);
    snprintf(a->s, sizeof a->s, "%s", s->arch);
    uint32_t hd = s->head_dim ? s->head_dim : s->n_embd / s->n_heads;
    if (s->head_dim) tm_u32(m, "attention.key_length", hd), tm_u32(m, "attention.value_length", hd);
    tm_u32(m, "block_count", s->n_layers);
    tm_u32(m, "embedding_length", s->n_embd);
    tm_u32(m, "feed_forward_length", s->n_ff);
    tm_u32(m, "context_length", 4096);
    tm_u32(m, "attention.head_count", s->n_heads);
    tm_u32(m, "attention.head_count_kv", s->n_kv_heads);
    tm_u32(m, "rope.dimension_count", hd);
    tm_u32(m, "vocab_size", s->n_vocab);
    tm_f32(m, "attention.layer_norm_rms_epsilon", 1e-5f);
    tm_f32(m, "rope.freq_base", s->rope_base ? s->rope_base : 10000.0f);
    bool bias = !strcmp(s->arch, "qwen2");
    uint32_t q = s->n_heads * hd, kv = s->n_kv_heads * hd;
    float ws = s->weight_scale > 0 ? s->weight_scale : 0.5f;
    tm_tensor_add(m, &rng, "token_embd.weight", s->n_embd, s->n_vocab, 0, 1);
    tm_tensor_add(m, &rng, "output_norm.weight", s->n_embd, 0, 1, 0.2f);
    if (!s->tied) tm_tensor_add(m, &rng, "output.weight", s->n_embd, s->n_vocab, 0, ws);
    if (s->rope_factors) tm_tensor_add(m, &rng, "rope_freqs.weight", hd / 2, 0, 4, 3);
    for (uint32_t l = 0; l < s->n_layers; l++) {
        char n[64];
#define TM_T(suffix, ne0, ne1, c, sc)                                                              \
    snprintf(n, sizeof n, "blk.%u.%s", l, suffix);                                                 \
    tm_tensor_add(m, &rng, n, ne0, ne1, c, sc)
        TM_T("attn_norm.weight", s->n_embd, 0, 1, 0.2f);
        TM_T("attn_q.weight", s->n_embd, q, 0, ws);
        TM_T("attn_k.weight", s->n_embd, kv, 0, ws);
        TM_T("attn_v.weight", s->n_embd, kv, 0, ws);
        if (bias) {
            TM_T("attn_q.bias", q, 0, 0, ws);
            TM_T("attn_k.bias", kv, 0, 0, ws);
            TM_T("attn_v.bias", kv, 0, 0, ws);
        }
        if (!strcmp(s->arch, "qwen3") || !strcmp(s->arch, "gemma3")) {
            TM_T("attn_q_norm.weight", hd, 0, 1, 0.2f);
            TM_T("attn_k_norm.weight", hd, 0, 1, 0.2f);
        }
        if (!strcmp(s->arch, "gemma3")) {
            TM_T("post_attention_norm.weight", s->n_embd, 0, 1, 0.2f);
            TM_T("post_ffw_norm.weight", s->n_embd, 0, 1, 0.2f);
        }
        TM_T("attn_output.weight", q, s->n_embd, 0, ws);
        TM_T("ffn_norm.weight", s->n_embd, 0, 1, 0.2f);
        TM_T("ffn_gate.weight", s->n_embd, s->n_ff, 0, ws);
        TM_T("ffn_up.weight", s->n_embd, s->n_ff, 0, ws);
        TM_T("ffn_down.weight", s->n_ff, s->n_embd, 0, ws);
#undef TM_T
    }
}

static inline void tm_free(tm_model *m) {
    for (int i = 0; i < m->n_t; i++)
        free(m->t[i].data);
    m->n_t = 0;
}

/* Serialises to a new temporary file; writes its path into path[64]. */
static inline void tm_write(const tm_model *m, char path[64]) {
    gb b = {0};
    gb_bytes(&b, "GGUF", 4);
    gb_u32(&b, 3);
    gb_u64(&b, (uint64_t)m->n_t);
    gb_u64(&b, (uint64_t)m->n_kv);
    for (int i = 0; i < m->n_kv; i++) {
        gb_str(&b, m->kv[i].key);
        gb_u32(&b, m->kv[i].vtype);
        if (m->kv[i].vtype == 4)
            gb_u32(&b, m->kv[i].u);
        else if (m->kv[i].vtype == 6)
            gb_f32(&b, m->kv[i].f);
        else
            gb_str(&b, m->kv[i].s);
    }
    uint64_t rel = 0;
    for (int i = 0; i < m->n_t; i++) {
        const tm_tensor *t = &m->t[i];
        size_t bytes = t->type ? t->raw_bytes : (size_t)(t->ne[0] * t->ne[1] * 4);
        gb_str(&b, t->name);
        gb_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            gb_u64(&b, t->ne[d]);
        gb_u32(&b, t->type);
        gb_u64(&b, rel);
        rel += (bytes + 31) / 32 * 32;
    }
    gb_pad(&b, 32);
    for (int i = 0; i < m->n_t; i++) {
        const tm_tensor *t = &m->t[i];
        size_t bytes = t->type ? t->raw_bytes : (size_t)(t->ne[0] * t->ne[1] * 4);
        gb_bytes(&b, t->data, bytes);
        gb_pad(&b, 32);
    }
    snprintf(path, 64, "/tmp/akv_test_model_XXXXXX");
    int fd = mkstemp(path);
    AKV_ASSERT(fd >= 0);
    AKV_ASSERT(write(fd, b.p, b.n) == (ssize_t)b.n);
    close(fd);
    gb_free(&b);
}

/* Writes m, loads it (native storage), removes the file and frees m; NULL if the load fails. */
static inline akv_model *tm_write_load(tm_model *m) {
    char path[64];
    tm_write(m, path);
    akv_model *model = NULL;
    akv_status st = akv_model_load(path, NULL, &model);
    unlink(path);
    tm_free(m);
    return st == AKV_OK ? model : NULL;
}

/* Writes a model of shape s (seeded), loads it and removes the file; NULL if it fails.
 * tm_load_rounded: every weight rounded by `round` first (NULL = as drawn). */
static inline akv_model *tm_load_rounded(const tm_shape *s, uint64_t seed, float (*round)(float)) {
    tm_model m;
    tm_init(&m, s, seed);
    for (int i = 0; round && i < m.n_t; i++)
        for (size_t j = 0; j < (size_t)(m.t[i].ne[0] * m.t[i].ne[1]); j++)
            m.t[i].data[j] = round(m.t[i].data[j]);
    return tm_write_load(&m);
}

static inline akv_model *tm_load(const tm_shape *s, uint64_t seed) {
    return tm_load_rounded(s, seed, NULL);
}

#endif
