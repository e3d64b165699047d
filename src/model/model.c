/* model.c — loading a model: weight binding by tensor name, shape checks, dequantisation to
 * f32 (akv/model.h). */
#include "akv/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "akv/gguf_quant.h"
#include "core/alloc.h"
#include "core/log.h"

struct akv_model {
    akv_model_config cfg;
    akv_gguf *gguf; /* open for the model's lifetime (tokenizer metadata) */
    float *arena;   /* every dequantised weight, one allocation */
    size_t arena_bytes;
    akv_model_layer *layers; /* [n_layers] pointers into the arena */
    const float *tok_embd, *output_norm, *output;
    float *inv_freq; /* [n_rot/2] */
};

/* One tensor to bind: where its data goes and the shape it must have. */
typedef struct model_bind {
    char name[AKV_GGUF_MAX_NAME + 1];
    uint64_t cols, rows; /* expected ne[0], ne[1]; rows = 0 for a vector */
    const float **dst;   /* receives the f32 copy */
    const akv_gguf_tensor *t;
    size_t offset; /* in the arena, floats */
} model_bind;

/* Aligns every tensor in the arena to 64 bytes (16 floats) for vector loads. */
#define MODEL_ALIGN_FLOATS 16u

static akv_status model_check_shape(const model_bind *b) {
    const akv_gguf_tensor *t = b->t;
    bool ok = b->rows ? t->n_dims == 2 && t->ne[0] == b->cols && t->ne[1] == b->rows
                      : t->n_dims == 1 && t->ne[0] == b->cols;
    if (ok) return AKV_OK;
    char found[96];
    int n = snprintf(found, sizeof found, "{");
    for (uint32_t d = 0; d < t->n_dims && n < (int)sizeof found; d++)
        n += snprintf(found + n, sizeof found - (size_t)n, "%s%llu", d ? ", " : "",
                      (unsigned long long)t->ne[d]);
    if (n < (int)sizeof found) snprintf(found + n, sizeof found - (size_t)n, "}");
    if (b->rows)
        AKV_LOG_E("model: tensor '%s' has shape %s; expected {%llu, %llu}", b->name, found,
                  (unsigned long long)b->cols, (unsigned long long)b->rows);
    else
        AKV_LOG_E("model: tensor '%s' has shape %s; expected {%llu}", b->name, found,
                  (unsigned long long)b->cols);
    return AKV_EFORMAT;
}

/* Adds a binding; a missing tensor is AKV_EFORMAT when required, else leaves *dst NULL. */
static akv_status model_add(const akv_gguf *g, model_bind *binds, size_t *n, const char *name,
                            uint64_t cols, uint64_t rows, const float **dst, bool required) {
    model_bind *b = &binds[*n];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->cols = cols, b->rows = rows, b->dst = dst;
    *dst = NULL;
    if (akv_gguf_find_tensor(g, name, &b->t) != AKV_OK) {
        if (!required) return AKV_OK;
        AKV_LOG_E("model: tensor '%s' is missing", name);
        return AKV_EFORMAT;
    }
    akv_status st = model_check_shape(b);
    if (st) return st;
    if (!akv_gguf_can_dequant(b->t->type)) {
        const char *tn = akv_gguf_type_name(b->t->type);
        AKV_LOG_E("model: tensor '%s' is of type %s, which this build cannot dequantise", name,
                  tn ? tn : "?");
        return AKV_EUNSUPPORTED;
    }
    (*n)++;
    return AKV_OK;
}

/* Every binding of the architecture, in file-independent order. */
static akv_status model_bind_all(akv_model *m, model_bind *binds, size_t *n_binds) {
    const akv_model_config *c = &m->cfg;
    const akv_gguf *g = m->gguf;
    uint64_t q = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->n_kv_heads * c->head_dim;
    size_t n = 0;
    akv_status st;
    if ((st = model_add(g, binds, &n, "token_embd.weight", c->n_embd, c->n_vocab, &m->tok_embd,
                        true)) ||
        (st = model_add(g, binds, &n, "output_norm.weight", c->n_embd, 0, &m->output_norm, true)) ||
        (st = model_add(g, binds, &n, "output.weight", c->n_embd, c->n_vocab, &m->output, false)))
        return st;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        akv_model_layer *L = &m->layers[l];
        const struct {
            const char *suffix;
            uint64_t cols, rows;
            const float **dst;
            bool required;
        } ts[] = {
            {"attn_norm.weight", c->n_embd, 0, &L->attn_norm, true},
            {"attn_q.weight", c->n_embd, q, &L->wq, true},
            {"attn_k.weight", c->n_embd, kv, &L->wk, true},
            {"attn_v.weight", c->n_embd, kv, &L->wv, true},
            {"attn_q.bias", q, 0, &L->bq, c->has_qkv_bias},
            {"attn_k.bias", kv, 0, &L->bk, c->has_qkv_bias},
            {"attn_v.bias", kv, 0, &L->bv, c->has_qkv_bias},
            {"attn_output.weight", q, c->n_embd, &L->wo, true},
            {"ffn_norm.weight", c->n_embd, 0, &L->ffn_norm, true},
            {"ffn_gate.weight", c->n_embd, c->n_ff, &L->w_gate, true},
            {"ffn_up.weight", c->n_embd, c->n_ff, &L->w_up, true},
            {"ffn_down.weight", c->n_ff, c->n_embd, &L->w_down, true},
        };
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            if (!c->has_qkv_bias && ts[i].rows == 0 && strstr(ts[i].suffix, ".bias")) {
                *ts[i].dst = NULL; /* llama: no bias, and a stray one would be ignored */
                continue;
            }
            char name[AKV_GGUF_MAX_NAME + 1];
            snprintf(name, sizeof name, "blk.%u.%s", l, ts[i].suffix);
            if ((st = model_add(g, binds, &n, name, ts[i].cols, ts[i].rows, ts[i].dst,
                                ts[i].required)))
                return st;
        }
    }
    *n_binds = n;
    return AKV_OK;
}

