/*
 * akv/gguf.h — reading GGUF model files (versions 2 and 3), safely.
 *
 * A GGUF file is, in order (all integers little-endian, fields packed without padding):
 *
 *     magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *     n_kv x      { string key | u32 value type | value }
 *     n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml type | u64 offset }
 *     zero padding to a multiple of ALIGNMENT
 *     tensor data: each tensor at data_offset + its offset (a multiple of ALIGNMENT)
 *
 * where a string is { u64 length | bytes, no terminator }, a value is a scalar of its type,
 * a string, or an array { u32 element type | u64 count | elements }, and ALIGNMENT is the
 * u32 value of the key `general.alignment` (32 when absent). Version 1 (32-bit counts) is
 * obsolete and refused; versions 2 and 3 share this layout.
 *
 * Glossary
 *   kv          one metadata key-value pair; found by key or by index (file order).
 *   vtype       the type of a metadata value (akv_gguf_vtype).
 *   ggml type   the element encoding of a tensor (akv_gguf_type): plain (F32, F16, BF16,
 *               I8...) or a block quantisation of `block_elems` elements in `block_bytes`.
 *   ne          a tensor's extents, ggml order: ne[0] is the contiguous (fastest-varying)
 *               dimension, the row length; a weight of a matmul y = W x with x of length
 *               n_in and y of length n_out has ne = {n_in, n_out}.
 *   data_offset the file offset of the tensor data section (after the alignment padding).
 *
 * Invariants of an open file (every one is checked at open; a file that breaks one is
 * refused with AKV_EFORMAT and one error log line naming the field and its file offset):
 *   - every count, length and offset lies inside the file; nothing is allocated before the
 *     count that sizes it has been bounded by the bytes left in the file, so a hostile file
 *     cannot make the reader allocate more than a small multiple of its own size;
 *   - keys are 1..65535 printable ASCII bytes and unique; tensor names are 1..64 bytes
 *     without NUL and unique; bools are 0 or 1; general.alignment, when present, is a u32
 *     power of two;
 *   - a tensor has 1..4 dims, a known ggml type, ne[0] a multiple of its block size, an
 *     element count and byte size that fit in int64, an offset that is a multiple of
 *     ALIGNMENT, its bytes inside the file, and no byte shared with another tensor.
 * Nested arrays (an array of arrays) are valid GGUF but refused with AKV_EUNSUPPORTED;
 * no known model uses them.
 *
 * Ownership: every pointer a getter returns (keys, names, akv_gguf_str bytes, array data,
 * tensor data, tensor records) is borrowed from the akv_gguf and valid until
 * akv_gguf_close(). Read-only, unaligned, little-endian. A file's metadata is read into
 * memory at open; its tensor data is mapped (`data`), so a file that shrinks while it is
 * open faults (SIGBUS) at a read of `data` past its new end: akv_gguf_tensor_read reads
 * through the file instead and turns that into AKV_EIO naming the tensor (the model loader
 * uses it).
 *
 * Thread-safety: an open akv_gguf is immutable; every getter may be called from any
 * number of threads at once. Open and close are not thread-safe for the same object.
 */
#ifndef AKV_GGUF_H
#define AKV_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_gguf akv_gguf;

/* ---- types -------------------------------------------------------------------------------- */

/* Metadata value types (numbering fixed by the file format). */
typedef enum akv_gguf_vtype {
    AKV_GGUF_VTYPE_U8 = 0,
    AKV_GGUF_VTYPE_I8 = 1,
    AKV_GGUF_VTYPE_U16 = 2,
    AKV_GGUF_VTYPE_I16 = 3,
    AKV_GGUF_VTYPE_U32 = 4,
    AKV_GGUF_VTYPE_I32 = 5,
    AKV_GGUF_VTYPE_F32 = 6,
    AKV_GGUF_VTYPE_BOOL = 7,
    AKV_GGUF_VTYPE_STRING = 8,
    AKV_GGUF_VTYPE_ARRAY = 9,
    AKV_GGUF_VTYPE_U64 = 10,
    AKV_GGUF_VTYPE_I64 = 11,
    AKV_GGUF_VTYPE_F64 = 12,
    AKV_GGUF_VTYPE_COUNT
} akv_gguf_vtype;

/* Tensor element encodings (ggml_type; numbering fixed by the file format). Gaps are
 * removed types; a file naming one is refused. */
