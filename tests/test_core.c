/* test_core.c — status names, the log hook, allocation injection, checked sizes, clock. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "test.h"

#include <string.h>

#include "akv/kv_repr.h"
#include "akv/log.h"
#include "akv/status.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/half.h"
#include "core/hash.h"
#include "core/log.h"

typedef struct log_capture {
    int n;
    akv_log_level last_level;
    char last[256];
} log_capture;

static void capture_hook(akv_log_level level, const char *msg, void *user) {
    log_capture *c = user;
    c->n++;
    c->last_level = level;
    snprintf(c->last, sizeof c->last, "%s", msg);
}

static const char *flag_namer(const char *field, void *user) {
    (void)user;
    if (!strcmp(field, "weights")) return "--weights";
    if (!strcmp(field, "host_gib")) return "--host-gib";
    if (!strcmp(field, "max_seqs")) return "--parallel";
    return NULL;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    TEST_CASE(status_names) {
        CHECK_STR(akv_status_str(AKV_OK), "ok");
        CHECK_STR(akv_status_name(AKV_EFULL), "AKV_EFULL");
        CHECK_STR(akv_status_str(12345), "unknown status");
        for (int s = AKV_OK; s >= AKV_ECANCELED; s--) {
            CHECK(strcmp(akv_status_str(s), "unknown status") != 0);
            CHECK(strncmp(akv_status_name(s), "AKV_", 4) == 0);
        }
    }

    TEST_CASE(log_hook_and_threshold) {
        log_capture cap = {0};
        akv_log_set(capture_hook, &cap, AKV_LOG_INFO);
        AKV_LOG_D("dropped %d", 1);
        CHECK_EQ_INT(cap.n, 0);
        AKV_LOG_W("pool %s is %d%% full", "host", 93);
        CHECK_EQ_INT(cap.n, 1);
        CHECK_EQ_INT(cap.last_level, AKV_LOG_WARN);
        CHECK_STR(cap.last, "pool host is 93% full");
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        AKV_LOG_E("to nobody");
        CHECK_EQ_INT(cap.n, 1);
        CHECK_EQ_INT(akv_log_threshold(), AKV_LOG_OFF);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
    }

    TEST_CASE(settings_said_by_identity) {
        /* Only markers are said as the front end's names; prose with a field's word is not. */
        const char *msg = "{=weights} q4: raise {=host_gib} to 3 for the weights of host_gib";
        char buf[128];
        size_t n = akv_log_render(msg, flag_namer, NULL, buf, sizeof buf);
        CHECK_STR(buf, "--weights q4: raise --host-gib to 3 for the weights of host_gib");
        CHECK_EQ_INT((int)n, (int)strlen(buf));
        akv_log_render(msg, NULL, NULL, buf, sizeof buf); /* no namer: the fields */
        CHECK_STR(buf, "weights q4: raise host_gib to 3 for the weights of host_gib");
        akv_log_render("{=max_seqs} and {=other}", flag_namer, NULL, buf, sizeof buf);
        CHECK_STR(buf, "--parallel and other"); /* a field the namer does not know: itself */
        /* Not markers: an empty one, an unclosed one, braces of prose. */
        akv_log_render("{=} {x} {=open", flag_namer, NULL, buf, sizeof buf);
        CHECK_STR(buf, "{=} {x} {=open");
        /* Truncation keeps a NUL and reports the length the whole text needs. */
        char small[8];
        n = akv_log_render(msg, flag_namer, NULL, small, sizeof small);
        CHECK_STR(small, "--weigh");
        CHECK_EQ_INT((int)n, (int)strlen("--weights q4: raise --host-gib to 3 for the weights of host_gib"));
    }

    TEST_CASE(page_representations_and_their_layouts) {
        akv_repr r;
        for (int i = 0; i < AKV_REPR_COUNT; i++) {
            CHECK_OK(akv_repr_from_name(akv_repr_name((akv_repr)i), &r));
            CHECK_EQ_INT(r, i);
        }
        CHECK_STATUS(akv_repr_from_name("q2", &r), AKV_EINVAL);
        CHECK_STR(akv_repr_name(AKV_REPR_COUNT), "?");
        akv_repr_layout l;
        /* SmolLM2's page: 3 heads, P = 256, head dim 64, bf16 (192 KiB exact) */
        CHECK_OK(akv_repr_layout_of(AKV_REPR_EXACT, AKV_DTYPE_BF16, 3, 256, 64, &l));
        CHECK_EQ_INT((int)l.page_bytes, 196608);
        CHECK_OK(akv_repr_layout_of(AKV_REPR_Q8, AKV_DTYPE_BF16, 3, 256, 64, &l));
        CHECK_EQ_INT((int)l.scales_offset, 1536 * 64);
        CHECK_EQ_INT((int)l.page_bytes, 1536 * 64 + 1536 * 2);
        CHECK(l.group == 64 && l.scales_per_row == 1 && !l.rotate_k);
        CHECK_OK(akv_repr_layout_of(AKV_REPR_Q4, AKV_DTYPE_BF16, 3, 256, 64, &l));
        CHECK_EQ_INT((int)l.scales_offset, 1536 * 32);
        CHECK_EQ_INT((int)l.page_bytes, 1536 * 32 + 1536 * 2 * 2);
        CHECK(l.group == 32 && l.scales_per_row == 2 && l.rotate_k && l.code_row_bytes == 32);
        /* Llama-3-8B's page: 8 heads, P = 64, head dim 128: 256 KiB exact, 72 KiB in q4 */
        CHECK_OK(akv_repr_layout_of(AKV_REPR_Q4, AKV_DTYPE_BF16, 8, 64, 128, &l));
        CHECK_EQ_INT((int)l.page_bytes, 73728);
        /* bits an element, every scale included */
        CHECK(akv_repr_bits(AKV_REPR_EXACT, AKV_DTYPE_BF16, 64) == 16.0);
        CHECK(akv_repr_bits(AKV_REPR_Q8, AKV_DTYPE_BF16, 64) == 8.25);
        CHECK(akv_repr_bits(AKV_REPR_Q8, AKV_DTYPE_BF16, 128) == 8.125);
        CHECK(akv_repr_bits(AKV_REPR_Q4, AKV_DTYPE_BF16, 128) == 4.5);
        /* shapes a form cannot hold, and bad inputs */
        CHECK_STATUS(akv_repr_layout_of(AKV_REPR_Q4, AKV_DTYPE_BF16, 3, 256, 48, &l), AKV_EUNSUPPORTED);
        CHECK_STATUS(akv_repr_layout_of(AKV_REPR_Q4, AKV_DTYPE_BF16, 3, 256, 16, &l), AKV_EUNSUPPORTED);
        CHECK(akv_repr_bits(AKV_REPR_Q4, AKV_DTYPE_BF16, 48) == 0);
        CHECK_OK(akv_repr_layout_of(AKV_REPR_Q8, AKV_DTYPE_BF16, 3, 256, 48, &l)); /* any dim */
        CHECK_EQ_INT((int)(l.scales_offset % 16), 0);
        CHECK_EQ_INT((int)(l.page_bytes % 16), 0);
        CHECK_STATUS(akv_repr_layout_of(AKV_REPR_COUNT, AKV_DTYPE_BF16, 3, 256, 64, &l), AKV_EINVAL);
        CHECK_STATUS(akv_repr_layout_of(AKV_REPR_Q8, AKV_DTYPE_COUNT, 3, 256, 64, &l), AKV_EINVAL);
        CHECK_STATUS(akv_repr_layout_of(AKV_REPR_Q8, AKV_DTYPE_BF16, 0, 256, 64, &l), AKV_EINVAL);
    }

    TEST_CASE(alloc_fail_nth) {
        int64_t live0 = akv__alloc_live();
        akv__alloc_fail_nth(2);
        void *a = akv__malloc(16);
        void *b = akv__malloc(16);
        void *c = akv__malloc(16);
        CHECK(a != NULL);
        CHECK(b == NULL);
        CHECK(c != NULL);
        CHECK(akv__alloc_failure_fired());
        CHECK_EQ_INT(akv__alloc_live(), live0 + 2);
        akv__free(a);
        akv__free(c);
        CHECK_EQ_INT(akv__alloc_live(), live0);
        akv__alloc_fail_nth(0);
        CHECK(!akv__alloc_failure_fired());
    }

    TEST_CASE(calloc_overflow_and_zero) {
        CHECK(akv__calloc(SIZE_MAX / 2, 4) == NULL);
        CHECK(akv__malloc(0) == NULL);
        size_t out = 7;
        CHECK(!akv__size_mul(SIZE_MAX, 2, &out));
        CHECK_EQ_U64(out, 7);
        CHECK(akv__size_add(3, 4, &out));
        CHECK_EQ_U64(out, 7);
        CHECK(!akv__size_add(SIZE_MAX, 1, &out));
    }

    TEST_CASE(array_reserve_all_or_nothing) {
        int *v = NULL;
        size_t cap = 0;
        CHECK_OK(akv__array_reserve((void **)&v, &cap, 3, sizeof *v));
        CHECK(cap >= 3);
        v[0] = 11;
        size_t cap0 = cap;
        int *v0 = v;
        akv__alloc_fail_nth(1);
        CHECK_STATUS(akv__array_reserve((void **)&v, &cap, 100, sizeof *v), AKV_ENOMEM);
        CHECK(v == v0);
        CHECK_EQ_U64(cap, cap0);
        CHECK_OK(akv__array_reserve((void **)&v, &cap, 100, sizeof *v));
        CHECK_EQ_INT(v[0], 11);
        CHECK_EQ_INT(v[99], 0);
        CHECK_STATUS(akv__array_reserve((void **)&v, &cap, SIZE_MAX, sizeof *v), AKV_EOVERFLOW);
        akv__free(v);
    }

    TEST_CASE(strdup) {
        char *s = akv__strndup("abcdef", 3);
        CHECK_STR(s, "abc");
        akv__free(s);
    }

    TEST_CASE(half_conversions) {
        CHECK_EQ_INT(akv_f32_to_bf16(1.0f), 0x3f80);
        CHECK_EQ_INT(akv_f32_to_bf16(1.00390625f), 0x3f80);   /* tie -> even (down) */
        CHECK_EQ_INT(akv_f32_to_bf16(1.01171875f), 0x3f82);   /* tie -> even (up) */
        CHECK(isnan(akv_bf16_to_f32(akv_f32_to_bf16(NAN))));
        CHECK_EQ_INT(akv_f32_to_f16(65504.0f), 0x7bff);
        CHECK_EQ_INT(akv_f32_to_f16(65520.0f), 0x7c00);       /* rounds to Inf */
        CHECK_EQ_INT(akv_f32_to_f16(5.9604645e-8f), 0x0001);  /* least subnormal */
        int n_bad = 0;
        for (uint32_t h = 0; h < 65536; h++) { /* every finite f16 survives the round trip */
            float f = akv_f16_to_f32((uint16_t)h);
            if (!isnan(f) && akv_f32_to_f16(f) != h) n_bad++;
        }
        CHECK_EQ_INT(n_bad, 0);
    }

    TEST_CASE(block_checksum_sees_every_flip_and_length) {
        /* akv_hash64_block over awkward sizes (its lanes and its chained tail): any one bit
         * flipped, a byte cut or added, and the same bytes at another length each change it;
         * a lane's words swapped with the next lane's too (the lanes start apart) */
        uint64_t rng = test_seed(41);
        uint8_t buf[1100];
        for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)test_rand_below(&rng, 256);
        const size_t sizes[] = {0, 1, 7, 8, 63, 64, 65, 127, 128, 1000, 1099};
        int n_same = 0, n_tries = 0;
        for (size_t si = 0; si < AKV_ARRAY_LEN(sizes); si++) {
            const size_t n = sizes[si];
            const uint64_t h = akv_hash64_block(buf, n);
            CHECK(h == akv_hash64_block(buf, n)); /* a function of the bytes */
            for (size_t bit = 0; bit < 8 * n; bit += 1 + (size_t)test_rand_below(&rng, 13)) {
                buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
                n_same += akv_hash64_block(buf, n) == h, n_tries++;
                buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            }
            if (n) n_same += akv_hash64_block(buf, n - 1) == h, n_tries++;
            n_same += akv_hash64_block(buf, n + 1) == h, n_tries++;
            if (n >= 16) {
                uint8_t t[8];
                memcpy(t, buf, 8), memcpy(buf, buf + 8, 8), memcpy(buf + 8, t, 8);
                n_same += akv_hash64_block(buf, n) == h, n_tries++;
                memcpy(t, buf, 8), memcpy(buf, buf + 8, 8), memcpy(buf + 8, t, 8);
            }
        }
        CHECK(n_tries > 1000);
        CHECK_EQ_INT(n_same, 0);
    }

    TEST_CASE(clock_monotonic) {
        uint64_t t0 = akv_clock_ns();
        akv_clock_sleep_ns(2000000);
        uint64_t t1 = akv_clock_ns();
        CHECK(t1 >= t0 + 2000000);
    }

    TEST_CASE(clock_deadline_is_wall_time_ahead) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        const double t = (double)now.tv_sec + now.tv_nsec * 1e-9;
        const double secs[3] = {-1.0, 0.05, 2.75};
        for (int i = 0; i < 3; i++) {
            const struct timespec d = akv_clock_deadline(secs[i]);
            const double want = t + (secs[i] > 0 ? secs[i] : 0), got = (double)d.tv_sec + d.tv_nsec * 1e-9;
            CHECK(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
            TEST_CHECK_(got >= want - 1e-3 && got < want + 0.5, "deadline %g s: %.6f, want about %.6f",
                        secs[i], got, want);
        }
    }
    return test_finish();
}
