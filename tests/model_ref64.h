/*
 * tests/model_ref64.h — the forward pass in float64, written out plainly from the model's
 * weights (each row as akv_model_mat_row_f32 decodes it): the oracle of the forward-pass
 * tests. Recomputes a whole sequence from scratch
 * (no K/V cache), so it shares nothing with the paged path but the weights.
 *
 * ref64_forward(model, tokens, n, n_layers, hidden, logits): runs tokens[0..n) through the
 * first n_layers layers; hidden (optional) receives the residual stream after them,
 * [n][n_embd]; logits (optional) the last position's [n_vocab] after the output norm.
 */
#ifndef AKV_TEST_MODEL_REF64_H
#define AKV_TEST_MODEL_REF64_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "akv/model.h"

static inline void ref64_rmsnorm(double *y, const double *x, const float *w, size_t n, double eps) {
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double s = 1 / sqrt(ss / (double)n + eps);
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] * s * w[i];
}

/* y[rows] = W[rows][cols] x (+ b) */
static inline void ref64_matvec(double *y, const akv_model_mat *w, const float *b, const double *x,
                                size_t rows, size_t cols) {
    float *row = malloc(cols * sizeof *row);
    for (size_t r = 0; r < rows; r++) {
        double s = b ? b[r] : 0;
        if (akv_model_mat_row_f32(w, (uint32_t)r, row) != AKV_OK) abort();
        for (size_t c = 0; c < cols; c++)
            s += (double)row[c] * x[c];
        y[r] = s;
    }
    free(row);
}

static inline void ref64_rope(double *v, const akv_model_config *c, const float *inv_freq,
                              size_t n_heads, size_t pos) {
    for (size_t h = 0; h < n_heads; h++) {
        double *x = v + h * c->head_dim;
        for (uint32_t i = 0; i < c->n_rot / 2; i++) {
            size_t a = c->rope_mode == AKV_ROPE_NEOX ? i : 2 * i;
            size_t b = c->rope_mode == AKV_ROPE_NEOX ? i + c->n_rot / 2 : 2 * i + 1;
            double ang = (double)pos * inv_freq[i], x0 = x[a], x1 = x[b];
            x[a] = x0 * cos(ang) - x1 * sin(ang);
            x[b] = x0 * sin(ang) + x1 * cos(ang);
        }
    }
}