typedef enum akv_gguf_type {
    AKV_GGUF_TYPE_F32 = 0,
    AKV_GGUF_TYPE_F16 = 1,
    AKV_GGUF_TYPE_Q4_0 = 2,
    AKV_GGUF_TYPE_Q4_1 = 3,
    AKV_GGUF_TYPE_Q5_0 = 6,
    AKV_GGUF_TYPE_Q5_1 = 7,
    AKV_GGUF_TYPE_Q8_0 = 8,
    AKV_GGUF_TYPE_Q8_1 = 9,
    AKV_GGUF_TYPE_Q2_K = 10,
    AKV_GGUF_TYPE_Q3_K = 11,
    AKV_GGUF_TYPE_Q4_K = 12,
    AKV_GGUF_TYPE_Q5_K = 13,
    AKV_GGUF_TYPE_Q6_K = 14,
    AKV_GGUF_TYPE_Q8_K = 15,
    AKV_GGUF_TYPE_IQ2_XXS = 16,
    AKV_GGUF_TYPE_IQ2_XS = 17,
    AKV_GGUF_TYPE_IQ3_XXS = 18,
    AKV_GGUF_TYPE_IQ1_S = 19,
    AKV_GGUF_TYPE_IQ4_NL = 20,
    AKV_GGUF_TYPE_IQ3_S = 21,
    AKV_GGUF_TYPE_IQ2_S = 22,
    AKV_GGUF_TYPE_IQ4_XS = 23,
    AKV_GGUF_TYPE_I8 = 24,
    AKV_GGUF_TYPE_I16 = 25,
    AKV_GGUF_TYPE_I32 = 26,
    AKV_GGUF_TYPE_I64 = 27,
    AKV_GGUF_TYPE_F64 = 28,
    AKV_GGUF_TYPE_IQ1_M = 29,
    AKV_GGUF_TYPE_BF16 = 30,
    AKV_GGUF_TYPE_TQ1_0 = 34,
    AKV_GGUF_TYPE_TQ2_0 = 35,
    AKV_GGUF_TYPE_MXFP4 = 39,
    AKV_GGUF_TYPE_COUNT = 40 /* one past the largest value */
} akv_gguf_type;

/* "f32", "q4_K", "bf16", ...; NULL for a value that is not a known type. */
const char *akv_gguf_type_name(uint32_t type);

/* Elements per block (1 for plain types, 32 for Q4_0, 256 for K-quants) and bytes per
 * block; 0 for a value that is not a known type. */
size_t akv_gguf_type_block_elems(uint32_t type);
size_t akv_gguf_type_block_bytes(uint32_t type);

/* The type named `name` (case-insensitive: "q8_0", "BF16"). AKV_ENOTFOUND if none. */
akv_status akv_gguf_type_from_name(const char *name, akv_gguf_type *out);

/* Bytes taken by `n_elems` elements of `type`: AKV_EINVAL when the type is unknown or
 * n_elems is not a multiple of its block size, AKV_EOVERFLOW when it overflows size_t. */
akv_status akv_gguf_type_bytes(uint32_t type, uint64_t n_elems, size_t *out);

/* "u8", "string", "array", ...; "?" for an invalid value. */
const char *akv_gguf_vtype_name(uint32_t vtype);

/* ---- opening ------------------------------------------------------------------------------ */

/* Reads the metadata of the file at `path` into memory, validates all of it (header, every
 * kv, the tensor index, every tensor's byte range) and maps the file read-only for tensor
 * data, which is not read. Returns AKV_EIO if it is not a regular file (a FIFO is refused
 * without blocking) or cannot be opened, read or mapped (logged with errno), AKV_EFORMAT if
 * it is malformed, AKV_EUNSUPPORTED for a nested array, AKV_ENOMEM. *out is set only on
 * success. */
akv_status akv_gguf_open(const char *path, akv_gguf **out);

/* The same over `n_bytes` bytes at `data`, which the caller keeps alive and unchanged
 * until akv_gguf_close() (tests and fuzzing; data read from elsewhere). */
akv_status akv_gguf_open_memory(const void *data, size_t n_bytes, akv_gguf **out);

/* Unmaps and frees. NULL is a no-op. Every borrowed pointer dies here. */
void akv_gguf_close(akv_gguf *g);

uint32_t akv_gguf_version(const akv_gguf *g);     /* 2 or 3 */
size_t akv_gguf_alignment(const akv_gguf *g);     /* bytes; 32 unless general.alignment */
uint64_t akv_gguf_data_offset(const akv_gguf *g); /* file offset of the tensor data */
uint64_t akv_gguf_file_bytes(const akv_gguf *g);  /* size of the file (or memory image) */
const uint8_t *akv_gguf_bytes(const akv_gguf *g); /* the whole image, file_bytes long */

/* ---- metadata ----------------------------------------------------------------------------- */

/* A string inside the file: `len` bytes at `ptr`, NOT NUL-terminated (use "%.*s"). */
typedef struct akv_gguf_str {
    const char *ptr;
    size_t len;
} akv_gguf_str;

/* An array value. For fixed-size element types, `data` is `n` packed little-endian
 * elements (unaligned: read them with the akv_gguf_arr_* helpers or memcpy). For
 * STRING elements, use akv_gguf_arr_str(). */
typedef struct akv_gguf_arr {
    akv_gguf_vtype type; /* element type; never ARRAY */
    uint64_t n;          /* number of elements */
    const void *data;    /* first element in the file */
    size_t kv_idx;       /* the kv this array belongs to (for akv_gguf_arr_str) */
} akv_gguf_arr;

