/* test_gguf_writer.c — files from the writer read back identically (metadata of every type,
 * copied kvs, tensor bytes streamed in odd pieces, alignment); misuse is refused and leaves
 * no file; allocation failures in phase 1 change nothing. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <sys/stat.h>
#include <unistd.h>

#include "akv/gguf.h"
#include "akv/gguf_writer.h"
#include "akv/log.h"
#include "core/alloc.h"
#include "gguf/gguf_impl.h"
#include "gguf_build.h"

static char dir[64];

typedef struct tpath {
    char s[128];
} tpath;

static tpath tmp_path(const char *name) {
    tpath p;
    snprintf(p.s, sizeof p.s, "%s/%s", dir, name);
    return p;
}

static void silence(akv_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

/* The tensors every round trip writes: name, type, extents. */
static const struct {
    const char *name;
    akv_gguf_type type;
    uint32_t n_dims;
    uint64_t ne[4];
} specs[] = {
    {"token_embd.weight", AKV_GGUF_TYPE_Q8_0, 2, {64, 5, 1, 1}},
    {"blk.0.attn_norm.weight", AKV_GGUF_TYPE_F32, 1, {64, 1, 1, 1}},
    {"empty", AKV_GGUF_TYPE_F32, 2, {8, 0, 1, 1}},
    {"blk.0.ffn_up.weight", AKV_GGUF_TYPE_Q4_K, 3, {256, 2, 3, 1}},
    {"odd.bf16", AKV_GGUF_TYPE_BF16, 4, {3, 5, 1, 7}},
};
enum { N_SPECS = sizeof specs / sizeof specs[0] };

static uint8_t data_byte(size_t t, uint64_t j) {
    return (uint8_t)(t * 101 + j * 13 + (j >> 8));
}

/* Runs the whole write script on a writer; returns the first failure. `src` supplies
 * kvs to copy. */
static akv_status write_script(akv_gguf_writer *w, const akv_gguf *src, size_t chunk) {
    akv_status st;
#define TRY(e)                                                                                     \
    if ((st = (e)) != AKV_OK) return st
    int16_t i16s[3] = {-1, 2, -300};
    uint8_t i16_bytes[6];
    for (int i = 0; i < 3; i++) akv__gguf_st16(i16_bytes + 2 * i, (uint16_t)i16s[i]);
    akv_gguf_str strs[3] = {{"x", 1}, {"", 0}, {"\xe4\xb8\xad\xe6\x96\x87", 6}};
    TRY(akv_gguf_writer_add_str(w, "general.architecture", "llama"));
    TRY(akv_gguf_writer_add_u32(w, "w.u32", 123456789u));
    TRY(akv_gguf_writer_add_u64(w, "w.u64", UINT64_MAX));
    TRY(akv_gguf_writer_add_f32(w, "w.f32", -0.125f));
    TRY(akv_gguf_writer_add_value(w, "w.i8", &(akv_gguf_value){.type = AKV_GGUF_VTYPE_I8, .as.i = -7}));
    TRY(akv_gguf_writer_add_value(w, "w.u16", &(akv_gguf_value){.type = AKV_GGUF_VTYPE_U16, .as.u = 65535}));
    TRY(akv_gguf_writer_add_value(w, "w.i64", &(akv_gguf_value){.type = AKV_GGUF_VTYPE_I64, .as.i = INT64_MIN}));
    TRY(akv_gguf_writer_add_value(w, "w.f64", &(akv_gguf_value){.type = AKV_GGUF_VTYPE_F64, .as.f = 1e300}));
    TRY(akv_gguf_writer_add_value(w, "w.bool", &(akv_gguf_value){.type = AKV_GGUF_VTYPE_BOOL, .as.b = true}));
    akv_gguf_value arr = {.type = AKV_GGUF_VTYPE_ARRAY,
                          .as.arr = {.type = AKV_GGUF_VTYPE_I16, .n = 3, .data = i16_bytes}};
    TRY(akv_gguf_writer_add_value(w, "w.arr_i16", &arr));
    TRY(akv_gguf_writer_add_arr_str(w, "w.arr_str", strs, 3));
    size_t idx;
    TRY(akv_gguf_find_kv(src, "test.arr_str", &idx));
    TRY(akv_gguf_writer_copy_kv(w, src, idx));
    TRY(akv_gguf_find_kv(src, "test.f64", &idx));
    TRY(akv_gguf_writer_copy_kv(w, src, idx));
    for (size_t t = 0; t < N_SPECS; t++)
        TRY(akv_gguf_writer_add_tensor(w, specs[t].name, specs[t].type, specs[t].n_dims, specs[t].ne));
    /* Stream all tensor bytes as one sequence cut into `chunk`-byte pieces. */
    uint8_t buf[4096];
    size_t fill = 0;
    for (size_t t = 0; t < N_SPECS; t++) {
        size_t n_bytes = 0;
        uint64_t n_elems = specs[t].ne[0] * specs[t].ne[1] * specs[t].ne[2] * specs[t].ne[3];
        TRY(akv_gguf_type_bytes(specs[t].type, n_elems, &n_bytes));
        for (uint64_t j = 0; j < n_bytes; j++) {
            buf[fill++] = data_byte(t, j);
            if (fill == chunk) {
                TRY(akv_gguf_writer_write(w, buf, fill));
                fill = 0;
            }
        }
    }
    TRY(akv_gguf_writer_write(w, buf, fill));
#undef TRY
    return akv_gguf_writer_finish(w);
}