static inline void ref64_forward(const akv_model *m, const int32_t *tokens, size_t n,
                                 uint32_t n_layers, double *hidden, double *logits) {
    const akv_model_config *c = akv_model_get_config(m);
    size_t E = c->n_embd, hd = c->head_dim, H = c->n_heads, KV = c->n_kv_heads, F = c->n_ff;
    size_t qd = H * hd, kd = KV * hd, group = H / KV;
    double *x = calloc(n * E, 8), *h = calloc(E, 8), *q = calloc(n * qd, 8), *k = calloc(n * kd, 8),
           *v = calloc(n * kd, 8), *att = calloc(qd, 8), *o = calloc(E, 8), *g = calloc(F, 8),
           *u = calloc(F, 8), *sc = calloc(n, 8);
    float *erow = malloc(E * sizeof *erow);
    for (size_t t = 0; t < n; t++) {
        if (akv_model_mat_row_f32(akv_model_tok_embd(m), (uint32_t)tokens[t], erow) != AKV_OK) abort();
        for (size_t i = 0; i < E; i++)
            x[t * E + i] = (double)erow[i] * c->embd_scale;
    }
    free(erow);
    for (uint32_t l = 0; l < n_layers; l++) {
        const akv_model_layer *L = akv_model_get_layer(m, l);
        /* a local layer's frequencies from its own base (scale 1, no factors), computed here
         * rather than taken from the model */
        float inv_swa[128];
        for (uint32_t i = 0; i < c->n_rot / 2 && i < 128; i++)
            inv_swa[i] = (float)pow(c->rope_base_swa, -2.0 * i / c->n_rot);
        const float *inv = akv_model_layer_is_swa(c, l) ? inv_swa : akv_model_rope_inv_freq(m);
        const size_t window = akv_model_layer_is_swa(c, l) ? c->n_swa : 0;
        const double scale = c->attn_scale != 0.0f ? c->attn_scale : 1.0 / sqrt((double)hd);
        for (size_t t = 0; t < n; t++) {
            ref64_rmsnorm(h, x + t * E, L->attn_norm, E, c->rms_eps);
            ref64_matvec(q + t * qd, &L->wq, L->bq, h, qd, E);
            ref64_matvec(k + t * kd, &L->wk, L->bk, h, kd, E);
            ref64_matvec(v + t * kd, &L->wv, L->bv, h, kd, E);
            for (size_t j = 0; L->q_norm && j < H + KV; j++) { /* qwen3: each head, before RoPE */
                double *hv = j < H ? q + t * qd + j * hd : k + t * kd + (j - H) * hd;
                ref64_rmsnorm(hv, hv, j < H ? L->q_norm : L->k_norm, hd, c->rms_eps);
            }
            ref64_rope(q + t * qd, c, inv, H, t);
            ref64_rope(k + t * kd, c, inv, KV, t);
        }
        for (size_t t = 0; t < n; t++) {
            /* causal attention of token t over s0..t (a local layer: its window's newest keys),
             * query head j on K/V head j / group */
            const size_t s0 = window && t + 1 > window ? t + 1 - window : 0;
            for (size_t j = 0; j < H; j++) {
                size_t kh = j / group;
                double mx = -INFINITY, sum = 0;
                for (size_t s = s0; s <= t; s++) {
                    double d = 0;
                    for (size_t i = 0; i < hd; i++)
                        d += q[t * qd + j * hd + i] * k[s * kd + kh * hd + i];
                    sc[s] = d * scale;
                    mx = fmax(mx, sc[s]);
                }
                for (size_t s = s0; s <= t; s++)
                    sum += sc[s] = exp(sc[s] - mx);
                for (size_t i = 0; i < hd; i++) {
                    double a = 0;
                    for (size_t s = s0; s <= t; s++)
                        a += sc[s] * v[s * kd + kh * hd + i];
                    att[j * hd + i] = a / sum;
                }
            }
            ref64_matvec(o, &L->wo, NULL, att, E, qd);
            if (L->attn_post_norm) ref64_rmsnorm(o, o, L->attn_post_norm, E, c->rms_eps);
            for (size_t i = 0; i < E; i++)
                x[t * E + i] += o[i];
            ref64_rmsnorm(h, x + t * E, L->ffn_norm, E, c->rms_eps);
            ref64_matvec(g, &L->w_gate, NULL, h, F, E);
            ref64_matvec(u, &L->w_up, NULL, h, F, E);
            for (size_t i = 0; i < F; i++)
                g[i] = c->ffn_act == AKV_FFN_GEGLU
                           ? 0.5 * g[i] * (1 + tanh(sqrt(2 / acos(-1.0)) * g[i] * (1 + 0.044715 * g[i] * g[i]))) * u[i]
                           : g[i] / (1 + exp(-g[i])) * u[i];
            ref64_matvec(o, &L->w_down, NULL, g, E, F);
            if (L->ffn_post_norm) ref64_rmsnorm(o, o, L->ffn_post_norm, E, c->rms_eps);
            for (size_t i = 0; i < E; i++)
                x[t * E + i] += o[i];
        }
    }
    if (hidden) memcpy(hidden, x, n * E * 8);
    if (logits) {
        ref64_rmsnorm(h, x + (n - 1) * E, akv_model_output_norm(m), E, c->rms_eps);
        ref64_matvec(logits, akv_model_output(m), NULL, h, c->n_vocab, E);
    }
    free(x), free(h), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(sc);
}

#endif
