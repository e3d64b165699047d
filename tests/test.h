/*
 * tests/test.h — the test harness: named checks that print both values, array comparison
 * that prints the worst element, and an explicit skip.
 *
 * Use:
 *     int main(int argc, char **argv) {
 *         test_args(argc, argv);
 *         TEST_CASE(pool_grows) { ... CHECK_EQ_INT(a, b); ... }
 *         return test_finish();
 *     }
 * `test_x --case NAME` (repeatable) runs only the cases named, `--list` prints every case's
 * name without running any. A case must not rely on an earlier case having run (shared set-up
 * goes before the cases, outside them).
 * A failed CHECK prints file:line, the expression and both values, and marks the case
 * failed; the case goes on (checks are loud, not fatal): guard what would crash with an
 * `if (!CHECK(...)) break;` inside the case block.
 * test_skip() exits 77 at once (CTest's SKIP_RETURN_CODE) with the reason.
 */
#ifndef AKV_TEST_H
#define AKV_TEST_H

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <execinfo.h>
#endif

static int test_n_failed_checks;
static int test_n_checks;
static int test_n_cases;
static int test_n_failed_cases;
static int test_case_failed;
static const char *test_case_name = "(none)";
enum { TEST_MAX_PICKED = 64 };
static const char *test_picked[TEST_MAX_PICKED]; /* --case names; none = every case */
static int test_n_picked, test_picked_ran[TEST_MAX_PICKED], test_listing;

/* A crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT: a failed AKV_ASSERT) names the case it
 * happened in and, with glibc, prints the stack (addresses for addr2line where symbols are
 * static) before dying of it. */
static inline void test_on_crash(int sig) {
    fprintf(stderr, "\ncrashed (signal %d) in case %s\n", sig, test_case_name ? test_case_name : "(none)");
    fflush(stderr);
#ifdef __GLIBC__
    void *frames[64];
    backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
#endif
    signal(sig, SIG_DFL);
    raise(sig);
}

#if defined(__SANITIZE_ADDRESS__)
#define TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif

/* Reads --case NAME and --list; leaves arguments without a leading "--" to the test (e.g.
 * test_stage's "stress"); any other option exits 2. Hooks the crash signals (not under the
 * address sanitizer, whose own reports say more). */
static inline void test_args(int argc, char **argv) {
#ifndef TEST_SANITIZED
    signal(SIGSEGV, test_on_crash);
    signal(SIGBUS, test_on_crash);
    signal(SIGFPE, test_on_crash);
    signal(SIGILL, test_on_crash);
    signal(SIGABRT, test_on_crash);
#ifdef __GLIBC__
    void *warm[1];
    (void)backtrace(warm, 1); /* its first call loads what it needs: not in the handler */
#endif
#endif
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--case") && i + 1 < argc && test_n_picked < TEST_MAX_PICKED) {
            test_picked[test_n_picked++] = argv[++i];
        } else if (!strcmp(argv[i], "--list")) {
            test_listing = 1;
        } else if (!strncmp(argv[i], "--", 2)) {
            fprintf(stderr, "usage: %s [--case NAME]... [--list]\n", argv[0]);
            exit(2);
        }
    }
}

static inline void test_case_end(void) {
    if (test_n_cases > 0) {
        if (test_case_failed) test_n_failed_cases++;
        printf("%s %s\n", test_case_failed ? "FAIL" : "ok  ", test_case_name);
        fflush(stdout);
    }
}

static inline int test_case_begin(const char *name) {
    if (test_listing) {
        printf("%s\n", name);
        return 0;
    }
    if (test_n_picked) {
        int hit = -1;
        for (int i = 0; i < test_n_picked && hit < 0; i++)
            if (!strcmp(test_picked[i], name)) hit = i;
        if (hit < 0) return 0;
        test_picked_ran[hit] = 1;
    }
    test_case_end();
    test_n_cases++;
    test_case_failed = 0;
    test_case_name = name;
    return 1;
}

/* Runs the block once as a named case. */
#define TEST_CASE(name) for (int test_once_ = test_case_begin(#name); test_once_; test_once_ = 0)

static inline int test_fail(const char *file, int line) {
    test_n_failed_checks++;
    test_case_failed = 1;
    fprintf(stderr, "%s:%d: [%s] ", file, line, test_case_name);
    return 0;
}

#define TEST_CHECK_(cond, ...)                                                                     \
    (test_n_checks++, (cond) ? 1 : (test_fail(__FILE__, __LINE__), fprintf(stderr, __VA_ARGS__), \
                                    fputc('\n', stderr), 0))

#define CHECK(cond) TEST_CHECK_((cond), "CHECK(%s) failed", #cond)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        TEST_CHECK_(a_ == b_, "%s == %s failed: %lld vs %lld", #a, #b, a_, b_);                    \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                                         \
    do {                                                                                           \
        uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                                           \
        TEST_CHECK_(a_ == b_, "%s == %s failed: %" PRIu64 " vs %" PRIu64, #a, #b, a_, b_);         \
    } while (0)

#define CHECK_NE_INT(a, b)                                                                         \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        TEST_CHECK_(a_ != b_, "%s != %s failed: both %lld", #a, #b, a_);                           \
    } while (0)

