/* mem_text.c — appending formatted text to a bounded buffer (mem/mem_text.h). */
#include "mem/mem_text.h"

#include <stdarg.h>
#include <stdio.h>

void akv__mem_appendf(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*len < cap ? buf + *len : NULL, *len < cap ? cap - *len : 0, fmt, ap);
    va_end(ap);
    if (n > 0) *len += (size_t)n;
}
