/* model.c — loading a model: weight binding by tensor name, shape checks, each weight stored
 * in its block format or widened to f32 (akv/model.h). */
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
    uint8_t *arena; /* every weight, one allocation */
    size_t arena_bytes;
    size_t step_bytes;       /* akv_model_step_weight_bytes */
    akv_model_layer *layers; /* [n_layers] pointers into the arena */
    akv_model_mat tok_embd, output;
    const float *output_norm;
    float *inv_freq;     /* [n_rot/2] */
    float *inv_freq_swa; /* [n_rot/2] local layers' (rope_base_swa); NULL without a window */
};

/* One tensor to bind: where its data goes and the shape it must have. */
typedef struct model_bind {
    char name[AKV_GGUF_MAX_NAME + 1];
    uint64_t cols, rows; /* expected ne[0], ne[1]; rows = 0 for a vector */
    const float **vec;   /* a vector: receives its f32 copy */
    akv_model_mat *mat;  /* a matrix: receives its storage */
    const akv_gguf_tensor *t;
    akv_ops_wtype as;     /* how it is stored */
    size_t offset, bytes; /* in the arena */
} model_bind;

/* Every tensor starts at a multiple of 64 bytes from the arena's start (a cache line). */
#define MODEL_ALIGN 64u

/* The weight formats of akv/ops.h and the GGUF types they are. */
static const struct {
    akv_ops_wtype w;
    uint32_t gguf;
} model_types[] = {
    {AKV_OPS_W_F32, AKV_GGUF_TYPE_F32},   {AKV_OPS_W_BF16, AKV_GGUF_TYPE_BF16},
    {AKV_OPS_W_Q8_0, AKV_GGUF_TYPE_Q8_0}, {AKV_OPS_W_Q4_0, AKV_GGUF_TYPE_Q4_0},
    {AKV_OPS_W_Q4_1, AKV_GGUF_TYPE_Q4_1}, {AKV_OPS_W_Q4_K, AKV_GGUF_TYPE_Q4_K},
    {AKV_OPS_W_Q5_0, AKV_GGUF_TYPE_Q5_0}, {AKV_OPS_W_Q5_1, AKV_GGUF_TYPE_Q5_1},
    {AKV_OPS_W_Q5_K, AKV_GGUF_TYPE_Q5_K}, {AKV_OPS_W_Q6_K, AKV_GGUF_TYPE_Q6_K},
};

/* The block format of the host products that a GGUF type is, or 0. */
static akv_ops_wtype model_block_type(uint32_t gguf_type) {
    for (size_t i = 0; i < sizeof model_types / sizeof *model_types; i++)
        if (model_types[i].gguf == gguf_type && akv_ops_wtype_is_block(model_types[i].w))
            return model_types[i].w;
    return (akv_ops_wtype)0;
}

static uint32_t model_gguf_type(akv_ops_wtype t) {
    for (size_t i = 0; i < sizeof model_types / sizeof *model_types; i++)
        if (model_types[i].w == t) return model_types[i].gguf;
    return UINT32_MAX;
}

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

/* Adds a binding of a vector (vec) or a matrix (mat); a missing tensor is AKV_EFORMAT when
 * required, else leaves the destination empty. */
