/* alloc.c — host allocation wrapper with "fail the Nth allocation" injection. */
#define _POSIX_C_SOURCE 200809L
#include "core/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_uint_fast64_t alloc_n_calls;
static atomic_int_fast64_t alloc_n_live;
static atomic_uint_fast64_t alloc_fail_at; /* absolute call number to fail; 0 = never */
static atomic_bool alloc_fired;

/* Counts one attempt; true when this attempt is the one to fail. */
static bool alloc_should_fail(void) {
    uint64_t call = atomic_fetch_add(&alloc_n_calls, 1) + 1;
    uint64_t at = atomic_load(&alloc_fail_at);
    if (at != 0 && call == at) {
        atomic_store(&alloc_fail_at, 0);
        atomic_store(&alloc_fired, true);
        return true;
    }
    return false;
}

void *akv__malloc(size_t n_bytes) {
    if (n_bytes == 0 || alloc_should_fail()) return NULL;
    void *p = malloc(n_bytes);
    if (p) atomic_fetch_add(&alloc_n_live, 1);
    return p;
}

void *akv__calloc(size_t count, size_t elem_bytes) {
    size_t n;
    if (!akv__size_mul(count, elem_bytes, &n) || n == 0 || alloc_should_fail()) return NULL;
    void *p = calloc(count, elem_bytes);
    if (p) atomic_fetch_add(&alloc_n_live, 1);
    return p;
}

void *akv__realloc(void *p, size_t n_bytes) {
    if (!p) return akv__malloc(n_bytes);
    if (n_bytes == 0 || alloc_should_fail()) return NULL;
    return realloc(p, n_bytes);
}

void akv__free(void *p) {
    if (!p) return;
    atomic_fetch_sub(&alloc_n_live, 1);
    free(p);
}

char *akv__strndup(const char *s, size_t n) {
    size_t len = strnlen(s, n);
    char *d = akv__malloc(len + 1);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *akv__strdup(const char *s) {
    return akv__strndup(s, SIZE_MAX);
}

akv_status akv__array_reserve(void **p, size_t *cap, size_t need, size_t elem_bytes) {
    if (need <= *cap) return AKV_OK;
    size_t n_new = *cap ? *cap : 8;
    while (n_new < need) {
        if (!akv__size_mul(n_new, 2, &n_new)) return AKV_EOVERFLOW;
    }
    size_t n_bytes, old_bytes = *cap * elem_bytes;
    if (!akv__size_mul(n_new, elem_bytes, &n_bytes)) return AKV_EOVERFLOW;
    void *q = akv__realloc(*p, n_bytes);
    if (!q) return AKV_ENOMEM;
    memset((char *)q + old_bytes, 0, n_bytes - old_bytes);
    *p = q;
    *cap = n_new;
    return AKV_OK;
}

void akv__alloc_fail_nth(uint64_t n) {
    atomic_store(&alloc_fired, false);
    atomic_store(&alloc_fail_at, n ? atomic_load(&alloc_n_calls) + n : 0);
}

bool akv__alloc_failure_fired(void) {
    return atomic_load(&alloc_fired);
}

uint64_t akv__alloc_calls(void) {
    return atomic_load(&alloc_n_calls);
}

int64_t akv__alloc_live(void) {
    return atomic_load(&alloc_n_live);
}
