/* test_gguf.c — the GGUF reader: a valid image read back field by field, a table of
 * corrupted images (each refused with AKV_EFORMAT and a log line naming the field), every
 * truncation, random mutations, allocation failures, and files on disk. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <stddef.h>
#include <sys/stat.h>
#include <unistd.h>

#include "akv/gguf.h"
#include "akv/log.h"
#include "core/alloc.h"
#include "core/assert.h"
#include "gguf/gguf_impl.h"
#include "gguf_build.h"

typedef struct log_capture {
    int n;
    char last[1024];
} log_capture;

static log_capture cap;

static void capture_hook(akv_log_level level, const char *msg, void *user) {
    (void)level, (void)user;
    cap.n++;
    snprintf(cap.last, sizeof cap.last, "%s", msg);
}

/* Opens an image; on success also runs the validity walker and closes. */
static akv_status open_image(const uint8_t *p, size_t n) {
    akv_gguf *g = NULL;
    akv_status st = akv_gguf_open_memory(p, n, &g);
    if (st == AKV_OK) {
        CHECK(akv__gguf_check(g));
        akv_gguf_close(g);
    } else {
        CHECK(g == NULL);
    }
    return st;
}

/* Writes p[n] as the whole of the file at fd. */
static bool write_whole(int fd, const uint8_t *p, size_t n) {
    return ftruncate(fd, 0) == 0 && pwrite(fd, p, n, 0) == (ssize_t)n;
}

/* msg with every occurrence of `from` replaced by `to` (into out). */
static void replace_all(const char *msg, const char *from, const char *to, char *out, size_t cap_) {
    size_t k = 0, lf = strlen(from), lt = strlen(to);
    while (*msg && k + 1 < cap_) {
        if (!strncmp(msg, from, lf) && k + lt + 1 < cap_) {
            memcpy(out + k, to, lt), k += lt, msg += lf;
        } else {
            out[k++] = *msg++;
        }
    }
    out[k] = '\0';
}

/* Opens the sample (from memory, or from `path` when not NULL) failing the nth allocation for
 * every n until the open no longer allocates that many: each failure must be AKV_ENOMEM with
 * nothing left allocated. Returns how many failures fired. */
static int open_failing_each_allocation(const gb *b, const char *path) {
    int64_t live0 = akv__alloc_live();
    int n_fired = 0;
    for (uint64_t nth = 1; nth < 256; nth++) {
        akv__alloc_fail_nth(nth);
        akv_gguf *g = NULL;
        akv_status st = path ? akv_gguf_open(path, &g) : akv_gguf_open_memory(b->p, b->n, &g);
        bool fired = akv__alloc_failure_fired();
        akv__alloc_fail_nth(0);
        if (!fired) {
            CHECK_OK(st);
            akv_gguf_close(g);
            break;
        }
        n_fired++;
        CHECK_STATUS(st, AKV_ENOMEM);
        CHECK(g == NULL);
        CHECK_EQ_INT(akv__alloc_live(), live0);
    }
    CHECK_EQ_INT(akv__alloc_live(), live0);
    return n_fired;
}

/* The sample image (alignment `align`, 0 = none) in *b and in a new temporary file: its
 * descriptor (path filled), or -1. */
static int sample_file(gb *b, uint32_t align, char path[32]) {
    gguf_sample_pos pos;
    gguf_sample(b, 3, align, &pos);
    snprintf(path, 32, "/tmp/akv_test_gguf_XXXXXX");
    int fd = mkstemp(path);
    if (fd >= 0 && !write_whole(fd, b->p, b->n)) {
        close(fd);
        unlink(path);
        fd = -1;
    }
    return fd;
}

/* One corruption: up to two little-endian writes at (field of gguf_sample_pos + delta). */
typedef struct corruption {
    const char *name;
    uint32_t alignment; /* sample built with this general.alignment (0: none) */
    struct {
        size_t field; /* offsetof(gguf_sample_pos, ...) */
        size_t delta; /* bytes added to the field's offset */
        int width;    /* 1, 4 or 8 */
        uint64_t value;
    } edit[2];
    akv_status want;
    const char *log_has; /* substring the error line must contain (the field) */
} corruption;

#define P(f) offsetof(gguf_sample_pos, f)
#define E1(f, d, w, v) {{P(f), d, w, v}, {0, 0, 0, 0}}
#define E2(f, d, w, v, f2, d2, w2, v2) {{P(f), d, w, v}, {P(f2), d2, w2, v2}}

