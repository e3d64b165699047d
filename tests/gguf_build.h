/*
 * tests/gguf_build.h — builds GGUF images byte by byte for the reader's tests and the fuzz
 * seeds, including images no valid writer would produce (hostile counts, bad types).
 *
 * gguf_sample() builds one valid image that has a kv of every value type and tensors of
 * several ggml types, and records the file offset of every field a corruption test wants
 * to hit (gguf_sample_pos).
 */
#ifndef AKV_TEST_GGUF_BUILD_H
#define AKV_TEST_GGUF_BUILD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct gb {
    uint8_t *p;
    size_t n, cap;
} gb;

static inline void gb_bytes(gb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static inline void gb_u8(gb *b, uint8_t v) {
    gb_bytes(b, &v, 1);
}
static inline void gb_u16(gb *b, uint16_t v) {
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    gb_bytes(b, x, 2);
}
static inline void gb_u32(gb *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    gb_bytes(b, x, 4);
}
static inline void gb_u64(gb *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    gb_bytes(b, x, 8);
}
static inline void gb_f32(gb *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    gb_u32(b, u);
}
static inline void gb_f64(gb *b, double f) {
    uint64_t u;
    memcpy(&u, &f, 8);
    gb_u64(b, u);
}
static inline void gb_str(gb *b, const char *s) {
    gb_u64(b, strlen(s));
    gb_bytes(b, s, strlen(s));
}
static inline void gb_pad(gb *b, size_t align) {
    while (b->n % align) gb_u8(b, 0);
}
static inline void gb_put64(gb *b, size_t at, uint64_t v) {
    for (int i = 0; i < 8; i++) b->p[at + i] = (uint8_t)(v >> (8 * i));
}
static inline void gb_put32(gb *b, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) b->p[at + i] = (uint8_t)(v >> (8 * i));
}
static inline void gb_free(gb *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Offsets of the fields of the sample image. */
typedef struct gguf_sample_pos {
    size_t version, n_tensors, n_kv;
    size_t kv[16];           /* start of each kv (its key length) */
    size_t kv_type[16];      /* each kv's value type field */
    size_t str_len;          /* length of the string value of "test.str" */
    size_t arr_str_len;      /* length of the string array "test.arr_str" */
    size_t arr_str_elem1;    /* length field of element 1 of that array */
    size_t arr_i32_type;     /* element type of "test.arr_i32" */
    size_t arr_i32_len;      /* its length */
    size_t bool_val;         /* the byte of "test.bool" */
    size_t align_val;        /* the value of general.alignment (when written) */
    size_t tensor[8];        /* start of each tensor info (its name length) */
    size_t t_n_dims[8], t_ne0[8], t_ne1[8], t_type[8], t_offset[8];
    size_t infos_end;        /* one past the last tensor info */
    size_t data_offset;      /* start of the data section */
    size_t n_kv_written, n_tensors_written;
} gguf_sample_pos;

enum { GGUF_SAMPLE_N_TENSORS = 4 };

/* The sample's tensors: name, ggml type, ne0, ne1 (bytes follow from the type). */
static const struct {
    const char *name;
    uint32_t type;
    uint64_t ne0, ne1;
    uint64_t n_bytes;
} gguf_sample_tensors[GGUF_SAMPLE_N_TENSORS] = {
    {"token_embd.weight", 30 /* bf16 */, 16, 3, 16 * 3 * 2},
    {"blk.0.attn_q.weight", 8 /* q8_0 */, 64, 2, 2 * 2 * 34},
    {"blk.0.ffn_down.weight", 12 /* q4_K */, 256, 1, 144},
    {"output_norm.weight", 0 /* f32 */, 16, 1, 64},
};

/* Builds the sample: version 2 or 3; alignment 0 = no general.alignment key (32). Tensor
 * data byte j of tensor i is (uint8_t)(i * 31 + j * 7). The last tensor ends at the end of
 * the image, so every truncation cuts something. */
static inline void gguf_sample(gb *b, uint32_t version, uint32_t alignment, gguf_sample_pos *pos) {
    memset(pos, 0, sizeof *pos);
    size_t align = alignment ? alignment : 32;
    gb_bytes(b, "GGUF", 4);
    pos->version = b->n;
    gb_u32(b, version);
    pos->n_tensors = b->n;
    gb_u64(b, GGUF_SAMPLE_N_TENSORS);
    pos->n_kv = b->n;
    gb_u64(b, 0); /* patched below */
    size_t k = 0;
#define KV(key, vtype)                                                                             \
    pos->kv[k] = b->n;                                                                             \
    gb_str(b, key);                                                                                \
    pos->kv_type[k++] = b->n;                                                                      \
    gb_u32(b, vtype)
    KV("general.architecture", 8);
    pos->str_len = b->n;
    gb_str(b, "llama");
    if (alignment) {
        KV("general.alignment", 4);
        pos->align_val = b->n;
        gb_u32(b, alignment);
    }
    KV("test.u8", 0); gb_u8(b, 200);
    KV("test.i8", 1); gb_u8(b, (uint8_t)-5);
    KV("test.u16", 2); gb_u16(b, 60000);
    KV("test.i16", 3); gb_u16(b, (uint16_t)-300);
    KV("test.u32", 4); gb_u32(b, 4000000000u);
    KV("test.i32", 5); gb_u32(b, (uint32_t)-70000);
    KV("test.f32", 6); gb_f32(b, 1.5f);
    KV("test.bool", 7); pos->bool_val = b->n; gb_u8(b, 1);
    KV("test.u64", 10); gb_u64(b, 1ull << 40);
    KV("test.i64", 11); gb_u64(b, (uint64_t)-(1ll << 40));
    KV("test.f64", 12); gb_f64(b, -2.25);
    KV("test.arr_i32", 9);
    pos->arr_i32_type = b->n; gb_u32(b, 5);
    pos->arr_i32_len = b->n; gb_u64(b, 3);
    gb_u32(b, 7); gb_u32(b, (uint32_t)-8); gb_u32(b, 9);
    KV("test.arr_str", 9);
    gb_u32(b, 8);
    pos->arr_str_len = b->n; gb_u64(b, 3);
    gb_str(b, "a");
    pos->arr_str_elem1 = b->n;
    gb_str(b, "");
    gb_str(b, "\xc4\xa0hello");
#undef KV
    pos->n_kv_written = k;
    gb_put64(b, pos->n_kv, k);
    uint64_t rel = 0;
    for (int i = 0; i < GGUF_SAMPLE_N_TENSORS; i++) {
        pos->tensor[i] = b->n;
        gb_str(b, gguf_sample_tensors[i].name);
        pos->t_n_dims[i] = b->n;
        gb_u32(b, 2);
        pos->t_ne0[i] = b->n;
        gb_u64(b, gguf_sample_tensors[i].ne0);
        pos->t_ne1[i] = b->n;
        gb_u64(b, gguf_sample_tensors[i].ne1);
        pos->t_type[i] = b->n;
        gb_u32(b, gguf_sample_tensors[i].type);
        pos->t_offset[i] = b->n;
        gb_u64(b, rel);
        rel += (gguf_sample_tensors[i].n_bytes + align - 1) / align * align;
    }
    pos->n_tensors_written = GGUF_SAMPLE_N_TENSORS;
    pos->infos_end = b->n;
    gb_pad(b, align);
    pos->data_offset = b->n;
    for (int i = 0; i < GGUF_SAMPLE_N_TENSORS; i++) {
        for (uint64_t j = 0; j < gguf_sample_tensors[i].n_bytes; j++)
            gb_u8(b, (uint8_t)(i * 31 + j * 7));
        if (i + 1 < GGUF_SAMPLE_N_TENSORS) gb_pad(b, align);
    }
}

#endif
