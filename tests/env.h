/*
 * tests/env.h — an integer setting from the environment, for tests and benchmarks only
 * (the library reads no environment variable; its settings are params): the value of `name`
 * when it is a decimal integer in lo..hi, else dflt (unset, empty, malformed or out of
 * range).
 */
#ifndef AKV_TESTS_ENV_H
#define AKV_TESTS_ENV_H

#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline int akv_test_env_int(const char *name, int lo, int hi, int dflt) {
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    char *end;
    long v = strtol(e, &end, 10);
    return *end == '\0' && v >= lo && v <= hi ? (int)v : dflt;
}

#ifdef __cplusplus
}
#endif
#endif
