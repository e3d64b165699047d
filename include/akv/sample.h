/*
 * akv/sample.h — choosing the next token from a step's logits.
 *
 * The chain, in this order (each stage optional):
 *   1. penalties over the last `repeat_last_n` accepted tokens (prompt and generated), each
 *      distinct token t seen c times there: the repetition penalty divides a positive logit
 *      and multiplies a negative one (CTRL-style, as llama.cpp does), then the logit loses
 *      presence_penalty + c * frequency_penalty (OpenAI's penalties, as llama.cpp applies
 *      them); a finite logit stays finite;
 *   2. temp == 0: greedy — the largest logit, ties to the smaller id; stop;
 *   3. top-k: keep the k largest logits;
 *   4. temperature: logits / temp, then softmax (in double, max subtracted);
 *   5. top-p: keep the smallest prefix (by probability, descending) whose mass >= top_p;
 *   6. min-p: drop tokens whose probability < min_p * (largest probability);
 *   7. renormalise and draw with the sampler's own seeded generator.
 * Candidates are ordered by logit descending, ties by id ascending, so a seed and the logits
 * determine the token exactly.
 *
 * Thread-safety: a sampler is used by one thread at a time.
 */
#ifndef AKV_SAMPLE_H
#define AKV_SAMPLE_H

#include <stdint.h>

#include "akv/fwd_sample.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_sample_params {
    float temp;             /* temperature; 0 = greedy */
    int32_t top_k;          /* keep the k most likely; 0 = off */
    float top_p;            /* nucleus mass in (0, 1]; 1 = off */
    float min_p;            /* in [0, 1); 0 = off */
    float repeat_penalty;   /* >= 1 typical; 1 = off */
    float presence_penalty; /* subtracted once from each token seen; 0 = off (finite) */
    float frequency_penalty; /* subtracted per time a token was seen; 0 = off (finite) */
    int32_t repeat_last_n;  /* tokens the penalties look back over; 0 = off, -1 = all accepted */
    uint64_t seed;          /* generator seed */
} akv_sample_params;

typedef struct akv_sampler akv_sampler;

/* Defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0 (off),
 * repeat_last_n 64, seed 0. */
akv_sample_params akv_sample_default_params(void);

/* AKV_EINVAL (logged, naming the field) for a negative temp, top_p outside (0,1], min_p
 * outside [0,1), repeat_penalty <= 0, a non-finite presence or frequency penalty, top_k < 0,
 * n_vocab < 1. */
akv_status akv_sampler_create(const akv_sample_params *params, int32_t n_vocab, akv_sampler **out);
void akv_sampler_destroy(akv_sampler *s);

/* Records a token as part of the history the repetition penalty looks at (prompt tokens and
 * every chosen token). AKV_EINVAL for an id outside [0, n_vocab). */
akv_status akv_sampler_accept(akv_sampler *s, int32_t token);

/* Chooses a token from logits[n_vocab] (not modified). NaN and -inf logits are never chosen;
 * +inf logits, where there are any, share all the probability evenly (the limit of softmax);
 * the repetition penalty keeps a finite logit finite (saturating at ±FLT_MAX). AKV_EINVAL if
 * every logit is NaN or -inf (nothing can be chosen), logged. Does not accept the token: call
 * akv_sampler_accept. */
akv_status akv_sampler_sample(akv_sampler *s, const float *logits, int32_t *out_token);

/* The next draw made where the logits are (a pass's AKV_FORWARD_LOGITS_SAMPLE rows,
 * akv/fwd_sample.h: this sampler's law, its token a function of the same uniform): the
 * parameters into *row, the distinct tokens of the penalties' history with their counts into
 * ids and counts (row->pen_n of them, pen_off 0), and the next uniform of the sampler's
 * generator, not yet spent: akv_sampler_draw_done spends it once the draw was made (a step
 * that failed draws the same u again). AKV_EINVAL for a greedy sampler (temp 0: the pass's
 * argmax is its choice); AKV_EFULL when the history holds more than cap distinct tokens. */
akv_status akv_sampler_draw_row(akv_sampler *s, akv_fwd_sample_row *row, int32_t *ids,
                                int32_t *counts, uint32_t cap);
/* Spends the uniform of the last akv_sampler_draw_row, as a sample here spends one. */
void akv_sampler_draw_done(akv_sampler *s);

#ifdef __cplusplus
}
#endif
#endif