static void check_read_back(const char *path, size_t alignment, uint64_t want_bytes) {
    akv_gguf *g = NULL;
    CHECK_OK(akv_gguf_open(path, &g));
    if (!g) return;
    CHECK(akv__gguf_check(g));
    CHECK_EQ_U64(akv_gguf_alignment(g), alignment);
    CHECK_EQ_U64(akv_gguf_file_bytes(g), want_bytes);
    CHECK_EQ_INT(akv_gguf_version(g), 3);
    akv_gguf_str s = {0};
    uint32_t u32 = 0;
    uint64_t u64 = 0;
    int64_t i64 = 0;
    double f = 0;
    bool b = false;
    CHECK_OK(akv_gguf_get_str(g, "general.architecture", &s));
    CHECK(s.len == 5 && !memcmp(s.ptr, "llama", 5));
    CHECK_OK(akv_gguf_get_u32(g, "w.u32", &u32));
    CHECK_EQ_U64(u32, 123456789u);
    CHECK_OK(akv_gguf_get_u64(g, "w.u64", &u64));
    CHECK_EQ_U64(u64, UINT64_MAX);
    CHECK_OK(akv_gguf_get_f64(g, "w.f32", &f));
    CHECK_NEAR(f, -0.125, 0);
    CHECK_OK(akv_gguf_get_i64(g, "w.i8", &i64));
    CHECK_EQ_INT(i64, -7);
    CHECK_OK(akv_gguf_get_u64(g, "w.u16", &u64));
    CHECK_EQ_U64(u64, 65535);
    CHECK_OK(akv_gguf_get_i64(g, "w.i64", &i64));
    CHECK(i64 == INT64_MIN);
    CHECK_OK(akv_gguf_get_f64(g, "w.f64", &f));
    CHECK_NEAR(f, 1e300, 0);
    CHECK_OK(akv_gguf_get_bool(g, "w.bool", &b));
    CHECK(b);
    akv_gguf_arr a;
    CHECK_OK(akv_gguf_get_arr(g, "w.arr_i16", &a));
    CHECK(a.type == AKV_GGUF_VTYPE_I16 && a.n == 3);
    if (a.n == 3) {
        CHECK_EQ_INT(akv_gguf_arr_int(&a, 0), -1);
        CHECK_EQ_INT(akv_gguf_arr_int(&a, 2), -300);
    }
    CHECK_OK(akv_gguf_get_arr(g, "w.arr_str", &a));
    CHECK(a.type == AKV_GGUF_VTYPE_STRING && a.n == 3);
    if (a.n == 3) {
        akv_gguf_str e2 = akv_gguf_arr_str(g, &a, 2);
        CHECK(e2.len == 6 && !memcmp(e2.ptr, "\xe4\xb8\xad\xe6\x96\x87", 6));
        CHECK_EQ_U64(akv_gguf_arr_str(g, &a, 1).len, 0);
    }
    /* The copied kvs, as the sample (gguf_build.h) has them. */
    CHECK_OK(akv_gguf_get_arr(g, "test.arr_str", &a));
    CHECK(a.n == 3);
    if (a.n == 3) CHECK(akv_gguf_arr_str(g, &a, 2).len == 7);
    CHECK_OK(akv_gguf_get_f64(g, "test.f64", &f));
    CHECK_NEAR(f, -2.25, 0);
    /* Key order is the order of the adds (general.alignment first when written). */
    CHECK_STR(akv_gguf_kv_key(g, alignment == 32 ? 0 : 1), "general.architecture");
    CHECK_EQ_U64(akv_gguf_n_tensors(g), N_SPECS);
    for (size_t t = 0; t < N_SPECS && t < akv_gguf_n_tensors(g); t++) {
        const akv_gguf_tensor *ti = akv_gguf_tensor_at(g, t);
        CHECK_STR(ti->name, specs[t].name);
        CHECK_EQ_INT(ti->type, specs[t].type);
        CHECK_EQ_INT(ti->n_dims, specs[t].n_dims);
        for (int d = 0; d < 4; d++) CHECK_EQ_U64(ti->ne[d], specs[t].ne[d]);
        CHECK_EQ_U64((ti->offset - akv_gguf_data_offset(g)) % alignment, 0);
        int n_bad = 0;
        for (uint64_t j = 0; j < ti->n_bytes; j++) n_bad += ti->data[j] != data_byte(t, j);
        TEST_CHECK_(n_bad == 0, "tensor %s: %d bytes differ", ti->name, n_bad);
    }
    akv_gguf_close(g);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    snprintf(dir, sizeof dir, "/tmp/akv_test_gguf_writer_XXXXXX");
    if (!mkdtemp(dir)) test_skip("cannot create a temporary directory");
    gb sample = {0};
    gguf_sample_pos pos;
    gguf_sample(&sample, 3, 0, &pos);
    akv_gguf *src = NULL;
    if (akv_gguf_open_memory(sample.p, sample.n, &src) != AKV_OK) return 1;

    TEST_CASE(round_trip) {
        uint32_t aligns[3] = {0, 64, 8};
        size_t chunks[3] = {1, 7, 4096};
        for (int i = 0; i < 3; i++) {
            akv_gguf_writer_params p = akv_gguf_writer_default_params();
            p.alignment = aligns[i];
            akv_gguf_writer *w = NULL;
            tpath tp = tmp_path("rt.gguf");
            const char *path = tp.s;
            CHECK_OK(akv_gguf_writer_create(path, &p, &w));
            if (!w) break;
            CHECK_OK(write_script(w, src, chunks[i]));
            uint64_t want = akv_gguf_writer_file_bytes(w);
            akv_gguf_writer_destroy(w);
            check_read_back(path, aligns[i] ? aligns[i] : 32, want);
            unlink(path);
        }
    }

    TEST_CASE(misuse_is_refused_and_leaves_no_file) {
        akv_log_set(silence, NULL, AKV_LOG_DEBUG);
        tpath tp = tmp_path("bad.gguf");
        const char *path = tp.s;
        char partial[160];
        snprintf(partial, sizeof partial, "%s.partial", path);
        akv_gguf_writer *w = NULL;
        akv_gguf_writer_params p = {.alignment = 48};
        CHECK_STATUS(akv_gguf_writer_create(path, &p, &w), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_writer_create("/nonexistent/dir/x.gguf", NULL, &w), AKV_EIO);
        CHECK_OK(akv_gguf_writer_create(path, NULL, &w));
        if (!w) break;
        CHECK_EQ_INT(access(partial, F_OK), 0);
        CHECK_OK(akv_gguf_writer_add_u32(w, "a.b", 1));
        CHECK_STATUS(akv_gguf_writer_add_u32(w, "a.b", 2), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_writer_add_u32(w, "", 2), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_writer_add_u32(w, "bad\nkey", 2), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_writer_add_u32(w, "general.alignment", 64), AKV_EINVAL);
        akv_gguf_value nested = {.type = AKV_GGUF_VTYPE_ARRAY,
                                 .as.arr = {.type = AKV_GGUF_VTYPE_STRING, .n = 0}};
        CHECK_STATUS(akv_gguf_writer_add_value(w, "a.c", &nested), AKV_EINVAL);
        uint64_t ne[4] = {32, 2, 1, 1}, ne_bad[4] = {33, 1, 1, 1}, ne_huge[2] = {1ull << 40, 1ull << 40};
        CHECK_OK(akv_gguf_writer_add_tensor(w, "t", AKV_GGUF_TYPE_Q8_0, 2, ne));
        CHECK_STATUS(akv_gguf_writer_add_tensor(w, "t", AKV_GGUF_TYPE_F32, 2, ne), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_writer_add_tensor(w, "u", AKV_GGUF_TYPE_Q8_0, 1, ne_bad), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_writer_add_tensor(w, "u", AKV_GGUF_TYPE_F32, 5, ne), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_writer_add_tensor(w, "u", AKV_GGUF_TYPE_F32, 0, ne), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_writer_add_tensor(w, "u", (akv_gguf_type)4, 1, ne), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_writer_add_tensor(w, "u", AKV_GGUF_TYPE_F32, 2, ne_huge), AKV_EOVERFLOW);
        char long_name[80];
        memset(long_name, 'n', 65), long_name[65] = '\0';
        CHECK_STATUS(akv_gguf_writer_add_tensor(w, long_name, AKV_GGUF_TYPE_F32, 1, ne), AKV_EINVAL);
        uint8_t bytes[100] = {0};
        CHECK_OK(akv_gguf_writer_write(w, bytes, 10));
        CHECK_STATUS(akv_gguf_writer_add_u32(w, "late.key", 1), AKV_ESTATE);
        CHECK_STATUS(akv_gguf_writer_add_tensor(w, "late", AKV_GGUF_TYPE_F32, 1, ne), AKV_ESTATE);
        CHECK_STATUS(akv_gguf_writer_finish(w), AKV_ESTATE); /* 58 of 68 bytes missing */
        CHECK_STATUS(akv_gguf_writer_write(w, bytes, 59), AKV_ESTATE);
        akv_gguf_writer_destroy(w);
        CHECK(access(path, F_OK) != 0);
        CHECK(access(partial, F_OK) != 0);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
    }

    TEST_CASE(what_cannot_be_held_is_refused_before_writing) {
        /* a file its file system cannot hold (2^50 bytes): refused at the first write, before
         * any data, and nothing is left behind; a non-regular file at the path is never
         * replaced */
        akv_log_set(silence, NULL, AKV_LOG_DEBUG);
        tpath tp = tmp_path("huge.gguf");
        char partial[160];
        snprintf(partial, sizeof partial, "%s.partial", tp.s);
        akv_gguf_writer *w = NULL;
        CHECK_OK(akv_gguf_writer_create(tp.s, NULL, &w));
        if (!w) break;
        uint64_t ne[2] = {1ull << 24, 1ull << 24}; /* 2^48 f32 elements */
        CHECK_OK(akv_gguf_writer_add_tensor(w, "t", AKV_GGUF_TYPE_F32, 2, ne));
        uint8_t bytes[16] = {0};
        CHECK_STATUS(akv_gguf_writer_write(w, bytes, sizeof bytes), AKV_EIO);
        akv_gguf_writer_destroy(w);
        CHECK(access(tp.s, F_OK) != 0);
        CHECK(access(partial, F_OK) != 0);
        tpath td = tmp_path("a_dir.gguf");
        CHECK_EQ_INT(mkdir(td.s, 0700), 0);
        w = NULL;
        CHECK_STATUS(akv_gguf_writer_create(td.s, NULL, &w), AKV_EINVAL);
        CHECK(w == NULL);
        CHECK_EQ_INT(rmdir(td.s), 0);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
    }

    TEST_CASE(allocation_failures_fail_cleanly) {
        /* Reference bytes from an undisturbed run. */
        tpath tref = tmp_path("ref.gguf"), tinj = tmp_path("inj.gguf");
        const char *ref = tref.s, *path = tinj.s;
        akv_gguf_writer *w = NULL;
        CHECK_OK(akv_gguf_writer_create(ref, NULL, &w));
        if (!w) break;
        CHECK_OK(write_script(w, src, 64));
        akv_gguf_writer_destroy(w);
        FILE *f = fopen(ref, "rb");
        uint8_t want[8192], got[8192];
        size_t n_want = f ? fread(want, 1, sizeof want, f) : 0;
        if (f) fclose(f);
        akv_log_set(silence, NULL, AKV_LOG_DEBUG);
        int n_fired = 0;
        for (uint64_t nth = 1; nth < 200; nth++) {
            w = NULL;
            if (akv_gguf_writer_create(path, NULL, &w) != AKV_OK) continue;
            akv__alloc_fail_nth(nth);
            akv_status st = write_script(w, src, 64);
            bool fired = akv__alloc_failure_fired();
            akv__alloc_fail_nth(0);
            if (!fired) {
                CHECK_OK(st);
                akv_gguf_writer_destroy(w);
                break;
            }
            n_fired++;
            CHECK_STATUS(st, AKV_ENOMEM);
            akv_gguf_writer_destroy(w);
            CHECK(access(path, F_OK) != 0);
        }
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK(n_fired > 10);
        /* The last, undisturbed run wrote exactly the reference bytes. */
        f = fopen(path, "rb");
        size_t n_got = f ? fread(got, 1, sizeof got, f) : 0;
        if (f) fclose(f);
        CHECK_EQ_U64(n_got, n_want);
        if (n_got == n_want) CHECK_BYTES(got, want, n_got);
        unlink(ref);
        unlink(path);
    }

    akv_gguf_close(src);
    gb_free(&sample);
    rmdir(dir);
    return test_finish();
}
