/* forward_batch.c — the batch rules both forward passes share (model/forward_batch.h). */
#include "model/forward_batch.h"

#include <stddef.h>

#include "core/log.h"

uint32_t akv_forward_batch_logit_rows(const akv_forward_batch *b) {
    uint32_t rows = 0;
    for (uint32_t s = 0; s < b->n_seq; s++) {
        rows += akv_forward_mode_rows(akv_forward_batch_mode(b, s), b->n_new[s]);
    }
    return rows;
}

akv_status akv_forward_batch_check(const akv_forward_batch *b, uint32_t max_step_tokens, uint32_t n_vocab,
                                   const char *who, uint32_t *n_tokens) {
    if (!b || b->n_seq == 0 || !b->n_new || !b->pos0 || !b->tokens) {
        AKV_LOG_E("%s: a step with %s", who,
                  !b ? "no batch" : b->n_seq == 0 ? "no sequence" : "a NULL array");
        return AKV_EINVAL;
    }
    uint64_t n = 0;
    for (uint32_t s = 0; s < b->n_seq; s++) {
        const uint32_t k = b->n_new[s];
        if (k == 0 || (s && k < b->n_new[s - 1])) {
            AKV_LOG_E("%s: sequence %u of the step has %u new tokens (at least 1, and no fewer "
                      "than the sequence before it: the batch is ordered by count)",
                      who, s, k);
            return AKV_EINVAL;
        }
        if ((uint64_t)b->pos0[s] + k > INT32_MAX) {
            AKV_LOG_E("%s: sequence %u's tokens reach position %llu (positions below 2^31)", who,
                      s, (unsigned long long)b->pos0[s] + k);
            return AKV_EINVAL;
        }
        const uint8_t mode = akv_forward_batch_mode(b, s);
        if (mode > AKV_FORWARD_LOGITS_SAMPLE) {
            AKV_LOG_E("%s: sequence %u asks for logits mode %u", who, s, mode);
            return AKV_EINVAL;
        }
        if ((mode == AKV_FORWARD_LOGITS_ARGMAX || mode == AKV_FORWARD_LOGITS_SAMPLE) && !b->chosen) {
            AKV_LOG_E("%s: sequence %u asks for its token, and the batch has no chosen array",
                      who, s);
            return AKV_EINVAL;
        }
        if (mode == AKV_FORWARD_LOGITS_SAMPLE) {
            const akv_fwd_sample_row *r = b->sample ? &b->sample[s] : NULL;
            const char *bad = !r                              ? "the batch has no sample rows"
                              : !(r->temp > 0)                ? "its temperature is not above 0"
                              : !(r->top_p > 0 && r->top_p <= 1) ? "its top_p is outside (0, 1]"
                              : !(r->min_p >= 0 && r->min_p < 1) ? "its min_p is outside [0, 1)"
                              : !(r->u >= 0 && r->u < 1)      ? "its uniform draw is outside [0, 1)"
                              : r->pen_n > AKV_FORWARD_SAMPLE_PEN_MAX ? "it penalises more than "
                                                                       "AKV_FORWARD_SAMPLE_PEN_MAX tokens"
                              : (uint64_t)r->pen_off + r->pen_n > b->n_pen || (r->pen_n && !b->pen)
                                  ? "its penalties lie outside the batch's"
                                  : NULL;
            for (uint32_t j = 0; !bad && j < r->pen_n; j++)
                if (b->pen[r->pen_off + j] < 0 || (uint32_t)b->pen[r->pen_off + j] >= n_vocab ||
                    b->pen[b->n_pen + r->pen_off + j] < 1)
                    bad = "a penalised token is outside the vocabulary or seen no time";
            if (bad) {
                AKV_LOG_E("%s: sequence %u's draw: %s", who, s, bad);
                return AKV_EINVAL;
            }
        }
        n += k;
    }
    if (n > max_step_tokens) {
        AKV_LOG_E("%s: a step of %llu tokens; the pass takes at most %u ({=max_step_tokens})", who,
                  (unsigned long long)n, max_step_tokens);
        return AKV_EINVAL;
    }
    for (uint32_t t = 0; t < n; t++)
        if (b->tokens[t] < 0 || (uint32_t)b->tokens[t] >= n_vocab) {
            AKV_LOG_E("%s: token id %d at row %u of the step is outside the vocabulary [0, %u)",
                      who, b->tokens[t], t, n_vocab);
            return AKV_EINVAL;
        }
    *n_tokens = (uint32_t)n;
    return AKV_OK;
}

