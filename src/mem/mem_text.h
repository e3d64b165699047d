/*
 * mem/mem_text.h — building the memory layer's explanations (formulas, counts) as text.
 * The library never prints; it formats into a caller's buffer and the caller prints or logs.
 */
#ifndef AKV_MEM_TEXT_H
#define AKV_MEM_TEXT_H

#include <stddef.h>

#include "core/assert.h"

/* snprintf appending at buf + *len (cap bytes in all, NUL-terminated, truncated); *len grows
 * by the full formatted length even past cap, so the final *len is what the text needs. */
void akv__mem_appendf(char *buf, size_t cap, size_t *len, const char *fmt, ...) AKV_PRINTF(4, 5);

#endif