/* A typed view of one value. Which member is set follows `type`: U8/U16/U32/U64 -> u,
 * I8/I16/I32/I64 -> i, F32/F64 -> f, BOOL -> b, STRING -> str, ARRAY -> arr. */
typedef struct akv_gguf_value {
    akv_gguf_vtype type;
    union {
        uint64_t u;
        int64_t i;
        double f;
        bool b;
        akv_gguf_str str;
        akv_gguf_arr arr;
    } as;
} akv_gguf_value;

size_t akv_gguf_n_kv(const akv_gguf *g);

/* The kv at `idx` (file order, idx < akv_gguf_n_kv): its key (NUL-terminated) and value.
 * An idx out of range is a programmer error (assertion). */
const char *akv_gguf_kv_key(const akv_gguf *g, size_t idx);
akv_gguf_value akv_gguf_kv_value(const akv_gguf *g, size_t idx);

/* The index of `key`; AKV_ENOTFOUND (not logged) when absent. O(1) (hashed). */
akv_status akv_gguf_find_kv(const akv_gguf *g, const char *key, size_t *out_idx);

/* Typed getters by key. Each returns AKV_ENOTFOUND (not logged) when the key is absent,
 * AKV_EFORMAT (logged, naming the key and both types) when the value has another type or
 * does not fit the result:
 *   get_u64  any integer type with a value >= 0       get_u32  the same, <= UINT32_MAX
 *   get_i64  any integer type with a value <= INT64_MAX
 *   get_f64  F32 or F64                               get_f32  F32 or F64 (rounded)
 *   get_bool BOOL    get_str STRING    get_arr ARRAY (any element type)                */
akv_status akv_gguf_get_u64(const akv_gguf *g, const char *key, uint64_t *out);
akv_status akv_gguf_get_u32(const akv_gguf *g, const char *key, uint32_t *out);
akv_status akv_gguf_get_i64(const akv_gguf *g, const char *key, int64_t *out);
akv_status akv_gguf_get_f64(const akv_gguf *g, const char *key, double *out);
akv_status akv_gguf_get_f32(const akv_gguf *g, const char *key, float *out);
akv_status akv_gguf_get_bool(const akv_gguf *g, const char *key, bool *out);
akv_status akv_gguf_get_str(const akv_gguf *g, const char *key, akv_gguf_str *out);
akv_status akv_gguf_get_arr(const akv_gguf *g, const char *key, akv_gguf_arr *out);

/* Element i of an array (i < a->n; out of range or the wrong element type is a programmer
 * error). O(1) for every element type, strings included.
 *   arr_str    STRING elements
 *   arr_int    any integer or BOOL element, as int64 (a U64 above INT64_MAX wraps)
 *   arr_float  F32 or F64 elements, or integers converted                               */
akv_gguf_str akv_gguf_arr_str(const akv_gguf *g, const akv_gguf_arr *a, uint64_t i);
int64_t akv_gguf_arr_int(const akv_gguf_arr *a, uint64_t i);
double akv_gguf_arr_float(const akv_gguf_arr *a, uint64_t i);

/* ---- tensors ------------------------------------------------------------------------------ */

#define AKV_GGUF_MAX_DIMS 4
#define AKV_GGUF_MAX_NAME 64 /* bytes in a tensor name, without terminator */

typedef struct akv_gguf_tensor {
    const char *name;               /* NUL-terminated, "blk.0.attn_q.weight" */
    uint32_t n_dims;                /* 1..4 */
    uint64_t ne[AKV_GGUF_MAX_DIMS]; /* extents, ggml order (ne[0] contiguous); 1 past n_dims */
    akv_gguf_type type;             /* element encoding */
    uint64_t n_elems;               /* product of ne */
    uint64_t n_bytes;               /* bytes of data: n_elems / block_elems * block_bytes */
    uint64_t offset;                /* file offset of the data (data_offset + relative) */
    const uint8_t *data;            /* the data in the mapping (offset bytes from the start) */
} akv_gguf_tensor;

size_t akv_gguf_n_tensors(const akv_gguf *g);

/* The tensor at `idx` (file order; idx < akv_gguf_n_tensors, else assertion). */
const akv_gguf_tensor *akv_gguf_tensor_at(const akv_gguf *g, size_t idx);

/* The tensor named `name`; AKV_ENOTFOUND (not logged) when absent. O(1) (hashed). */
akv_status akv_gguf_find_tensor(const akv_gguf *g, const char *name, const akv_gguf_tensor **out);

/* Bytes of one row (ne[0] elements) of tensor t. */
uint64_t akv_gguf_tensor_row_bytes(const akv_gguf_tensor *t);

/* Copies bytes [off, off + n) of tensor t's data into dst: from the file with pread (a file
 * opened by path), so a file that changed since it was opened gives AKV_EIO (logged, naming
 * the tensor and the file's size now) instead of a fault; from memory for a memory image.
 * AKV_EINVAL for a range outside the tensor. Safe from any number of threads. */
akv_status akv_gguf_tensor_read(const akv_gguf *g, const akv_gguf_tensor *t, uint64_t off,
                                void *dst, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* AKV_GGUF_H */