static const corruption corruptions[] = {
    {"bad magic", 0, E1(version, (size_t)-4, 1, 'X'), AKV_EFORMAT, "magic"},
    {"version 0", 0, E1(version, 0, 4, 0), AKV_EFORMAT, "version"},
    {"version 1", 0, E1(version, 0, 4, 1), AKV_EFORMAT, "version"},
    {"version 4", 0, E1(version, 0, 4, 4), AKV_EFORMAT, "version"},
    {"big-endian version", 0, E1(version, 0, 4, 0x03000000u), AKV_EFORMAT, "version"},
    {"kv count 2^64-1", 0, E1(n_kv, 0, 8, UINT64_MAX), AKV_EFORMAT, "kv count"},
    {"kv count 2^63", 0, E1(n_kv, 0, 8, 1ull << 63), AKV_EFORMAT, "kv count"},
    {"tensor count 2^64-1", 0, E1(n_tensors, 0, 8, UINT64_MAX), AKV_EFORMAT, "tensor count"},
    {"tensor count 2^60", 0, E1(n_tensors, 0, 8, 1ull << 60), AKV_EFORMAT, "tensor count"},
    {"key length 2^64-1", 0, E1(kv[1], 0, 8, UINT64_MAX), AKV_EFORMAT, "key"},
    {"key length 65536", 0, E1(kv[1], 0, 8, 65536), AKV_EFORMAT, "key"},
    {"key length past end", 0, E1(kv[1], 0, 8, 60000), AKV_EFORMAT, "key"},
    {"empty key", 0, E1(kv[1], 0, 8, 0), AKV_EFORMAT, "key"},
    {"key with a control byte", 0, E1(kv[1], 8, 1, '\n'), AKV_EFORMAT, "key"},
    {"key with a high byte", 0, E1(kv[1], 9, 1, 0xc4), AKV_EFORMAT, "key"},
    {"duplicate key", 0, E1(kv[1], 8 + 5, 1, 'i'), AKV_EFORMAT, "duplicates"},
    {"value type 13", 0, E1(kv_type[1], 0, 4, 13), AKV_EFORMAT, "value type"},
    {"value type 2^32-1", 0, E1(kv_type[1], 0, 4, UINT32_MAX), AKV_EFORMAT, "value type"},
    {"string length 2^64-1", 0, E1(str_len, 0, 8, UINT64_MAX), AKV_EFORMAT, "string value"},
    {"string length 2^63", 0, E1(str_len, 0, 8, 1ull << 63), AKV_EFORMAT, "string value"},
    {"string length 2^64-8", 0, E1(str_len, 0, 8, UINT64_MAX - 7), AKV_EFORMAT, "string value"},
    {"bool value 2", 0, E1(bool_val, 0, 1, 2), AKV_EFORMAT, "value"},
    {"array element type 13", 0, E1(arr_i32_type, 0, 4, 13), AKV_EFORMAT, "element type"},
    {"nested array", 0, E1(arr_i32_type, 0, 4, 9), AKV_EUNSUPPORTED, "nested"},
    {"array length 2^64-1", 0, E1(arr_i32_len, 0, 8, UINT64_MAX), AKV_EFORMAT, "array length"},
    {"array length 2^62 (x4 overflows)", 0, E1(arr_i32_len, 0, 8, 1ull << 62), AKV_EFORMAT,
     "array length"},
    {"array length past end", 0, E1(arr_i32_len, 0, 8, 1u << 20), AKV_EFORMAT, "array length"},
    {"string array length 2^64-1", 0, E1(arr_str_len, 0, 8, UINT64_MAX), AKV_EFORMAT,
     "array length"},
    {"string array length 2^61", 0, E1(arr_str_len, 0, 8, 1ull << 61), AKV_EFORMAT,
     "array length"},
    {"string element length 2^64-1", 0, E1(arr_str_elem1, 0, 8, UINT64_MAX), AKV_EFORMAT,
     "string element"},
    {"string element length past end", 0, E1(arr_str_elem1, 0, 8, 1u << 24), AKV_EFORMAT,
     "string element"},
    {"alignment 48", 64, E1(align_val, 0, 4, 48), AKV_EFORMAT, "value"},
    {"alignment 0", 64, E1(align_val, 0, 4, 0), AKV_EFORMAT, "value"},
    {"alignment 2^31", 64, E1(align_val, 0, 4, 1u << 31), AKV_EFORMAT, "value"},
    {"alignment as u64", 64, E1(kv_type[1], 0, 4, 10), AKV_EFORMAT, "value"},
    {"alignment as i32", 64, E1(kv_type[1], 0, 4, 5), AKV_EFORMAT, "value"},
    {"tensor name length 2^64-1", 0, E1(tensor[1], 0, 8, UINT64_MAX), AKV_EFORMAT, "name"},
    {"tensor name length 65", 0, E1(tensor[1], 0, 8, 65), AKV_EFORMAT, "name"},
    {"empty tensor name", 0, E1(tensor[1], 0, 8, 0), AKV_EFORMAT, "name"},
    {"tensor name with NUL", 0, E1(tensor[1], 10, 1, 0), AKV_EFORMAT, "name"},
    {"n_dims 0", 0, E1(t_n_dims[0], 0, 4, 0), AKV_EFORMAT, "n_dims"},
    {"n_dims 5", 0, E1(t_n_dims[0], 0, 4, 5), AKV_EFORMAT, "n_dims"},
    {"n_dims 2^32-1", 0, E1(t_n_dims[0], 0, 4, UINT32_MAX), AKV_EFORMAT, "n_dims"},
    {"extent 2^63", 0, E1(t_ne0[0], 0, 8, 1ull << 63), AKV_EFORMAT, "extent"},
    {"extent 2^64-1", 0, E1(t_ne1[1], 0, 8, UINT64_MAX), AKV_EFORMAT, "extent"},
    {"extents whose product overflows", 0,
     E2(t_ne0[0], 0, 8, 1ull << 32, t_ne1[0], 0, 8, 1ull << 32), AKV_EFORMAT, "extent"},
    {"byte size overflows", 0, E1(t_ne0[3], 0, 8, 1ull << 62), AKV_EFORMAT, "byte size"},
    {"ne0 not a multiple of the q8_0 block", 0, E1(t_ne0[1], 0, 8, 48), AKV_EFORMAT, "block size"},
    {"ne0 not a multiple of the q4_K block", 0, E1(t_ne0[2], 0, 8, 128), AKV_EFORMAT,
     "block size"},
    {"removed ggml type 4", 0, E1(t_type[0], 0, 4, 4), AKV_EFORMAT, "type"},
    {"ggml type 31", 0, E1(t_type[0], 0, 4, 31), AKV_EFORMAT, "type"},
    {"ggml type 40", 0, E1(t_type[0], 0, 4, 40), AKV_EFORMAT, "type"},
    {"ggml type 2^32-1", 0, E1(t_type[0], 0, 4, UINT32_MAX), AKV_EFORMAT, "type"},
    {"misaligned offset", 0, E1(t_offset[1], 0, 8, 112), AKV_EFORMAT, "offset"},
    {"misaligned offset (alignment 64)", 64, E1(t_offset[1], 0, 8, 96), AKV_EFORMAT, "offset"},
    {"offset past the end", 0, E1(t_offset[3], 0, 8, 1u << 20), AKV_EFORMAT, "offset"},
    {"offset 2^64-32 (wraps)", 0, E1(t_offset[3], 0, 8, UINT64_MAX - 31), AKV_EFORMAT, "offset"},
    {"data running past the end", 0, E1(t_ne1[3], 0, 8, 2), AKV_EFORMAT, "offset"},
    {"overlapping tensors", 0, E1(t_offset[1], 0, 8, 0), AKV_EFORMAT, "overlaps"},
    {"overlapping tensors (partial)", 0, E1(t_offset[2], 0, 8, 160), AKV_EFORMAT, "overlaps"},
    {"one kv more than present", 0, E1(n_kv, 0, 8, 17), AKV_EFORMAT, ""},
    {"one tensor more than present", 0, E1(n_tensors, 0, 8, GGUF_SAMPLE_N_TENSORS + 1),
     AKV_EFORMAT, ""},
};

