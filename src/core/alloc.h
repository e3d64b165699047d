/*
 * core/alloc.h — every host allocation of the library goes through here.
 *
 * Why: tests must be able to fail the Nth allocation and prove that each failure leaves
 * a clean error and unchanged state (docs/style.md, "Ownership"). Pinned and device memory are
 * not here: they go through dev.h.
 *
 * Fault injection: akv__alloc_fail_nth(n) makes the n-th allocation from now (1-based)
 * return NULL, once; 0 disarms it. Counters are atomic; injection is process-wide, so a
 * test that uses it must not run allocating threads of its own at the same time unless
 * it wants them to take the failure.
 */
#ifndef AKV_CORE_ALLOC_H
#define AKV_CORE_ALLOC_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "akv/status.h"

void *akv__malloc(size_t n_bytes);                  /* NULL on failure or n_bytes == 0 */
void *akv__calloc(size_t count, size_t elem_bytes); /* zeroed; NULL on overflow too */
void *akv__realloc(void *p, size_t n_bytes);        /* NULL on failure; p then still valid */
void akv__free(void *p);                            /* NULL is a no-op */
char *akv__strdup(const char *s);
char *akv__strndup(const char *s, size_t n);

/* Grow *p (an array of elem_bytes elements with capacity *cap) to hold at least `need`
 * elements, doubling. On failure *p and *cap are unchanged. New elements are zeroed. */
akv_status akv__array_reserve(void **p, size_t *cap, size_t need, size_t elem_bytes);

/* Fault injection and accounting (tests). */
void akv__alloc_fail_nth(uint64_t n);  /* 0 disarms */
bool akv__alloc_failure_fired(void);   /* whether the armed failure has happened */
uint64_t akv__alloc_calls(void);       /* allocation attempts since start */
int64_t akv__alloc_live(void);         /* successful allocations not yet freed */

/* Overflow-checked size arithmetic: false (and *out untouched) on overflow. */
static inline bool akv__size_mul(size_t a, size_t b, size_t *out) {
    size_t r;
    if (__builtin_mul_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}
static inline bool akv__size_add(size_t a, size_t b, size_t *out) {
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

#endif
