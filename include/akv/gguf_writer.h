/*
 * akv/gguf_writer.h — writing GGUF files (version 3) that stream their tensor data.
 *
 * A writer has two phases. In the first, metadata and tensor declarations (name, type,
 * extents) are added in file order and kept in memory. The first akv_gguf_writer_write()
 * writes the header, the metadata and the tensor index, and from then on the caller streams
 * the tensors' bytes in declaration order, in pieces of any size; the writer inserts the
 * alignment padding between tensors. Memory use is the metadata and index only, whatever
 * the size of the tensors (a 16 GB file streams through the caller's buffer).
 *
 * The file is written as "<path>.partial" and renamed to `path` by a successful
 * akv_gguf_writer_finish(); destroying an unfinished writer removes the partial file, so a
 * reader never sees a half-written model under the final name.
 *
 * Invariants (each refused with AKV_EINVAL, logged, nothing changed): keys are 1..65535
 * printable ASCII bytes and unique, tensor names 1..64 bytes without NUL and unique;
 * general.alignment is set through the params, never as a key; a tensor has 1..4 extents,
 * a known type, ne[0] a multiple of the type's block size and a size that fits int64.
 * Calls out of phase (metadata after data began, data beyond the declared bytes, finish
 * before all bytes) give AKV_ESTATE. A failed write gives AKV_EIO and fails the writer:
 * every later call returns AKV_EIO.
 *
 * Thread-safety: a writer is used by one thread at a time.
 */
#ifndef AKV_GGUF_WRITER_H
#define AKV_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "akv/gguf.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_gguf_writer akv_gguf_writer;

typedef struct akv_gguf_writer_params {
    uint32_t alignment; /* bytes, a power of two in 8..2^30; 0 = 32. Written as the key
                           general.alignment when it is not 32. */
} akv_gguf_writer_params;

akv_gguf_writer_params akv_gguf_writer_default_params(void);

/* Creates "<path>.partial" for writing. params NULL = defaults. AKV_EIO (logged with
 * errno) if the file cannot be created, AKV_EINVAL for bad params. */
akv_status akv_gguf_writer_create(const char *path, const akv_gguf_writer_params *params,
                                  akv_gguf_writer **out);

/* Closes; an unfinished file is removed. NULL is a no-op. */
void akv_gguf_writer_destroy(akv_gguf_writer *w);

/* ---- phase 1: metadata, in file order ---------------------------------------------------- */

/* Adds a kv holding `v`: any scalar, a string (v->as.str), or an array of a fixed-size
 * element type (v->as.arr: n packed little-endian elements at data). String arrays go
 * through akv_gguf_writer_add_arr_str. */
akv_status akv_gguf_writer_add_value(akv_gguf_writer *w, const char *key, const akv_gguf_value *v);

/* Conveniences for the common scalar types; `s` is NUL-terminated. */
akv_status akv_gguf_writer_add_u32(akv_gguf_writer *w, const char *key, uint32_t u);
akv_status akv_gguf_writer_add_u64(akv_gguf_writer *w, const char *key, uint64_t u);
akv_status akv_gguf_writer_add_f32(akv_gguf_writer *w, const char *key, float f);
akv_status akv_gguf_writer_add_str(akv_gguf_writer *w, const char *key, const char *s);

/* An array of n strings. */
akv_status akv_gguf_writer_add_arr_str(akv_gguf_writer *w, const char *key,
                                       const akv_gguf_str *strs, uint64_t n);

/* Copies kv `idx` of an open file verbatim (key, type, value bytes): how a tokenizer
 * travels from one model to another. */
akv_status akv_gguf_writer_copy_kv(akv_gguf_writer *w, const akv_gguf *src, size_t idx);

/* Declares the next tensor. Its data is streamed in phase 2, in declaration order. */
akv_status akv_gguf_writer_add_tensor(akv_gguf_writer *w, const char *name, akv_gguf_type type,
                                      uint32_t n_dims, const uint64_t *ne);

/* Bytes the finished file will have (header, metadata, index, padding, data). Valid in
 * either phase; grows as phase 1 adds things. */
uint64_t akv_gguf_writer_file_bytes(const akv_gguf_writer *w);

/* ---- phase 2: tensor data ---------------------------------------------------------------- */

/* Appends the next n bytes of tensor data (they may span tensor boundaries). The first call
 * ends phase 1 (so may a call with n == 0). AKV_ESTATE if this goes beyond the declared
 * bytes. */
akv_status akv_gguf_writer_write(akv_gguf_writer *w, const void *bytes, size_t n);

/* Completes the file and renames it into place. AKV_ESTATE if some tensor has not received
 * all its bytes (logged with its name). After success only destroy is allowed. */
akv_status akv_gguf_writer_finish(akv_gguf_writer *w);

/* ---- derived files ------------------------------------------------------------------------ */

/* Writes the first n_layers blocks of `src` as a complete model at `path`: every kv verbatim
 * except <arch>.block_count (set to n_layers), every tensor not named blk.<i>.* with
 * i >= n_layers, the source's alignment. A slice of a real model is a small real model (its
 * tokenizer, embeddings and first layers), for machines a whole file cannot reach.
 * AKV_EINVAL: n_layers is 0 or more than the source has; AKV_EFORMAT: no architecture or
 * block count; AKV_EIO: a write failed (the file is then absent). */
akv_status akv_gguf_write_layer_slice(const akv_gguf *src, uint32_t n_layers, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* AKV_GGUF_WRITER_H */
