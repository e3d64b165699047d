/*
 * stage_probe.c — the host implementation of the "stage_probe" op (akv/testing/stage_probe.h); the
 * CUDA one is cuda/stage_probe.cu. Both write the new rows, then sum every row the sequence
 * should see, in the same order-free way, and count mismatches in device memory.
 */
#include "akv/testing/stage_probe.h"

#include <string.h>

#include "dev/dev_op.h"

static akv_status probe_host(akv_dev *dev, const void *args) {
    const akv_stage_probe_args *a = args;
    const uint32_t H = a->n_kv_heads, D = a->head_dim, P = a->page_tokens, n_e = 2 * H * D;
    const size_t page_elems = (size_t)n_e * P;
    uint16_t *base = akv__dev_host_addr(dev, a->base);
    uint64_t *result = akv__dev_host_addr(dev, a->result);
    for (uint32_t s = 0; s < a->n_seq; s++) {
        const akv_stage_probe_seq *q = &a->seq[s];
        for (uint32_t t = q->new_token0; t < q->new_token0 + q->n_new; t++) {
            uint16_t *pg = base + (size_t)q->page_ids[t / P] * page_elems;
            for (uint32_t e = 0; e < n_e; e++)
                pg[akv_stage_probe_at(D, P, t, e)] = akv_stage_probe_value(q->seed, t, e);
        }
        uint64_t sum = 0;
        for (uint32_t t = 0; t < q->n_tokens; t++) {
            const uint16_t *pg = base + (size_t)q->page_ids[t / P] * page_elems;
            for (uint32_t e = 0; e < n_e; e++)
                sum += akv_stage_probe_term(t, e, pg[akv_stage_probe_at(D, P, t, e)]);
        }
        if (sum != q->expected) {
            result[0]++;
            result[2] = sum;
            result[3] = q->expected;
        }
        result[1]++;
    }
    return AKV_OK;
}

const akv_dev_op akv_stage_probe_op = {
    .name = "stage_probe",
    .args_bytes = sizeof(akv_stage_probe_args),
    .host = probe_host,
};
