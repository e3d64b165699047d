/*
 * gguf/gguf_impl.h — what the GGUF reader shares with the rest of src/gguf (writer,
 * synthesiser): the parsed index, little-endian loads, the raw byte span of a kv, and the
 * validity walker.
 */
#ifndef AKV_GGUF_IMPL_H
#define AKV_GGUF_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/gguf.h"

#define AKV_GGUF_MAGIC "GGUF"
#define AKV_GGUF_DEFAULT_ALIGNMENT 32
#define AKV_GGUF_MAX_KEY 65535 /* bytes in a key */

/* Little-endian loads and stores at any alignment (the format is packed). */
static inline uint16_t akv__gguf_ld16(const uint8_t *p) {
    return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}
static inline uint32_t akv__gguf_ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t akv__gguf_ld64(const uint8_t *p) {
    return (uint64_t)akv__gguf_ld32(p) | (uint64_t)akv__gguf_ld32(p + 4) << 32;
}
static inline void akv__gguf_st16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}
static inline void akv__gguf_st32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void akv__gguf_st64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Bytes of a file's metadata akv_gguf_open reads first (1 MiB); a parse that needs more reads
 * four times as much and starts again. Tests lower it to make every file take that path. */
extern uint64_t akv__gguf_meta_first_read;

/* The parsed index. Offsets are file offsets; neither image is ever written. */
typedef struct gguf_kv {
    const char *key;         /* in the names arena */
    uint64_t pos;            /* file offset of the kv (its key length field) */
    uint64_t end;            /* file offset one past its value */
    uint64_t key_pos;        /* file offset of the key bytes */
    uint32_t key_len;        /* bytes */
    akv_gguf_vtype type;     /* value type */
    akv_gguf_vtype elem;     /* arrays: element type */
    uint64_t n;              /* strings: bytes; arrays: elements; scalars: 1 */
    uint64_t data_pos;       /* file offset of the scalar, the string bytes or element 0 */
    size_t first_str;        /* string arrays: index of element 0 in str_pos */
} gguf_kv;

typedef struct gguf_tensor {
    akv_gguf_tensor pub;
    uint64_t pos;      /* file offset of the tensor info */
    uint64_t offset_pos; /* file offset of its offset field */
    uint64_t name_pos; /* file offset of the name bytes */
    uint32_t name_len;
} gguf_tensor;

struct akv_gguf {
    const uint8_t *meta; /* the metadata image: the file's first n_meta bytes, read into
                            memory (a file), or the caller's bytes (a memory image) */
    uint64_t n_meta;     /* >= every metadata byte's offset + 1; n_bytes for a memory image */
    bool meta_owned;     /* meta was allocated by us (freed at close) */
    const uint8_t *base; /* the tensor image: a private read-only mapping, or the caller's
                            bytes; tensor data pointers point into it */
    uint64_t n_bytes;    /* of the file (or the memory image) */
    bool mapped;         /* base was mmap'ed by us (munmap at close) */
    int fd;              /* a file: kept open for akv_gguf_tensor_read; -1 for memory */
    char *path;          /* a file's path, for messages; NULL for memory */
    uint32_t version;
    size_t alignment;
    uint64_t data_offset;
    gguf_kv *kvs; /* [n_kv] in file order */
    size_t n_kv;
    gguf_tensor *tensors; /* [n_tensors] in file order */
    size_t n_tensors;
    uint64_t *str_pos; /* file offsets (length fields) of every string-array element */
    size_t n_str, cap_str;
    char *names;        /* NUL-terminated keys then tensor names */
    size_t *kv_slots;   /* open addressing, [cap_slots]: 0 empty, else kv index + 1 */
    size_t *t_slots;    /* the same for tensor names */
    size_t cap_kv_slots, cap_t_slots;
};

/* The slot of `name` in the key table (tensors false) or the tensor-name table: the one
 * holding it, or the empty one where it would go. */
size_t akv__gguf_slot(const akv_gguf *g, bool tensors, const char *name);

/* Bytes of one scalar of a fixed-size vtype; 0 for STRING, ARRAY and invalid values. */
size_t akv__gguf_vtype_size(uint32_t vtype);

/* The encoded bytes of kv `idx` exactly as in the file: key, value type and value. A
 * writer copies them verbatim to carry a kv (a whole tokenizer) from one file to another. */
void akv__gguf_kv_span(const akv_gguf *g, size_t idx, const uint8_t **out_p, size_t *out_n);

/* The synthetic weights (akv/gguf_synth.h): out[j] = value of element first + j of tensor k
 * of a model written with `seed`; `norm` selects the norm-weight distribution. */
void akv__gguf_synth_values(uint64_t seed, size_t k, bool norm, uint64_t first, float *out,
                            size_t n);

/* Validity walker: re-checks every invariant of an open file (akv/gguf.h) from the parsed
 * index. Returns false and logs the first broken one. Tests call it after every open. */
bool akv__gguf_check(const akv_gguf *g);

#endif
