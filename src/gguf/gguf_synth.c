/*
 * gguf_synth.c — synthetic Llama models (akv/gguf_synth.h): presets, shape checks, the
 * weight stream and the streaming write through gguf_writer.
 */
#define _POSIX_C_SOURCE 200809L
#include "akv/gguf_synth.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "akv/geom.h"
#include "akv/gguf_quant.h"
#include "akv/gguf_writer.h"
#include "core/alloc.h"
#include "core/log.h"
#include "gguf/gguf_impl.h"

/* From the models' published configurations (config.json): layers, hidden, heads, K/V
 * heads, head dim, FFN, vocab, context, RoPE theta, RMS epsilon, tied embeddings. */
static const akv_gguf_synth_shape synth_presets[] = {
    {"llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8192, 500000.0f, 1e-5f, false, false},
    {"llama3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0f, 1e-5f, true, false},
    {"smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0f, 1e-5f, true, false},
    {"qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f, true, true},
};

size_t akv_gguf_synth_n_presets(void) {
    return sizeof synth_presets / sizeof synth_presets[0];
}

const akv_gguf_synth_shape *akv_gguf_synth_preset(size_t i) {
    AKV_ASSERT(i < akv_gguf_synth_n_presets());
    return &synth_presets[i];
}

akv_status akv_gguf_synth_find_preset(const char *name, akv_gguf_synth_shape *out) {
    if (!name || !out) return AKV_EINVAL;
    for (size_t i = 0; i < akv_gguf_synth_n_presets(); i++) {
        if (!strcmp(synth_presets[i].name, name)) {
            *out = synth_presets[i];
            return AKV_OK;
        }
    }
    return AKV_ENOTFOUND;
}

/* ---- the weight stream ------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void akv__gguf_synth_values(uint64_t seed, size_t k, bool norm, uint64_t first, float *out,
                            size_t n) {
    /* Counter-based: element i draws 32 bits of hash(key, i / 2), so any range of any
     * tensor can be regenerated on its own (tests do). Uniform on [-1, 1) scaled to a
     * standard deviation of 0.02 (half-width 0.02 * sqrt 3), or 1 +- 0.02 for norms. */
    const float scale = norm ? 0.02f : 0.034641016f, base = norm ? 1.0f : 0.0f;
    uint64_t key = mix64(seed ^ mix64((uint64_t)k + 0x9E3779B97F4A7C15ull));
    for (size_t j = 0; j < n; j++) {
        uint64_t i = first + j;
        uint64_t h = mix64(key + (i >> 1) * 0x9E3779B97F4A7C15ull);
        int32_t r = (int32_t)(uint32_t)(h >> (32 * (i & 1)));
        out[j] = base + scale * ((float)r * 0x1p-31f);
    }
}

/* ---- the tensor list ---------------------------------------------------------------------------- */

typedef struct synth_tensor {
    char name[AKV_GGUF_MAX_NAME + 1];
    uint32_t n_dims;
    uint64_t ne[2];
    bool norm; /* f32 norm weight */
} synth_tensor;

/* Tensors a layer: nine, and qwen3's two head norms after them. */
static size_t synth_per_layer(const akv_gguf_synth_shape *s) {
    return s->qk_norm ? 11 : 9;
}

static size_t synth_n_tensors(const akv_gguf_synth_shape *s) {
    return 2 + synth_per_layer(s) * s->n_layers + (s->tied ? 0 : 1);
}

/* Tensor k of the file order in akv/gguf_synth.h. */
static void synth_tensor_at(const akv_gguf_synth_shape *s, size_t k, synth_tensor *t) {
    uint64_t q_dim = (uint64_t)s->n_heads * s->head_dim, kv_dim = (uint64_t)s->n_kv_heads * s->head_dim;
    memset(t, 0, sizeof *t);
    t->n_dims = 2;
    const size_t per = synth_per_layer(s), n_layer_tensors = per * s->n_layers;
    if (k == 0) {
        snprintf(t->name, sizeof t->name, "token_embd.weight");
        t->ne[0] = s->n_embd, t->ne[1] = s->n_vocab;
        return;
    }
    if (k > n_layer_tensors) {
        bool norm = k == n_layer_tensors + 1;
        snprintf(t->name, sizeof t->name, norm ? "output_norm.weight" : "output.weight");
        t->norm = norm;
        t->n_dims = norm ? 1 : 2;
        t->ne[0] = s->n_embd, t->ne[1] = norm ? 1 : s->n_vocab;
        return;
    }
    static const struct {
        const char *name;
        int in, out; /* 0 n_embd, 1 q_dim, 2 kv_dim, 3 n_ff, 4 head_dim; -1: norm */
    } per_layer[11] = {
        {"attn_norm", 0, -1}, {"attn_q", 0, 1}, {"attn_k", 0, 2},  {"attn_v", 0, 2},
        {"attn_output", 1, 0}, {"ffn_norm", 0, -1}, {"ffn_gate", 0, 3}, {"ffn_up", 0, 3},
        {"ffn_down", 3, 0}, {"attn_q_norm", 4, -1}, {"attn_k_norm", 4, -1},
    };
    const uint64_t dims[5] = {s->n_embd, q_dim, kv_dim, s->n_ff, s->head_dim};
    size_t layer = (k - 1) / per, which = (k - 1) % per;
    snprintf(t->name, sizeof t->name, "blk.%zu.%s.weight", layer, per_layer[which].name);
    t->ne[0] = dims[per_layer[which].in];
    t->norm = per_layer[which].out < 0;
    t->n_dims = t->norm ? 1 : 2;
    t->ne[1] = t->norm ? 1 : dims[per_layer[which].out];
}

/* ---- checks ----------------------------------------------------------------------------------- */

akv_status akv_gguf_synth_check(const akv_gguf_synth_shape *s, akv_gguf_type type) {
    if (!s) return AKV_EINVAL;
    if (!akv_gguf_can_quantize(type)) {
        AKV_LOG_E("gguf synth: type %s cannot be written (f32, f16, bf16, q8_0, q4_0, q4_1, q4_K, "
                  "q5_K, q6_K can)",
                  akv_gguf_type_name(type) ? akv_gguf_type_name(type) : "?");
        return AKV_EINVAL;
    }
    const struct {
        const char *what;
        uint32_t v;
    } counts[] = {{"layers", s->n_layers}, {"hidden", s->n_embd},   {"heads", s->n_heads},
                  {"kv heads", s->n_kv_heads}, {"head dim", s->head_dim}, {"ffn", s->n_ff},
                  {"vocab", s->n_vocab}, {"context", s->n_ctx}};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        if (counts[i].v == 0) {
            AKV_LOG_E("gguf synth: %s must be > 0", counts[i].what);
            return AKV_EINVAL;
        }
    }
    if (s->n_heads % s->n_kv_heads) {
        AKV_LOG_E("gguf synth: heads (%u) must be a multiple of kv heads (%u)", s->n_heads,
                  s->n_kv_heads);
        return AKV_EINVAL;
    }
    if (s->head_dim % 2) {
        AKV_LOG_E("gguf synth: head dim (%u) must be even (RoPE rotates pairs)", s->head_dim);
        return AKV_EINVAL;
    }
    /* the loader's rules (src/model/config.c): a file it would refuse is not written */
    if (!(s->rope_theta > 1) || isinf(s->rope_theta)) {
        AKV_LOG_E("gguf synth: rope theta %g must be finite and > 1", (double)s->rope_theta);
        return AKV_EINVAL;
    }
    if (!(s->rms_eps > 0 && s->rms_eps < 1)) {
        AKV_LOG_E("gguf synth: rms eps %g must be in (0, 1)", (double)s->rms_eps);
        return AKV_EINVAL;
    }
    if (s->n_layers > AKV_GEOM_MAX_LAYERS) {
        AKV_LOG_E("gguf synth: %u layers is more than %u (the K/V geometry's limit)", s->n_layers,
                  AKV_GEOM_MAX_LAYERS);
        return AKV_EINVAL;
    }
    size_t blk = akv_gguf_type_block_elems(type);
    uint64_t q_dim = (uint64_t)s->n_heads * s->head_dim;
    const struct {
        const char *what;
        uint64_t v;
    } rows[] = {{"hidden", s->n_embd}, {"heads x head dim", q_dim}, {"ffn", s->n_ff}};
    for (size_t i = 0; i < 3; i++) {
        if (rows[i].v % blk) {
            AKV_LOG_E("gguf synth: %s (%llu) must be a multiple of %zu, the %s block size",
                      rows[i].what, (unsigned long long)rows[i].v, blk, akv_gguf_type_name(type));
            return AKV_EINVAL;
        }
    }
    return AKV_OK;
}

const char *akv_gguf_synth_arch(const akv_gguf_synth_shape *s) {
    return s->qk_norm ? "qwen3" : "llama";
}

/* ---- writing ---------------------------------------------------------------------------------- */

/* llama.cpp's general.file_type for a file whose matrices are `type`. */
static uint32_t file_type_of(akv_gguf_type type) {
    switch (type) {
    case AKV_GGUF_TYPE_F32: return 0;
    case AKV_GGUF_TYPE_F16: return 1;
    case AKV_GGUF_TYPE_Q4_0: return 2;
    case AKV_GGUF_TYPE_Q4_1: return 3;
    case AKV_GGUF_TYPE_Q8_0: return 7;
    case AKV_GGUF_TYPE_Q4_K:
        return 14; /* the "S" mixes: every matrix in the one type */
    case AKV_GGUF_TYPE_Q5_K:
        return 16;
    case AKV_GGUF_TYPE_Q6_K:
        return 18;
    default: return 32; /* bf16 */
    }
}

static akv_status add_metadata(akv_gguf_writer *w, const akv_gguf_synth_params *p,
                               const akv_gguf_synth_shape *s) {
    char name[160];
    snprintf(name, sizeof name, "%s (synthetic, seed %llu)", s->name ? s->name : "custom",
             (unsigned long long)p->seed);
    bool quantised = akv_gguf_type_block_elems(p->type) > 1;
    akv_status st = AKV_OK;
#define ADD(e)                                                                                     \
    if (!st) st = (e)
    const char *arch = akv_gguf_synth_arch(s);
    char key[64];
#define ARCH_KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    ADD(akv_gguf_writer_add_str(w, "general.architecture", arch));
    ADD(akv_gguf_writer_add_str(w, "general.name", name));
    ADD(akv_gguf_writer_add_u32(w, "general.file_type", file_type_of(p->type)));
    if (quantised) ADD(akv_gguf_writer_add_u32(w, "general.quantization_version", 2));
    ADD(akv_gguf_writer_add_u32(w, ARCH_KEY("block_count"), s->n_layers));
    ADD(akv_gguf_writer_add_u32(w, ARCH_KEY("context_length"), s->n_ctx));
    ADD(akv_gguf_writer_add_u32(w, ARCH_KEY("embedding_length"), s->n_embd));
    ADD(akv_gguf_writer_add_u32(w, ARCH_KEY("feed_forward_length"), s->n_ff));
    ADD(akv_gguf_writer_add_u32(w, ARCH_KEY("attention.head_count"), s->n_heads));
    ADD(akv_gguf_writer_add_u32(w, ARCH_KEY("attention.head_count_kv"), s->n_kv_heads));
    ADD(akv_gguf_writer_add_u32(w, ARCH_KEY("attention.key_length"), s->head_dim));
    ADD(akv_gguf_writer_add_u32(w, ARCH_KEY("attention.value_length"), s->head_dim));
    ADD(akv_gguf_writer_add_f32(w, ARCH_KEY("attention.layer_norm_rms_epsilon"), s->rms_eps));
    ADD(akv_gguf_writer_add_f32(w, ARCH_KEY("rope.freq_base"), s->rope_theta));
    ADD(akv_gguf_writer_add_u32(w, ARCH_KEY("rope.dimension_count"), s->head_dim));
    ADD(akv_gguf_writer_add_u32(w, ARCH_KEY("vocab_size"), s->n_vocab));
#undef ARCH_KEY
    ADD(akv_gguf_writer_add_u64(w, "akv.synth.seed", p->seed));
    ADD(akv_gguf_writer_add_str(w, "akv.synth.shape", s->name ? s->name : "custom"));
    if (!p->vocab_from) ADD(akv_gguf_writer_add_str(w, "tokenizer.ggml.model", "none"));
    for (size_t i = 0; p->vocab_from && i < akv_gguf_n_kv(p->vocab_from); i++)
        if (!strncmp(akv_gguf_kv_key(p->vocab_from, i), "tokenizer.", 10))
            ADD(akv_gguf_writer_copy_kv(w, p->vocab_from, i));
#undef ADD
    return st;
}

/* Generates, encodes and writes tensor k in pieces of about 2^20 elements. */
static akv_status write_tensor(akv_gguf_writer *w, const akv_gguf_synth_params *p,
                               const akv_gguf_synth_shape *s, size_t k, float *vals,
                               uint8_t *bytes, size_t cap_elems, uint64_t *done,
                               uint64_t total) {
    synth_tensor t;
    synth_tensor_at(s, k, &t);
    akv_gguf_type type = t.norm ? AKV_GGUF_TYPE_F32 : p->type;
    uint64_t n_rows = t.ne[1], rows_per = cap_elems / t.ne[0];
    for (uint64_t r = 0; r < n_rows; r += rows_per) {
        uint64_t n_r = n_rows - r < rows_per ? n_rows - r : rows_per;
        size_t n = (size_t)(n_r * t.ne[0]), n_bytes = 0;
        akv__gguf_synth_values(p->seed, k, t.norm, r * t.ne[0], vals, n);
        akv_status st = akv_gguf_type_bytes(type, n, &n_bytes);
        if (!st) st = akv_gguf_quantize(type, vals, n, bytes);
        if (!st) st = akv_gguf_writer_write(w, bytes, n_bytes);
        if (st) return st;
        *done += n_bytes;
        if (p->progress) p->progress(p->progress_user, t.name, k, synth_n_tensors(s), *done, total);
    }
    return AKV_OK;
}

akv_status akv_gguf_synth_write(const akv_gguf_synth_params *p, const char *path) {
    if (!p || !path) return AKV_EINVAL;
    akv_gguf_synth_shape s = p->shape;
    if (p->vocab_from) {
        akv_gguf_arr tokens;
        akv_status st = akv_gguf_get_arr(p->vocab_from, "tokenizer.ggml.tokens", &tokens);
        if (st || tokens.type != AKV_GGUF_VTYPE_STRING || tokens.n == 0 || tokens.n > UINT32_MAX) {
            AKV_LOG_E("gguf synth: the vocabulary source has no token list "
                      "(tokenizer.ggml.tokens, an array of strings)");
            return AKV_EFORMAT;
        }
        s.n_vocab = (uint32_t)tokens.n;
    }
    akv_status st = akv_gguf_synth_check(&s, p->type);
    if (st) return st;
    /* The piece buffers: at least one row of the widest tensor, about 2^20 elements. */
    size_t cap_elems = (size_t)1 << 20;
    uint64_t widest = s.n_embd > s.n_ff ? s.n_embd : s.n_ff;
    if ((uint64_t)s.n_heads * s.head_dim > widest) widest = (uint64_t)s.n_heads * s.head_dim;
    if (widest > cap_elems) cap_elems = (size_t)widest;
    size_t cap_bytes = cap_elems * 4;
    float *vals = akv__malloc(cap_elems * sizeof *vals);
    uint8_t *bytes = akv__malloc(cap_bytes);
    akv_gguf_writer *w = NULL;
    if (!vals || !bytes) {
        st = AKV_ENOMEM;
        goto fail;
    }
    if ((st = akv_gguf_writer_create(path, NULL, &w))) goto fail;
    if ((st = add_metadata(w, p, &s))) goto fail;
    size_t n_tensors = synth_n_tensors(&s);
    uint64_t total = 0, done = 0; /* tensor data bytes */
    for (size_t k = 0; k < n_tensors && !st; k++) {
        synth_tensor t;
        synth_tensor_at(&s, k, &t);
        akv_gguf_type type = t.norm ? AKV_GGUF_TYPE_F32 : p->type;
        size_t n_bytes = 0;
        st = akv_gguf_writer_add_tensor(w, t.name, type, t.n_dims, t.ne);
        if (!st) st = akv_gguf_type_bytes(type, t.ne[0] * t.ne[1], &n_bytes);
        total += n_bytes;
    }
    if (st) goto fail;
    for (size_t k = 0; k < n_tensors && !st; k++)
        st = write_tensor(w, p, &s, k, vals, bytes, cap_elems, &done, total);
    if (!st) st = akv_gguf_writer_finish(w);
fail:
    akv_gguf_writer_destroy(w);
    akv__free(vals);
    akv__free(bytes);
    return st;
}
