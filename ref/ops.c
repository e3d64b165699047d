/* ops.c — the dense ops of akv/ops.h (everything but matrix products and attention). */
#include "akv/ops.h"

#include <math.h>

#include "core/log.h"

void akv_ops_ref_rmsnorm(float *y, const float *x, const float *w, size_t n_rows, size_t n,
                         float eps) {
    AKV_ASSERT(n > 0);
    for (size_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double ss = 0;
        for (size_t i = 0; i < n; i++)
            ss += (double)xr[i] * xr[i];
        float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (size_t i = 0; i < n; i++)
            yr[i] = xr[i] * scale * w[i];
    }
}

akv_status akv_ops_ref_rope_freqs(double base, uint32_t n_rot, double freq_scale,
                                  const float *factors, float *inv_freq) {
    if (n_rot == 0 || n_rot % 2) {
        AKV_LOG_E("rope: n_rot %u must be even and > 0", n_rot);
        return AKV_EINVAL;
    }
    if (!(base > 1) || isinf(base)) {
        AKV_LOG_E("rope: base %g must be finite and > 1", base);
        return AKV_EINVAL;
    }
    if (!(freq_scale > 0) || isinf(freq_scale)) {
        AKV_LOG_E("rope: freq_scale %g must be finite and > 0", freq_scale);
        return AKV_EINVAL;
    }
    for (uint32_t i = 0; factors && i < n_rot / 2; i++) {
        if (!(factors[i] > 0) || isinf(factors[i])) {
            AKV_LOG_E("rope: frequency factor [%u] = %g must be finite and > 0", i,
                      (double)factors[i]);
            return AKV_EINVAL;
        }
    }
    for (uint32_t i = 0; i < n_rot / 2; i++) {
        double f = freq_scale * pow(base, -2.0 * i / (double)n_rot);
        if (factors) f /= factors[i];
        inv_freq[i] = (float)f;
    }
    return AKV_OK;
}

void akv_ops_ref_rope_table(const int32_t *pos, size_t n_tokens, const float *inv_freq,
                            uint32_t n_rot, float *cos_t, float *sin_t) {
    size_t n_pairs = n_rot / 2;
    for (size_t t = 0; t < n_tokens; t++) {
        for (size_t i = 0; i < n_pairs; i++) {
            double a = (double)pos[t] * inv_freq[i];
            cos_t[t * n_pairs + i] = (float)cos(a);
            sin_t[t * n_pairs + i] = (float)sin(a);
        }
    }
}

void akv_ops_ref_rope(float *x, size_t n_tokens, uint32_t n_heads, uint32_t head_dim,
                      uint32_t n_rot, akv_rope_mode mode, const float *cos_t, const float *sin_t) {
    AKV_ASSERT(n_rot % 2 == 0 && n_rot <= head_dim);
    size_t n_pairs = n_rot / 2;
    /* NORMAL: pair i is (2i, 2i+1); NEOX: pair i is (i, i + n_rot/2). */
    size_t stride = mode == AKV_ROPE_NEOX ? 1 : 2, other = mode == AKV_ROPE_NEOX ? n_pairs : 1;
    for (size_t t = 0; t < n_tokens; t++) {
        const float *c = cos_t + t * n_pairs, *s = sin_t + t * n_pairs;
        for (uint32_t h = 0; h < n_heads; h++) {
            float *v = x + (t * n_heads + h) * head_dim;
            for (size_t i = 0; i < n_pairs; i++) {
                float a = v[i * stride], b = v[i * stride + other];
                v[i * stride] = a * c[i] - b * s[i];
                v[i * stride + other] = a * s[i] + b * c[i];
            }
        }
    }
}

void akv_ops_ref_swiglu(float *y, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void akv_ops_ref_geglu(float *y, const float *gate, const float *up, size_t n) {
    const float c = 0.79788456080286535587989211986876f; /* sqrt(2 / pi) */
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i];
        y[i] = 0.5f * g * (1.0f + tanhf(c * g * (1.0f + 0.044715f * g * g))) * up[i];
    }
}

akv_status akv_ops_ref_embed(float *y, const float *table, size_t n_vocab, size_t n_embd,
                             const int32_t *ids, size_t n_ids) {
    for (size_t t = 0; t < n_ids; t++) {
        if (ids[t] < 0 || (size_t)ids[t] >= n_vocab) {
            AKV_LOG_E("embed: token id %d at position %zu is outside the vocabulary [0, %zu)",
                      ids[t], t, n_vocab);
            return AKV_EINVAL;
        }
    }
    for (size_t t = 0; t < n_ids; t++)
        for (size_t i = 0; i < n_embd; i++)
            y[t * n_embd + i] = table[(size_t)ids[t] * n_embd + i];
    return AKV_OK;
}

void akv_ops_ref_softmax(float *x, size_t n_rows, size_t n) {
    for (size_t r = 0; r < n_rows; r++) {
        float *v = x + r * n;
        float mx = -INFINITY;
        for (size_t i = 0; i < n; i++)
            mx = v[i] > mx ? v[i] : mx;
        if (mx == -INFINITY) { /* nothing to attend to: an empty distribution, not NaN */
            for (size_t i = 0; i < n; i++)
                v[i] = 0;
            continue;
        }
        double sum = 0;
        for (size_t i = 0; i < n; i++) {
            v[i] = expf(v[i] - mx);
            sum += v[i];
        }
        float inv = (float)(1.0 / sum);
        for (size_t i = 0; i < n; i++)
            v[i] *= inv;
    }
}

void akv_ops_ref_add(float *y, const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] += a[i];
}