/* Tensors of the file that no binding uses (rope_freqs aside): logged, since a tensor we do
 * not understand may mean a variant of the architecture we do not implement. */
static void model_warn_unused(const akv_model *m, const model_bind *binds, size_t n_binds) {
    size_t n_t = akv_gguf_n_tensors(m->gguf), n_unused = 0;
    for (size_t i = 0; i < n_t; i++) {
        const akv_gguf_tensor *t = akv_gguf_tensor_at(m->gguf, i);
        bool used = !strcmp(t->name, "rope_freqs.weight");
        for (size_t j = 0; j < n_binds && !used; j++)
            used = binds[j].t == t;
        if (!used && n_unused++ < 8) AKV_LOG_W("model: tensor '%s' is not used", t->name);
    }
    if (n_unused > 8) AKV_LOG_W("model: %zu tensors are not used in all", n_unused);
}

/* inv_freq from the configuration and, when present, rope_freqs.weight. */
static akv_status model_rope(akv_model *m) {
    const akv_model_config *c = &m->cfg;
    uint32_t n_pairs = c->n_rot / 2;
    float *factors = NULL;
    akv_status st;
    m->inv_freq = akv__calloc(n_pairs, sizeof *m->inv_freq);
    if (!m->inv_freq) return AKV_ENOMEM;
    if (c->has_rope_factors) {
        const akv_gguf_tensor *t;
        st = akv_gguf_find_tensor(m->gguf, "rope_freqs.weight", &t);
        if (st) return st;
        model_bind b = {.name = "rope_freqs.weight", .cols = n_pairs, .t = t};
        if ((st = model_check_shape(&b))) return st;
        factors = akv__calloc(n_pairs, sizeof *factors);
        if (!factors) return AKV_ENOMEM;
        st = akv_gguf_tensor_f32(m->gguf, t, factors);
        if (st) {
            AKV_LOG_E("model: tensor 'rope_freqs.weight' cannot be dequantised");
            akv__free(factors);
            return st;
        }
    }
    st = akv_ops_ref_rope_freqs(c->rope_base, c->n_rot, c->rope_freq_scale, factors, m->inv_freq);
    akv__free(factors);
    if (st) {
        AKV_LOG_E("model: the RoPE parameters of the file are invalid (see above)");
        return AKV_EFORMAT;
    }
    return AKV_OK;
}

/* Every weight of a tensor finite, else AKV_EFORMAT naming the tensor, the first bad element
 * and its block: a NaN or infinity in the file would otherwise surface as a sampler that
 * finds no finite logit, pointing nowhere near the model. */
static akv_status model_check_finite(const akv_gguf_tensor *t, const float *w) {
    bool finite = true;
    for (uint64_t i = 0; i < t->n_elems; i++) /* no early exit: the loop vectorises */
        finite &= isfinite(w[i]) != 0;
    if (finite) return AKV_OK;
    for (uint64_t i = 0; i < t->n_elems; i++)
        if (!isfinite(w[i])) {
            size_t blk = akv_gguf_type_block_elems(t->type);
            AKV_LOG_E("model: tensor '%s' (%s) holds a non-finite weight (%s) at element %llu, in "
                      "block %llu at file offset %llu: the file is damaged",
                      t->name, akv_gguf_type_name(t->type), isnan(w[i]) ? "NaN" : "infinity",
                      (unsigned long long)i, (unsigned long long)(i / blk),
                      (unsigned long long)(t->offset + i / blk * akv_gguf_type_block_bytes(t->type)));
            return AKV_EFORMAT;
        }
    return AKV_OK;
}

