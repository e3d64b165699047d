/* gguf_slice.c — a model's first layers as a complete GGUF (akv/gguf_writer.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/gguf_writer.h"
#include "core/alloc.h"
#include "core/log.h"

/* The block index of a tensor named "blk.<i>.<rest>", or -1 for any other name. */
static long slice_block_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    char *end = NULL;
    long i = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && i >= 0 ? i : -1;
}

akv_status akv_gguf_write_layer_slice(const akv_gguf *src, uint32_t n_layers, const char *path) {
    if (!src || !path || n_layers == 0) return AKV_EINVAL;
    akv_gguf_str arch;
    akv_status st = akv_gguf_get_str(src, "general.architecture", &arch);
    if (st) {
        AKV_LOG_E("gguf slice: the source has no general.architecture");
        return st == AKV_ENOTFOUND ? AKV_EFORMAT : st;
    }
    char block_key[96];
    if (arch.len > 64) return AKV_EFORMAT;
    snprintf(block_key, sizeof block_key, "%.*s.block_count", (int)arch.len, arch.ptr);
    uint32_t n_src = 0;
    if ((st = akv_gguf_get_u32(src, block_key, &n_src))) {
        AKV_LOG_E("gguf slice: the source has no %s", block_key);
        return st == AKV_ENOTFOUND ? AKV_EFORMAT : st;
    }
    if (n_layers > n_src) {
        AKV_LOG_E("gguf slice: %u layers asked for, the source has %u", n_layers, n_src);
        return AKV_EINVAL;
    }
    akv_gguf_writer_params wp = akv_gguf_writer_default_params();
    wp.alignment = (uint32_t)akv_gguf_alignment(src);
    akv_gguf_writer *w = NULL;
    if ((st = akv_gguf_writer_create(path, &wp, &w))) return st;
    /* metadata verbatim, but the block count, and the alignment that the params carry */
    for (size_t i = 0; i < akv_gguf_n_kv(src) && !st; i++) {
        const char *key = akv_gguf_kv_key(src, i);
        if (!strcmp(key, block_key))
            st = akv_gguf_writer_add_u32(w, key, n_layers);
        else if (strcmp(key, "general.alignment") != 0)
            st = akv_gguf_writer_copy_kv(w, src, i);
    }
    size_t n_t = akv_gguf_n_tensors(src);
    for (size_t i = 0; i < n_t && !st; i++) {
        const akv_gguf_tensor *t = akv_gguf_tensor_at(src, i);
        if (slice_block_of(t->name) >= (long)n_layers) continue;
        st = akv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
    }
    enum { PIECE = 4u << 20 }; /* bytes copied at a time, read through the file */
    uint8_t *buf = st ? NULL : akv__malloc(PIECE);
    if (!st && !buf) st = AKV_ENOMEM;
    for (size_t i = 0; i < n_t && !st; i++) {
        const akv_gguf_tensor *t = akv_gguf_tensor_at(src, i);
        if (slice_block_of(t->name) >= (long)n_layers) continue;
        for (uint64_t off = 0; off < t->n_bytes && !st; off += PIECE) {
            size_t n = t->n_bytes - off < PIECE ? (size_t)(t->n_bytes - off) : PIECE;
            st = akv_gguf_tensor_read(src, t, off, buf, n);
            if (!st) st = akv_gguf_writer_write(w, buf, n);
        }
    }
    akv__free(buf);
    if (!st) st = akv_gguf_writer_finish(w);
    akv_gguf_writer_destroy(w);
    return st;
}