uint32_t akv__forward_groups(const akv_forward_batch *b, uint32_t max_decode, akv__fwd_group *out) {
    uint32_t n_groups = 0, row = 0;
    for (uint32_t s = 0; s < b->n_seq;) {
        akv__fwd_group *g = &out[n_groups++];
        g->s0 = s, g->row0 = row, g->n_rows = 0, g->n_new = 0;
        g->decode = b->n_new[s] <= max_decode;
        uint32_t e = s;
        for (; e < b->n_seq && (!g->decode || b->n_new[e] == b->n_new[s]); e++) {
            g->n_rows += b->n_new[e];
            if (b->n_new[e] > g->n_new) g->n_new = b->n_new[e];
        }
        g->s1 = e;
        row += g->n_rows;
        s = e;
    }
    return n_groups;
}

akv_status akv__forward_parts_check(const akv_model_config *c, const char *who, uint32_t layer,
                                    const akv_kv_parts *parts, uint32_t n_seq, uint32_t n_rows,
                                    uint32_t max_parts) {
    if (parts->n_parts < 1 || parts->n_parts > max_parts ||
        parts->part[0].kv.repr != AKV_REPR_EXACT || parts->part[0].kv.past) {
        AKV_LOG_E("%s: layer %u: %u part(s), the first of representation %s%s; the pass attends "
                  "an exact part of the queries' own history%s",
                  who, layer, parts->n_parts, akv_repr_name((akv_repr)parts->part[0].kv.repr),
                  parts->part[0].kv.past ? " (past)" : "",
                  max_parts > 1 ? " and past parts of older history" : " only");
        return AKV_EUNSUPPORTED;
    }
    if (parts->host_o.addr && (!parts->host_lse.addr || !parts->host_tokens || n_rows != n_seq)) {
        AKV_LOG_E("%s: layer %u: a host part's states %s; they come a row a sequence, in a step "
                  "of one new token each (this one: %u rows, %u sequences)",
                  who, layer,
                  !parts->host_lse.addr  ? "without their log-sum-exp"
                  : !parts->host_tokens ? "without their token counts"
                                         : "for a step of several rows a sequence",
                  n_rows, n_seq);
        return AKV_EINVAL;
    }
    for (uint32_t i = 0; i < parts->n_parts; i++) {
        const akv_attn_pages *pg = &parts->part[i].kv;
        if (i > 0 && !pg->past) {
            AKV_LOG_E("%s: layer %u: part %u is not of older history (past); only the first "
                      "holds the queries",
                      who, layer, i);
            return AKV_EUNSUPPORTED;
        }
        if (pg->n_seq == n_seq && pg->n_kv_heads == c->n_kv_heads && pg->head_dim == c->head_dim &&
            pg->indptr.addr && pg->last_page_len.addr)
            continue;
        AKV_LOG_E("%s: layer %u: part %u's page table holds %u sequence(s), %u K/V heads of %u; "
                  "expected %u sequence(s), %u heads of %u",
                  who, layer, i, pg->n_seq, pg->n_kv_heads, pg->head_dim, n_seq, c->n_kv_heads,
                  c->head_dim);
        return AKV_EINVAL;
    }
    return AKV_OK;
}

akv_attn_pages akv__forward_view(const akv_attn_pages *pg, const akv__fwd_group *g) {
    akv_attn_pages v = *pg;
    v.indptr = akv_dptr_offset(pg->indptr, (size_t)g->s0 * sizeof(int32_t));
    v.last_page_len = akv_dptr_offset(pg->last_page_len, (size_t)g->s0 * sizeof(int32_t));
    v.n_seq = g->s1 - g->s0;
    return v;
}