/* Status checks print the status names (akv_status_name must be linked: it is in akv_core). */
const char *akv_status_name(int status);
#define CHECK_STATUS(expr, want)                                                                   \
    do {                                                                                           \
        int s_ = (int)(expr), w_ = (int)(want);                                                    \
        TEST_CHECK_(s_ == w_, "%s returned %s (%d), want %s", #expr, akv_status_name(s_), s_,      \
                    akv_status_name(w_));                                                          \
    } while (0)
#define CHECK_OK(expr) CHECK_STATUS(expr, 0)

/* Expression form of CHECK_OK: 1 on AKV_OK, else reported like CHECK_OK and 0, so that a
 * case can stop where going on would crash: `if (!REQUIRE_OK(expr)) break;` */
static inline int test_require_ok(const char *file, int line, const char *expr, int s) {
    test_n_checks++;
    if (s == 0) return 1;
    test_fail(file, line);
    fprintf(stderr, "%s returned %s (%d), want AKV_OK\n", expr, akv_status_name(s), s);
    return 0;
}
#define REQUIRE_OK(expr) test_require_ok(__FILE__, __LINE__, #expr, (int)(expr))

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        TEST_CHECK_(a_ && b_ && strcmp(a_, b_) == 0, "%s == %s failed: \"%s\" vs \"%s\"", #a, #b,  \
                    a_ ? a_ : "(null)", b_ ? b_ : "(null)");                                       \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);                             \
        TEST_CHECK_(fabs(a_ - b_) <= t_, "|%s - %s| <= %g failed: %.9g vs %.9g", #a, #b, t_, a_,  \
                    b_);                                                                           \
    } while (0)

/* Compares n floats: passes when max |got-want| <= atol + rtol*|want| everywhere and no NaN.
 * On failure prints the worst element, both values and the count of bad elements. */
static inline int test_check_close_f32(const char *file, int line, const char *what, const float *got,
                                const float *want, size_t n, double atol, double rtol) {
    size_t n_bad = 0, worst = 0;
    double worst_excess = -1;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        double lim = atol + rtol * fabs(w);
        double excess = isnan(g) || isnan(w) ? INFINITY : fabs(g - w) - lim;
        if (excess > 0) n_bad++;
        if (excess > worst_excess) worst_excess = excess, worst = i;
    }
    test_n_checks++;
    if (n_bad == 0) return 1;
    test_fail(file, line);
    fprintf(stderr, "%s: %zu of %zu elements out of tolerance (atol %g, rtol %g); worst [%zu]: got %.9g want %.9g\n",
            what, n_bad, n, atol, rtol, worst, (double)got[worst], (double)want[worst]);
    return 0;
}
#define CHECK_CLOSE_F32(got, want, n, atol, rtol)                                                  \
    test_check_close_f32(__FILE__, __LINE__, #got " ~ " #want, (got), (want), (n), (atol), (rtol))

/* Byte-exact comparison; prints the first differing offset. */
static inline int test_check_bytes(const char *file, int line, const char *what, const void *a,
                            const void *b, size_t n) {
    const unsigned char *x = a, *y = b;
    test_n_checks++;
    for (size_t i = 0; i < n; i++) {
        if (x[i] != y[i]) {
            test_fail(file, line);
            fprintf(stderr, "%s: first difference at byte %zu of %zu: %02x vs %02x\n", what, i, n,
                    x[i], y[i]);
            return 0;
        }
    }
    return 1;
}
#define CHECK_BYTES(a, b, n) test_check_bytes(__FILE__, __LINE__, #a " == " #b, (a), (b), (n))

/* Stop the whole test as skipped (exit 77), with a reason. */
static inline void test_skip(const char *reason) {
    printf("SKIP: %s\n", reason);
    fflush(stdout);
    exit(77);
}

/* A seed for randomized tests: AKV_TEST_SEED from the environment, else `fallback`.
 * Always printed, so a failure can be replayed. */
static inline uint64_t test_seed(uint64_t fallback) {
    const char *s = getenv("AKV_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 0) : fallback;
    printf("seed %" PRIu64 " (set AKV_TEST_SEED to replay)\n", seed);
    return seed;
}

/* splitmix64: small, good, reproducible. */
static inline uint64_t test_rand(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint64_t test_rand_below(uint64_t *state, uint64_t n) {
    return n ? test_rand(state) % n : 0;
}
static inline float test_rand_f32(uint64_t *state) { /* uniform in [-1, 1) */
    return (float)((double)(test_rand(state) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

/* Ends the run: prints "N passed, N failed" over cases and returns the exit code. */
static inline int test_finish(void) {
    if (test_listing) return 0;
    int n_missing = 0;
    for (int i = 0; i < test_n_picked; i++)
        if (!test_picked_ran[i]) {
            printf("FAIL no case named %s (--list names them)\n", test_picked[i]);
            n_missing++;
        }
    test_case_end();
    int n_passed = test_n_cases - test_n_failed_cases;
    printf("%d passed, %d failed (%d checks, %d failed)\n", n_passed, test_n_failed_cases,
           test_n_checks, test_n_failed_checks);
    return test_n_failed_checks || n_missing ? 1 : 0;
}

#endif
