/*
 * tests/alloc_settled.h — the live-allocation count once the host backend has let go: its
 * queue workers are detached at akv_dev_destroy (destroy never waits) and the last one frees
 * the device state a moment later. Polls up to 2 s for the count to reach zero.
 */
#ifndef AKV_TESTS_ALLOC_SETTLED_H
#define AKV_TESTS_ALLOC_SETTLED_H

#include <time.h>

#include "core/alloc.h"

static inline int64_t test_alloc_live_settled(void) {
    for (int i = 0; i < 2000 && akv__alloc_live() != 0; i++)
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    return akv__alloc_live();
}

#endif
