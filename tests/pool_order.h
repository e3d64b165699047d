/*
 * tests/pool_order.h — the order today's routes give the device pool with each step request
 * (akv/dev_pool.h: the newest page and the sink are the floor, then the rest newest first),
 * for the tests that step a pool directly. The orders live in one static buffer, overwritten
 * by the next call: give every request of a step its order in one call, just before the step.
 */
#ifndef AKV_TEST_POOL_ORDER_H
#define AKV_TEST_POOL_ORDER_H

#include <stdint.h>

#include "akv/dev_pool.h"

enum { POOL_ORDER_MAX = 1 << 20 }; /* logical pages of every request of one step together */
static uint32_t pool_order_buf[POOL_ORDER_MAX];

/* Fills order, n_order and n_floor of reqs[0..n) for their n_tokens (a request whose page
 * count is 0 or does not fit the buffer gets none: the pool refuses it on its own). */
static inline void pool_orders(const akv_geom *g, akv_dev_pool_req *reqs, uint32_t n) {
    uint64_t used = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t n_lp = akv_geom_pages_for_tokens(g, reqs[i].n_tokens);
        reqs[i].order = NULL, reqs[i].n_order = 0, reqs[i].n_floor = 0;
        if (n_lp == 0 || used + n_lp > POOL_ORDER_MAX) continue;
        uint32_t *o = pool_order_buf + used, k = 0;
        o[k++] = (uint32_t)n_lp - 1;
        if (n_lp > 1) o[k++] = 0;
        for (uint32_t lp = (uint32_t)n_lp - 1; lp-- > 1;) o[k++] = lp;
        reqs[i].order = o, reqs[i].n_order = k, reqs[i].n_floor = n_lp > 1 ? 2 : 1;
        used += n_lp;
    }
}

#endif