static akv_status model_add(const akv_gguf *g, model_bind *binds, size_t *n, const char *name,
                            uint64_t cols, uint64_t rows, const float **vec, akv_model_mat *mat,
                            bool required) {
    model_bind *b = &binds[*n];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->cols = cols, b->rows = rows, b->vec = vec, b->mat = mat;
    if (vec) *vec = NULL;
    if (mat) memset(mat, 0, sizeof *mat);
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
    if ((st = model_add(g, binds, &n, "token_embd.weight", c->n_embd, c->n_vocab, NULL,
                        &m->tok_embd, true)) ||
        (st = model_add(g, binds, &n, "output_norm.weight", c->n_embd, 0, &m->output_norm, NULL,
                        true)) ||
        (st = model_add(g, binds, &n, "output.weight", c->n_embd, c->n_vocab, NULL, &m->output,
                        false)))
        return st;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        akv_model_layer *L = &m->layers[l];
        const struct {
            const char *suffix;
            uint64_t cols, rows;
            const float **vec;
            akv_model_mat *mat;
            bool required;
        } ts[] = {
            {"attn_norm.weight", c->n_embd, 0, &L->attn_norm, NULL, true},
            {"attn_q.weight", c->n_embd, q, NULL, &L->wq, true},
            {"attn_k.weight", c->n_embd, kv, NULL, &L->wk, true},
            {"attn_v.weight", c->n_embd, kv, NULL, &L->wv, true},
            {"attn_q.bias", q, 0, &L->bq, NULL, c->has_qkv_bias},
            {"attn_k.bias", kv, 0, &L->bk, NULL, c->has_qkv_bias},
            {"attn_v.bias", kv, 0, &L->bv, NULL, c->has_qkv_bias},
            {"attn_q_norm.weight", c->head_dim, 0, &L->q_norm, NULL, c->has_qk_norm},
            {"attn_k_norm.weight", c->head_dim, 0, &L->k_norm, NULL, c->has_qk_norm},
            {"attn_output.weight", q, c->n_embd, NULL, &L->wo, true},
            {"ffn_norm.weight", c->n_embd, 0, &L->ffn_norm, NULL, true},
            {"ffn_gate.weight", c->n_embd, c->n_ff, NULL, &L->w_gate, true},
            {"ffn_up.weight", c->n_embd, c->n_ff, NULL, &L->w_up, true},
            {"ffn_down.weight", c->n_ff, c->n_embd, NULL, &L->w_down, true},
            {"post_attention_norm.weight", c->n_embd, 0, &L->attn_post_norm, NULL, c->has_post_norms},
            {"post_ffw_norm.weight", c->n_embd, 0, &L->ffn_post_norm, NULL, c->has_post_norms},
        };
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            if (!ts[i].required && ts[i].vec) { /* a vector of another architecture (a bias, a
                                                    head norm): a stray one is unused, logged */
                *ts[i].vec = NULL;
                continue;
            }
            char name[AKV_GGUF_MAX_NAME + 1];
            snprintf(name, sizeof name, "blk.%u.%s", l, ts[i].suffix);
            if ((st = model_add(g, binds, &n, name, ts[i].cols, ts[i].rows, ts[i].vec, ts[i].mat,
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
    if (!st && c->n_swa) { /* llama.cpp: local layers take their base, scale 1, no factors */
        if (!(m->inv_freq_swa = akv__calloc(n_pairs, sizeof *m->inv_freq_swa))) st = AKV_ENOMEM;
        else st = akv_ops_ref_rope_freqs(c->rope_base_swa, c->n_rot, 1.0, NULL, m->inv_freq_swa);
    }
    akv__free(factors);
    if (st == AKV_ENOMEM) return st;
    if (st) {
        AKV_LOG_E("model: the RoPE parameters of the file are invalid (see above)");
        return AKV_EFORMAT;
    }
    return AKV_OK;
}

/* Elements [e0, e0 + n) of tensor t, as floats at w, all finite, else AKV_EFORMAT naming the
 * tensor, the first bad element and its block: a NaN or infinity in the file would otherwise
 * surface as a sampler that finds no finite logit, pointing nowhere near the model. */
static akv_status model_check_finite(const akv_gguf_tensor *t, const float *w, uint64_t e0,
                                     size_t n) {
    bool finite = true;
    for (size_t i = 0; i < n; i++) /* no early exit: the loop vectorises */
        finite &= isfinite(w[i]) != 0;
    if (finite) return AKV_OK;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(w[i])) {
            const uint64_t e = e0 + i, blk = akv_gguf_type_block_elems(t->type);
            AKV_LOG_E(
                "model: tensor '%s' (%s) holds a non-finite weight (%s) at element %llu, in "
                "block %llu at file offset %llu: the file is damaged",
                t->name, akv_gguf_type_name(t->type), isnan(w[i]) ? "NaN" : "infinity",
                (unsigned long long)e, (unsigned long long)(e / blk),
                (unsigned long long)(t->offset + e / blk * akv_gguf_type_block_bytes(t->type)));
            return AKV_EFORMAT;
        }
    return AKV_OK;
}

/* How binding b is stored under `weights` (akv/model.h, "Storage"). */
static akv_ops_wtype model_storage(const model_bind *b, akv_weights weights) {
    const akv_ops_wtype blk = model_block_type(b->t->type);
    if (b->mat && weights == AKV_WEIGHTS_NATIVE && blk && akv_ops_wrow_bytes(blk, b->cols))
        return blk;
    return AKV_OPS_W_F32;
}

/* Binding b's data into the arena at dst, checked finite (a block matrix through its rows
 * decoded into `row`, n_cols floats). */
static akv_status model_store(akv_model *m, const model_bind *b, uint8_t *dst, float *row) {
    const akv_gguf_tensor *t = b->t;
    akv_status st;
    if (b->as == AKV_OPS_W_F32) {
        st = akv_gguf_tensor_f32(m->gguf, t, (float *)(void *)dst);
        if (!st)
            return model_check_finite(t, (const float *)(const void *)dst, 0, (size_t)t->n_elems);
    } else {
        st = akv_gguf_tensor_read(m->gguf, t, 0, dst, (size_t)t->n_bytes);
        for (uint64_t r = 0; r < b->rows && !st; r++) {
            st = akv_gguf_dequant_f32(t->type, dst + r * akv_ops_wrow_bytes(b->as, (size_t)b->cols),
                                      (size_t)b->cols, row);
            if (!st) st = model_check_finite(t, row, r * b->cols, (size_t)b->cols);
            if (st == AKV_EFORMAT) return st;
        }
        if (!st) return AKV_OK;
    }
    if (st != AKV_EFORMAT)
        AKV_LOG_E("model: tensor '%s' cannot be %s: %s", b->name,
                  st == AKV_EIO ? "read" : "dequantised", akv_status_str(st));
    return st;
}

/* Bytes of binding b as stored. */
static bool model_bytes(const model_bind *b, size_t *out) {
    if (b->as != AKV_OPS_W_F32) return (*out = (size_t)b->t->n_bytes), true;
    return akv__size_mul((size_t)b->t->n_elems, sizeof(float), out);
}

/* Says, per GGUF type, how many matrices of it were widened to f32 (and names the first). */
static void model_log_widened(const model_bind *binds, size_t n_binds) {
    size_t count[AKV_GGUF_TYPE_COUNT] = {0}, first[AKV_GGUF_TYPE_COUNT] = {0};
    for (size_t i = 0; i < n_binds; i++) {
        const uint32_t t = binds[i].t->type;
        if (binds[i].mat && binds[i].as == AKV_OPS_W_F32 && t != AKV_GGUF_TYPE_F32 &&
            t < AKV_GGUF_TYPE_COUNT)
            if (count[t]++ == 0) first[t] = i;
    }
    for (uint32_t t = 0; t < AKV_GGUF_TYPE_COUNT; t++)
        if (count[t])
            AKV_LOG_I("model: %zu matri%s of type %s widened to f32 (e.g. '%s')", count[t],
                      count[t] == 1 ? "x" : "ces", akv_gguf_type_name(t), binds[first[t]].name);
}

/* The model of an open GGUF, which it takes (closed by akv_model_destroy, or here on failure). */
static akv_status model_load(akv_gguf *g, const akv_model_load_params *params, akv_model **out) {
    akv_model_load_params p = params ? *params : (akv_model_load_params){0};
    akv_model *m = akv__calloc(1, sizeof *m);
    model_bind *binds = NULL;
    float *row = NULL;
    akv_status st = AKV_ENOMEM;
    if (!m) {
        akv_gguf_close(g);
        return AKV_ENOMEM;
    }
    m->gguf = g;
    if (p.weights != AKV_WEIGHTS_NATIVE && p.weights != AKV_WEIGHTS_F32) {
        AKV_LOG_E("model: {=weights} %s: the host model stores its matrices native or f32",
                  akv_weights_name(p.weights));
        st = AKV_EINVAL;
        goto fail;
    }
    if ((st = akv_model_config_read(m->gguf, &m->cfg))) goto fail;
    const akv_model_config *c = &m->cfg;

    st = AKV_ENOMEM;
    m->layers = akv__calloc(c->n_layers, sizeof *m->layers);
    binds = akv__calloc(3 + (size_t)c->n_layers * 16, sizeof *binds); /* at most 16 a layer (model_bind_all) */
    if (!m->layers || !binds) goto fail;
    size_t n_binds = 0;
    if ((st = model_bind_all(m, binds, &n_binds))) goto fail;
    /* a row of the widest bound matrix, for the finite check: sized after the binding, from
     * the shapes the file's tensors were checked against */
    size_t max_cols = 1;
    for (size_t i = 0; i < n_binds; i++)
        if (binds[i].mat && binds[i].cols > max_cols) max_cols = (size_t)binds[i].cols;
    row = akv__calloc(max_cols, sizeof *row);
    if (!row) {
        st = AKV_ENOMEM;
        goto fail;
    }
    if ((st = model_rope(m))) goto fail;
    model_warn_unused(m, binds, n_binds);

    /* Lay the tensors out in one arena, each at a multiple of 64 bytes; n_elems of a bound tensor
     * is at most 2^32 * 2^32 (shape-checked), so the sums below are checked anyway. */
    size_t n_bytes = 0;
    for (size_t i = 0; i < n_binds; i++) {
        size_t sz;
        binds[i].as = model_storage(&binds[i], p.weights);
        binds[i].offset = n_bytes;
        if (!model_bytes(&binds[i], &binds[i].bytes) ||
            !akv__size_add(binds[i].bytes, MODEL_ALIGN - 1, &sz) ||
            !akv__size_add(n_bytes, sz / MODEL_ALIGN * MODEL_ALIGN, &n_bytes)) {
            st = AKV_EOVERFLOW;
            goto fail;
        }
    }
    model_log_widened(binds, n_binds);
    m->arena_bytes = n_bytes;
    m->arena = akv__malloc(n_bytes);
    if (!m->arena) {
        AKV_LOG_E("model: cannot allocate %.1f MiB for the weights", (double)n_bytes / (1 << 20));
        st = AKV_ENOMEM;
        goto fail;
    }

    uint64_t done = 0;
    for (size_t i = 0; i < n_binds; i++) {
        model_bind *b = &binds[i];
        uint8_t *dst = m->arena + b->offset;
        if ((st = model_store(m, b, dst, row))) goto fail;
        if (b->vec) *b->vec = (const float *)(const void *)dst;
        if (b->mat)
            *b->mat = (akv_model_mat){.data = dst,
                                      .type = b->as,
                                      .rows = (uint32_t)b->rows,
                                      .cols = (uint32_t)b->cols,
                                      .row_bytes = akv_ops_wrow_bytes(b->as, (size_t)b->cols)};
        /* a step reads every tensor but the embedding table (one row of it), and reads a
         * tied table as the output head */
        if (i != 0) m->step_bytes += b->bytes; /* binds[0]: token_embd */
        done += b->bytes;
        if (p.progress) p.progress(p.progress_user, done, m->arena_bytes);
    }
    if (c->tied_output) m->step_bytes += binds[0].bytes; /* the table, read as the head */
    akv__free(row);
    akv__free(binds);
    *out = m;
    return AKV_OK;
fail:
    akv__free(row);
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
    akv__free(m->inv_freq_swa);
    akv_gguf_close(m->gguf);
    akv__free(m);
}

const char *akv_weights_name(akv_weights w) {
    switch (w) {
    case AKV_WEIGHTS_NATIVE:
        return "native";
    case AKV_WEIGHTS_BF16:
        return "bf16";
    case AKV_WEIGHTS_F32:
        return "f32";
    }
    return "?";
}

const akv_model_config *akv_model_get_config(const akv_model *m) {
    return &m->cfg;
}

const akv_model_layer *akv_model_get_layer(const akv_model *m, uint32_t layer) {
    AKV_ASSERT(layer < m->cfg.n_layers);
    return &m->layers[layer];
}

const akv_model_mat *akv_model_tok_embd(const akv_model *m) {
    return &m->tok_embd;
}
const float *akv_model_output_norm(const akv_model *m) {
    return m->output_norm;
}
const akv_model_mat *akv_model_output(const akv_model *m) {
    return m->cfg.tied_output ? &m->tok_embd : &m->output;
}

akv_status akv_model_mat_row_f32(const akv_model_mat *w, uint32_t row, float *out) {
    if (!w || !out || row >= w->rows) return AKV_EINVAL;
    const uint8_t *src = (const uint8_t *)w->data + (size_t)row * w->row_bytes;
    if (w->type == AKV_OPS_W_F32) {
        memcpy(out, src, (size_t)w->cols * sizeof(float));
        return AKV_OK;
    }
    return akv_gguf_dequant_f32(model_gguf_type(w->type), src, w->cols, out);
}
const float *akv_model_rope_inv_freq_local(const akv_model *m) {
    return m->inv_freq_swa;
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
size_t akv_model_step_weight_bytes(const akv_model *m) {
    return m->step_bytes;
}
