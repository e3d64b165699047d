/*
 * core/assert.h — invariants inside the library.
 *
 * AKV_ASSERT is for programmer errors only (a broken invariant, a NULL where the contract
 * forbids it). It is always on, in every build type: a memory layer that continues past a
 * broken invariant corrupts someone's history silently. It prints file, line and the
 * expression to stderr and aborts. Errors a caller can cause are statuses, never asserts.
 */
#ifndef AKV_CORE_ASSERT_H
#define AKV_CORE_ASSERT_H

#ifdef __GNUC__
#define AKV_NORETURN __attribute__((noreturn))
#define AKV_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define AKV_LIKELY(x) __builtin_expect(!!(x), 1)
#else
#define AKV_NORETURN
#define AKV_PRINTF(a, b)
#define AKV_LIKELY(x) (x)
#endif

AKV_NORETURN void akv__assert_fail(const char *file, int line, const char *expr);

#define AKV_ASSERT(e) (AKV_LIKELY(e) ? (void)0 : akv__assert_fail(__FILE__, __LINE__, #e))

#define AKV_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