static void apply_edit(gb *b, const gguf_sample_pos *pos, size_t field, size_t delta, int width,
                       uint64_t value) {
    size_t at = *(const size_t *)((const char *)pos + field) + delta;
    if (!CHECK(at + (size_t)width <= b->n)) return;
    for (int i = 0; i < width; i++) b->p[at + i] = (uint8_t)(value >> (8 * i));
}

/* A small image with custom tensor infos (names, offsets) and no kv. */
static void build_two_tensors(gb *b, const char *name0, const char *name1) {
    gb_bytes(b, "GGUF", 4);
    gb_u32(b, 3);
    gb_u64(b, 2);
    gb_u64(b, 0);
    const char *names[2] = {name0, name1};
    for (int i = 0; i < 2; i++) {
        gb_str(b, names[i]);
        gb_u32(b, 1);
        gb_u64(b, 8);
        gb_u32(b, 0);
        gb_u64(b, (uint64_t)i * 32);
    }
    gb_pad(b, 32);
    for (int i = 0; i < 64; i++) gb_u8(b, (uint8_t)i);
}

static void check_sample(const akv_gguf *g, uint32_t version, size_t alignment) {
    CHECK_EQ_INT(akv_gguf_version(g), version);
    CHECK_EQ_U64(akv_gguf_alignment(g), alignment);
    CHECK_EQ_U64(akv_gguf_data_offset(g) % alignment, 0);
    akv_gguf_str s = {0};
    CHECK_OK(akv_gguf_get_str(g, "general.architecture", &s));
    CHECK(s.len == 5 && !memcmp(s.ptr, "llama", 5));
    uint64_t u = 0;
    uint32_t u32 = 0;
    int64_t i = 0;
    double f = 0;
    float f32 = 0;
    bool b = false;
    CHECK_OK(akv_gguf_get_u64(g, "test.u8", &u));
    CHECK_EQ_U64(u, 200);
    CHECK_OK(akv_gguf_get_i64(g, "test.i8", &i));
    CHECK_EQ_INT(i, -5);
    CHECK_OK(akv_gguf_get_u32(g, "test.u16", &u32));
    CHECK_EQ_U64(u32, 60000);
    CHECK_OK(akv_gguf_get_i64(g, "test.i16", &i));
    CHECK_EQ_INT(i, -300);
    CHECK_OK(akv_gguf_get_u32(g, "test.u32", &u32));
    CHECK_EQ_U64(u32, 4000000000u);
    CHECK_OK(akv_gguf_get_i64(g, "test.i32", &i));
    CHECK_EQ_INT(i, -70000);
    CHECK_OK(akv_gguf_get_f32(g, "test.f32", &f32));
    CHECK_NEAR(f32, 1.5, 0);
    CHECK_OK(akv_gguf_get_bool(g, "test.bool", &b));
    CHECK(b);
    CHECK_OK(akv_gguf_get_u64(g, "test.u64", &u));
    CHECK_EQ_U64(u, 1ull << 40);
    CHECK_OK(akv_gguf_get_i64(g, "test.i64", &i));
    CHECK_EQ_INT(i, -(1ll << 40));
    CHECK_OK(akv_gguf_get_f64(g, "test.f64", &f));
    CHECK_NEAR(f, -2.25, 0);
    /* Conversions that must be refused. */
    CHECK_STATUS(akv_gguf_get_u32(g, "test.u64", &u32), AKV_EFORMAT);
    CHECK_STATUS(akv_gguf_get_u64(g, "test.i8", &u), AKV_EFORMAT);
    CHECK_STATUS(akv_gguf_get_f64(g, "test.u32", &f), AKV_EFORMAT);
    CHECK_STATUS(akv_gguf_get_str(g, "test.bool", &s), AKV_EFORMAT);
    CHECK_STATUS(akv_gguf_get_bool(g, "test.u8", &b), AKV_EFORMAT);
    CHECK_STATUS(akv_gguf_get_u64(g, "no.such.key", &u), AKV_ENOTFOUND);
    CHECK_STATUS(akv_gguf_get_arr(g, "test.u8", &(akv_gguf_arr){0}), AKV_EFORMAT);
    /* Arrays. */
    akv_gguf_arr a;
    CHECK_OK(akv_gguf_get_arr(g, "test.arr_i32", &a));
    CHECK_EQ_INT(a.type, AKV_GGUF_VTYPE_I32);
    CHECK_EQ_U64(a.n, 3);
    if (a.n == 3) {
        CHECK_EQ_INT(akv_gguf_arr_int(&a, 0), 7);
        CHECK_EQ_INT(akv_gguf_arr_int(&a, 1), -8);
        CHECK_NEAR(akv_gguf_arr_float(&a, 2), 9.0, 0);
    }
    CHECK_OK(akv_gguf_get_arr(g, "test.arr_str", &a));
    CHECK_EQ_INT(a.type, AKV_GGUF_VTYPE_STRING);
    CHECK_EQ_U64(a.n, 3);
    if (a.n == 3) {
        akv_gguf_str e0 = akv_gguf_arr_str(g, &a, 0), e1 = akv_gguf_arr_str(g, &a, 1),
                     e2 = akv_gguf_arr_str(g, &a, 2);
        CHECK(e0.len == 1 && e0.ptr[0] == 'a');
        CHECK_EQ_U64(e1.len, 0);
        CHECK(e2.len == 7 && !memcmp(e2.ptr, "\xc4\xa0hello", 7));
    }
    /* Index order and the generic view. */
    CHECK_STR(akv_gguf_kv_key(g, 0), "general.architecture");
    size_t idx = 99;
    CHECK_OK(akv_gguf_find_kv(g, "test.f64", &idx));
    CHECK_STR(akv_gguf_kv_key(g, idx), "test.f64");
    akv_gguf_value v = akv_gguf_kv_value(g, idx);
    CHECK_EQ_INT(v.type, AKV_GGUF_VTYPE_F64);
    CHECK_NEAR(v.as.f, -2.25, 0);
    /* Tensors. */
    CHECK_EQ_U64(akv_gguf_n_tensors(g), GGUF_SAMPLE_N_TENSORS);
    for (size_t t = 0; t < akv_gguf_n_tensors(g) && t < GGUF_SAMPLE_N_TENSORS; t++) {
        const akv_gguf_tensor *ti = akv_gguf_tensor_at(g, t), *found = NULL;
        CHECK_STR(ti->name, gguf_sample_tensors[t].name);
        CHECK_EQ_INT(ti->n_dims, 2);
        CHECK_EQ_U64(ti->ne[0], gguf_sample_tensors[t].ne0);
        CHECK_EQ_U64(ti->ne[1], gguf_sample_tensors[t].ne1);
        CHECK_EQ_U64(ti->ne[2], 1);
        CHECK_EQ_INT(ti->type, gguf_sample_tensors[t].type);
        CHECK_EQ_U64(ti->n_elems, gguf_sample_tensors[t].ne0 * gguf_sample_tensors[t].ne1);
        CHECK_EQ_U64(ti->n_bytes, gguf_sample_tensors[t].n_bytes);
        CHECK_EQ_U64(akv_gguf_tensor_row_bytes(ti),
                     gguf_sample_tensors[t].n_bytes / gguf_sample_tensors[t].ne1);
        CHECK_EQ_U64((ti->offset - akv_gguf_data_offset(g)) % alignment, 0);
        CHECK(ti->data == akv_gguf_bytes(g) + ti->offset);
        int n_bad = 0;
        for (uint64_t j = 0; j < ti->n_bytes; j++)
            n_bad += ti->data[j] != (uint8_t)(t * 31 + j * 7);
        CHECK_EQ_INT(n_bad, 0);
        CHECK_OK(akv_gguf_find_tensor(g, ti->name, &found));
        CHECK(found == ti);
    }
    const akv_gguf_tensor *none = NULL;
    CHECK_STATUS(akv_gguf_find_tensor(g, "output.weight", &none), AKV_ENOTFOUND);
    CHECK(akv__gguf_check(g));
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    uint64_t seed = test_seed(20261129);
    akv_log_set(capture_hook, NULL, AKV_LOG_DEBUG);

    TEST_CASE(type_table) {
        CHECK_STR(akv_gguf_type_name(AKV_GGUF_TYPE_Q4_K), "q4_K");
        CHECK(akv_gguf_type_name(4) == NULL);
        CHECK(akv_gguf_type_name(1000) == NULL);
        CHECK_EQ_U64(akv_gguf_type_block_elems(AKV_GGUF_TYPE_Q6_K), 256);
        CHECK_EQ_U64(akv_gguf_type_block_bytes(AKV_GGUF_TYPE_Q6_K), 210);
        CHECK_EQ_U64(akv_gguf_type_block_bytes(AKV_GGUF_TYPE_Q4_1), 20);
        akv_gguf_type t;
        CHECK_OK(akv_gguf_type_from_name("BF16", &t));
        CHECK_EQ_INT(t, AKV_GGUF_TYPE_BF16);
        CHECK_STATUS(akv_gguf_type_from_name("q4_2", &t), AKV_ENOTFOUND);
        size_t n = 0;
        CHECK_OK(akv_gguf_type_bytes(AKV_GGUF_TYPE_Q8_0, 64, &n));
        CHECK_EQ_U64(n, 68);
        CHECK_STATUS(akv_gguf_type_bytes(AKV_GGUF_TYPE_Q8_0, 33, &n), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_type_bytes(AKV_GGUF_TYPE_F32, UINT64_MAX / 2, &n), AKV_EOVERFLOW);
        CHECK_STR(akv_gguf_vtype_name(AKV_GGUF_VTYPE_STRING), "string");
    }

    TEST_CASE(valid_image_reads_back) {
        uint32_t versions[2] = {2, 3}, aligns[3] = {0, 64, 8};
        for (int vi = 0; vi < 2; vi++) {
            for (int ai = 0; ai < 3; ai++) {
                gb b = {0};
                gguf_sample_pos pos;
                gguf_sample(&b, versions[vi], aligns[ai], &pos);
                akv_gguf *g = NULL;
                CHECK_OK(akv_gguf_open_memory(b.p, b.n, &g));
                if (g) check_sample(g, versions[vi], aligns[ai] ? aligns[ai] : 32);
                akv_gguf_close(g);
                gb_free(&b);
            }
        }
    }

    TEST_CASE(corruption_table) {
        for (size_t c = 0; c < AKV_ARRAY_LEN(corruptions); c++) {
            const corruption *k = &corruptions[c];
            gb b = {0};
            gguf_sample_pos pos;
            gguf_sample(&b, 3, k->alignment, &pos);
            for (int e = 0; e < 2; e++)
                if (k->edit[e].width)
                    apply_edit(&b, &pos, k->edit[e].field, k->edit[e].delta, k->edit[e].width,
                               k->edit[e].value);
            cap.n = 0;
            cap.last[0] = '\0';
            akv_status st = open_image(b.p, b.n);
            TEST_CHECK_(st == k->want, "%s: got %s, want %s", k->name, akv_status_name(st),
                        akv_status_name(k->want));
            if (getenv("AKV_TEST_VERBOSE")) printf("  %-40s %s\n", k->name, cap.last);
            TEST_CHECK_(cap.n == 1, "%s: %d log lines, want 1", k->name, cap.n);
            TEST_CHECK_(strstr(cap.last, k->log_has) != NULL, "%s: log line '%s' lacks '%s'",
                        k->name, cap.last, k->log_has);
            TEST_CHECK_(strstr(cap.last, "offset") != NULL, "%s: log line '%s' has no offset",
                            k->name, cap.last);
            gb_free(&b);
        }
    }

    TEST_CASE(duplicate_and_overlong_tensor_names) {
        gb b = {0};
        build_two_tensors(&b, "blk.0.attn_k.weight", "blk.0.attn_k.weight");
        CHECK_STATUS(open_image(b.p, b.n), AKV_EFORMAT);
        CHECK(strstr(cap.last, "duplicates") != NULL);
        gb_free(&b);
        char name64[65], name65[66];
        memset(name64, 'x', 64), name64[64] = '\0';
        memset(name65, 'y', 65), name65[65] = '\0';
        build_two_tensors(&b, name64, "z");
        CHECK_OK(open_image(b.p, b.n));
        gb_free(&b);
        build_two_tensors(&b, "z", name65);
        CHECK_STATUS(open_image(b.p, b.n), AKV_EFORMAT);
        gb_free(&b);
    }

    TEST_CASE(truncated_at_every_offset) {
        uint32_t aligns[2] = {0, 64};
        for (int ai = 0; ai < 2; ai++) {
            gb b = {0};
            gguf_sample_pos pos;
            gguf_sample(&b, 3, aligns[ai], &pos);
            size_t n_bad = 0, first_bad = 0;
            for (size_t cut = 0; cut < b.n; cut++) {
                uint8_t *copy = malloc(cut ? cut : 1); /* exact size: ASan sees any overread */
                memcpy(copy, b.p, cut);
                akv_status st = open_image(copy, cut);
                if (st != AKV_EFORMAT && n_bad++ == 0) first_bad = cut;
                free(copy);
            }
            TEST_CHECK_(n_bad == 0, "%zu truncations not refused with AKV_EFORMAT; first at %zu of %zu",
                        n_bad, first_bad, b.n);
            CHECK_OK(open_image(b.p, b.n));
            gb_free(&b);
        }
    }

    TEST_CASE(random_mutations_never_crash) {
        uint64_t rng = seed;
        gb b = {0};
        gguf_sample_pos pos;
        gguf_sample(&b, 3, 0, &pos);
        static const uint64_t hostile[] = {0,          1,           31,          32,
                                           64,         65535,       1ull << 31,  1ull << 32,
                                           1ull << 62, 1ull << 63,  UINT64_MAX,  UINT64_MAX - 7};
        int n_ok = 0, n_refused = 0;
        for (int it = 0; it < 4000; it++) {
            uint8_t *m = malloc(b.n);
            memcpy(m, b.p, b.n);
            size_t n = b.n;
            int n_edits = 1 + (int)test_rand_below(&rng, 4);
            for (int e = 0; e < n_edits; e++) {
                size_t at = (size_t)test_rand_below(&rng, n);
                if (test_rand_below(&rng, 2) && at + 8 <= n) {
                    uint64_t v = hostile[test_rand_below(&rng, AKV_ARRAY_LEN(hostile))];
                    for (int i = 0; i < 8; i++) m[at + i] = (uint8_t)(v >> (8 * i));
                } else {
                    m[at] = (uint8_t)test_rand(&rng);
                }
            }
            if (test_rand_below(&rng, 4) == 0) n = (size_t)test_rand_below(&rng, n);
            akv_status st = open_image(m, n);
            TEST_CHECK_(st == AKV_OK || st == AKV_EFORMAT || st == AKV_EUNSUPPORTED,
                        "iteration %d: %s", it, akv_status_name(st));
            st == AKV_OK ? n_ok++ : n_refused++;
            free(m);
        }
        printf("  mutations: %d opened, %d refused\n", n_ok, n_refused);
        CHECK(n_refused > 0);
        gb_free(&b);
    }

    TEST_CASE(allocation_failures_leave_nothing) {
        gb b = {0};
        gguf_sample_pos pos;
        gguf_sample(&b, 3, 0, &pos);
        CHECK(open_failing_each_allocation(&b, NULL) >= 5);
        gb_free(&b);
    }

    TEST_CASE(files_on_disk) {
        gb b = {0};
        char path[32];
        int fd = sample_file(&b, 0, path);
        if (!CHECK(fd >= 0)) break;
        akv_gguf *g = NULL;
        CHECK_OK(akv_gguf_open(path, &g));
        if (g) check_sample(g, 3, 32);
        akv_gguf_close(g);
        /* A file cut short on disk. */
        CHECK_EQ_INT(ftruncate(fd, (off_t)(b.n - 1)), 0);
        g = NULL;
        cap.n = 0;
        CHECK_STATUS(akv_gguf_open(path, &g), AKV_EFORMAT);
        CHECK(g == NULL);
        CHECK_EQ_INT(cap.n, 1); /* one line, naming the file, the tensor and the field */
        CHECK(strstr(cap.last, path) && strstr(cap.last, "output_norm.weight") &&
              strstr(cap.last, "offset"));
        CHECK_EQ_INT(ftruncate(fd, 0), 0);
        CHECK_STATUS(akv_gguf_open(path, &g), AKV_EFORMAT);
        close(fd);
        unlink(path);
        CHECK_STATUS(akv_gguf_open(path, &g), AKV_EIO);
        CHECK(strstr(cap.last, path) != NULL);
        CHECK_STATUS(akv_gguf_open("/tmp", &g), AKV_EIO);
        CHECK(g == NULL);
        gb_free(&b);
    }

    TEST_CASE(file_opens_agree_with_memory_opens_at_every_truncation) {
        /* A file's metadata is read in growing prefixes and parsed again until it is all
         * held: with the first read at 24 bytes (every parse of the sample starts over
         * several times), at 100, and at the default, a file cut at every offset must give
         * the memory open's status and its one message, the path in place of "(memory)" */
        gb b = {0};
        char path[32];
        int fd = sample_file(&b, 64, path);
        if (!CHECK(fd >= 0)) break;
        const uint64_t firsts[3] = {24, 100, akv__gguf_meta_first_read};
        const uint64_t saved = akv__gguf_meta_first_read;
        size_t n_bad = 0;
        for (int fi = 0; fi < 3; fi++) {
            akv__gguf_meta_first_read = firsts[fi];
            for (size_t cut = 24; cut <= b.n; cut++) {
                if (!CHECK(write_whole(fd, b.p, cut))) break;
                uint8_t *copy = malloc(cut);
                memcpy(copy, b.p, cut);
                cap.n = 0;
                akv_status sm = open_image(copy, cut);
                char want[1024];
                replace_all(cap.last, "(memory)", path, want, sizeof want);
                int n_mem = cap.n;
                cap.n = 0, cap.last[0] = '\0';
                akv_gguf *g = NULL;
                akv_status sf = akv_gguf_open(path, &g);
                bool same = sf == sm && cap.n == n_mem && (sm == AKV_OK || !strcmp(cap.last, want));
                if (sf == AKV_OK) {
                    CHECK(akv__gguf_check(g));
                    if (cut == b.n) check_sample(g, 3, 64);
                    akv_gguf_close(g);
                }
                if (!same && n_bad++ < 3)
                    printf("  first read %llu, cut %zu: file %s (%d lines) '%s', memory %s '%s'\n",
                           (unsigned long long)firsts[fi], cut, akv_status_name(sf), cap.n,
                           cap.last, akv_status_name(sm), want);
                free(copy);
            }
        }
        akv__gguf_meta_first_read = saved;
        TEST_CHECK_(n_bad == 0, "%zu file opens differ from the memory open", n_bad);
        close(fd);
        unlink(path);
        gb_free(&b);
    }

    TEST_CASE(file_open_allocation_failures_leave_nothing) {
        gb b = {0};
        char path[32];
        int fd = sample_file(&b, 0, path);
        if (!CHECK(fd >= 0)) break;
        const uint64_t saved = akv__gguf_meta_first_read;
        akv__gguf_meta_first_read = 64; /* the retries' allocations fail too */
        CHECK(open_failing_each_allocation(&b, path) >= 10);
        akv__gguf_meta_first_read = saved;
        close(fd);
        unlink(path);
        gb_free(&b);
    }

    TEST_CASE(a_fifo_is_refused_without_blocking) {
        /* open(2) of a FIFO without a writer blocks; the reader must refuse it at once (an
         * alarm turns a hang into a failure) */
        char dir[] = "/tmp/akv_test_fifo_XXXXXX";
        if (!CHECK(mkdtemp(dir) != NULL)) break;
        char path[64];
        snprintf(path, sizeof path, "%s/model.gguf", dir);
        if (!CHECK(mkfifo(path, 0600) == 0)) break;
        alarm(10);
        akv_gguf *g = NULL;
        cap.n = 0;
        CHECK_STATUS(akv_gguf_open(path, &g), AKV_EIO);
        alarm(0);
        CHECK(g == NULL);
        CHECK(strstr(cap.last, path) && strstr(cap.last, "not a regular file"));
        unlink(path);
        rmdir(dir);
    }

    TEST_CASE(tensor_reads_after_the_file_shrinks_fail_cleanly) {
        /* the file is cut under an open reader (an in-place copy over a model in use):
         * reads through akv_gguf_tensor_read end in AKV_EIO naming the tensor, not SIGBUS */
        gb b = {0};
        char path[32];
        int fd = sample_file(&b, 0, path);
        if (!CHECK(fd >= 0)) break;
        akv_gguf *g = NULL, *gm = NULL;
        CHECK_OK(akv_gguf_open(path, &g));
        CHECK_OK(akv_gguf_open_memory(b.p, b.n, &gm));
        if (!g || !gm) break;
        const akv_gguf_tensor *t = NULL;
        for (size_t i = 0; i < akv_gguf_n_tensors(g); i++) {
            const akv_gguf_tensor *u = akv_gguf_tensor_at(g, i);
            if (!t || u->n_bytes > t->n_bytes) t = u;
        }
        const akv_gguf_tensor *tm = NULL;
        CHECK_OK(akv_gguf_find_tensor(gm, t->name, &tm));
        uint8_t *x = malloc(t->n_bytes), *y = malloc(t->n_bytes);
        CHECK_OK(akv_gguf_tensor_read(g, t, 0, x, t->n_bytes));
        CHECK_OK(akv_gguf_tensor_read(gm, tm, 0, y, t->n_bytes));
        CHECK(!memcmp(x, y, t->n_bytes) && !memcmp(x, t->data, t->n_bytes));
        CHECK_OK(akv_gguf_tensor_read(g, t, 3, x, t->n_bytes - 3));
        CHECK(!memcmp(x, y + 3, t->n_bytes - 3));
        CHECK_STATUS(akv_gguf_tensor_read(g, t, 1, x, t->n_bytes), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_tensor_read(g, t, t->n_bytes + 1, x, 0), AKV_EINVAL);
        CHECK_EQ_INT(ftruncate(fd, (off_t)t->offset + 1), 0);
        cap.n = 0;
        CHECK_STATUS(akv_gguf_tensor_read(g, t, 0, x, t->n_bytes), AKV_EIO);
        CHECK_EQ_INT(cap.n, 1);
        CHECK(strstr(cap.last, path) && strstr(cap.last, t->name) &&
              strstr(cap.last, "changed after it was opened"));
        /* the metadata was read at open: still whole (the mapped data is not read here) */
        CHECK(akv__gguf_check(g));
        akv_gguf_str arch;
        CHECK_OK(akv_gguf_get_str(g, "general.architecture", &arch));
        CHECK(arch.len == 5 && !memcmp(arch.ptr, "llama", 5));
        free(x), free(y);
        akv_gguf_close(g);
        akv_gguf_close(gm);
        close(fd);
        unlink(path);
        gb_free(&b);
    }

    akv_log_set(NULL, NULL, AKV_LOG_WARN);
    return test_finish();
}