/* The model of an open GGUF, which it takes (closed by akv_model_destroy, or here on failure). */
static akv_status model_load(akv_gguf *g, const akv_model_load_params *params, akv_model **out) {
    akv_model_load_params p = params ? *params : (akv_model_load_params){0};
    akv_model *m = akv__calloc(1, sizeof *m);
    model_bind *binds = NULL;
    akv_status st = AKV_ENOMEM;
    if (!m) {
        akv_gguf_close(g);
        return AKV_ENOMEM;
    }
    m->gguf = g;
    if ((st = akv_model_config_read(m->gguf, &m->cfg))) goto fail;
    const akv_model_config *c = &m->cfg;

    st = AKV_ENOMEM;
    m->layers = akv__calloc(c->n_layers, sizeof *m->layers);
    binds = akv__calloc(3 + (size_t)c->n_layers * 12, sizeof *binds);
    if (!m->layers || !binds) goto fail;
    size_t n_binds = 0;
    if ((st = model_bind_all(m, binds, &n_binds))) goto fail;
    if ((st = model_rope(m))) goto fail;
    model_warn_unused(m, binds, n_binds);

    /* Lay the f32 copies out in one arena, each 64-byte aligned; n_elems of a bound tensor
     * is at most 2^32 * 2^32 (shape-checked), so the products below are checked anyway. */
    size_t n_floats = 0;
    for (size_t i = 0; i < n_binds; i++) {
        size_t sz;
        binds[i].offset = n_floats;
        if (!akv__size_add((size_t)binds[i].t->n_elems, MODEL_ALIGN_FLOATS - 1, &sz) ||
            !akv__size_add(n_floats, sz / MODEL_ALIGN_FLOATS * MODEL_ALIGN_FLOATS, &n_floats)) {
            st = AKV_EOVERFLOW;
            goto fail;
        }
    }
    if (!akv__size_mul(n_floats, sizeof(float), &m->arena_bytes)) {
        st = AKV_EOVERFLOW;
        goto fail;
    }
    m->arena = akv__malloc(m->arena_bytes);
    if (!m->arena) {
        AKV_LOG_E("model: cannot allocate %.1f MiB for the f32 weights",
                  (double)m->arena_bytes / (1 << 20));
        st = AKV_ENOMEM;
        goto fail;
    }

    uint64_t done = 0;
    for (size_t i = 0; i < n_binds; i++) {
        const akv_gguf_tensor *t = binds[i].t;
        float *dst = m->arena + binds[i].offset;
        if ((st = akv_gguf_tensor_f32(m->gguf, t, dst))) {
            AKV_LOG_E("model: tensor '%s' cannot be %s: %s", binds[i].name,
                      st == AKV_EIO ? "read" : "dequantised", akv_status_str(st));
            goto fail;
        }
        if ((st = model_check_finite(t, dst))) goto fail;
        *binds[i].dst = dst;
        done += t->n_elems * sizeof(float);
        if (p.progress) p.progress(p.progress_user, done, m->arena_bytes);
    }
    if (!m->output) m->output = m->tok_embd;
    akv__free(binds);
    *out = m;
    return AKV_OK;
fail:
    akv__free(binds);
    akv_model_destroy(m);
    return st;
}

akv_status akv_model_load(const char *path, const akv_model_load_params *params, akv_model **out) {
    if (!path || !out) return AKV_EINVAL;
    akv_gguf *g = NULL;
    akv_status st = akv_gguf_open(path, &g);
    return st ? st : model_load(g, params, out);
}

akv_status akv_model_load_memory(const void *data, size_t n_bytes,
                                 const akv_model_load_params *params, akv_model **out) {
    if ((!data && n_bytes) || !out) return AKV_EINVAL;
    akv_gguf *g = NULL;
    akv_status st = akv_gguf_open_memory(data, n_bytes, &g);
    return st ? st : model_load(g, params, out);
}

void akv_model_destroy(akv_model *m) {
    if (!m) return;
    akv__free(m->arena);
    akv__free(m->layers);
    akv__free(m->inv_freq);
    akv_gguf_close(m->gguf);
    akv__free(m);
}

const akv_model_config *akv_model_get_config(const akv_model *m) {
    return &m->cfg;
}

const akv_model_layer *akv_model_get_layer(const akv_model *m, uint32_t layer) {
    AKV_ASSERT(layer < m->cfg.n_layers);
    return &m->layers[layer];
}

const float *akv_model_tok_embd(const akv_model *m) {
    return m->tok_embd;
}
const float *akv_model_output_norm(const akv_model *m) {
    return m->output_norm;
}
const float *akv_model_output(const akv_model *m) {
    return m->output;
}
const float *akv_model_rope_inv_freq(const akv_model *m) {
    return m->inv_freq;
}
const akv_gguf *akv_model_gguf(const akv_model *m) {
    return m->gguf;
}
size_t akv_model_weight_bytes(const akv_model *m) {
    return m->arena_bytes;
}
