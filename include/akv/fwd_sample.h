/*
 * akv/fwd_sample.h — sampling a row of logits where the logits are (the "fwd_sample" op of
 * akv/forward_ops.h): the row's parameters, and the arithmetic both backends share, written
 * once here (C and CUDA include it; AKV_SAMPLE_FN makes the functions host-and-device there).
 *
 * The law is the host sampler's (akv/sample.h), stage for stage: the penalties over the
 * distinct recent tokens with their counts; temp 0 = the first largest logit; else the
 * candidates (finite logits) in the order logit descending, id ascending; top-k, the first k;
 * weights w = exp((logit - max) / temp) (all the mass on the +inf logits where there are any);
 * top-p, the shortest prefix whose weight reaches top_p of the kept weight; min-p, the prefix
 * with w >= min_p (w of the first is 1); one uniform u from the request's own generator.
 * Two things differ, neither in law: the weights are counted in fixed point (2^40 for the
 * largest; a token below 2^-40 of the most likely has no chance here, against less than 1e-12
 * there), so sums are exact and the choice reproducible whatever order a device adds in; and
 * the draw walks the kept tokens by id, not by weight, so the same u picks another token of
 * the same distribution. Every filter keeps a prefix of the order, so what is kept is always
 * "at or before a pivot": (key, id) with key > K, or key == K and id <= I.
 */
#ifndef AKV_FWD_SAMPLE_H
#define AKV_FWD_SAMPLE_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef AKV_SAMPLE_FN
#define AKV_SAMPLE_FN static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* One row's sampling: what akv_sample_params holds, the penalties' tokens (pen_n distinct ids
 * from pen_off in the op's id and count arrays) and the uniform draw. temp < 0: the row is
 * not sampled (its entry of y is left as it is). */
typedef struct akv_fwd_sample_row {
    float temp, top_p, min_p;
    float repeat_penalty, presence_penalty, frequency_penalty;
    int32_t top_k;
    uint32_t pen_off, pen_n;
    uint32_t pad_;
    double u; /* uniform in [0, 1) */
} akv_fwd_sample_row;

/* The scale of the fixed-point weights: the largest weight (1) is 2^40. */
#define AKV_SAMPLE_W_ONE 1099511627776.0

/* A logit's place in the order: larger keys come first; 0 = never a candidate (NaN, -inf). */
AKV_SAMPLE_FN uint32_t akv_sample_key(float v) {
    if (v != v || v == -INFINITY) return 0;
    if (v == 0.0f) v = 0.0f; /* -0 is +0's equal (the host sampler's order: then by id) */
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* The logit of a key (the inverse of akv_sample_key for keys > 0). */
AKV_SAMPLE_FN float akv_sample_key_value(uint32_t k) {
    uint32_t b = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
    float v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* A logit after the penalties for a token seen `count` times (akv/sample.h, stage 1). */
AKV_SAMPLE_FN float akv_sample_penalise(const akv_fwd_sample_row *r, float v0, uint32_t count) {
    float v = v0;
    if (r->repeat_penalty != 1.0f) v = v > 0 ? v / r->repeat_penalty : v * r->repeat_penalty;
    if (r->presence_penalty != 0.0f || r->frequency_penalty != 0.0f)
        v = (float)((double)v - r->presence_penalty - (double)count * r->frequency_penalty);
    if ((v == INFINITY || v == -INFINITY) && v0 == v0 && v0 != INFINITY && v0 != -INFINITY)
        v = v > 0 ? FLT_MAX : -FLT_MAX; /* a finite logit stays finite */
    return v;
}

/* A candidate's weight against the largest logit mx (temp > 0): exp((v - mx) / temp) in
 * float, in [0, 1]; with mx = +inf, 1 for the +inf logits and 0 for the rest. */
AKV_SAMPLE_FN float akv_sample_weight(float v, float mx, float temp) {
    if (mx == INFINITY) return v == INFINITY ? 1.0f : 0.0f;
    return expf((v - mx) / temp);
}

/* That weight in fixed point. */
AKV_SAMPLE_FN uint64_t akv_sample_wfx(float w) {
    return (uint64_t)((double)w * AKV_SAMPLE_W_ONE);
}

/* The draw's target: the first kept token (by id) whose running weight exceeds it is chosen. */
AKV_SAMPLE_FN uint64_t akv_sample_target(double u, uint64_t total) {
    uint64_t t = (uint64_t)(u * (double)total);
    return t < total ? t : total - 1;
}

#ifdef __cplusplus
}
#endif
#endif /* AKV_FWD_SAMPLE_H */
