/* utf8.c — UTF-8 classification and sanitising (see utf8.h). */
#include "tok/utf8.h"

#include <string.h>

akv__utf8_kind akv__utf8_next(const uint8_t *s, size_t n, size_t *len, uint32_t *cp) {
    uint8_t b = s[0];
    if (b < 0x80) {
        *len = 1;
        *cp = b;
        return AKV__UTF8_VALID;
    }
    /* Length and the allowed range of the second byte, from Table 3-7; the third and
     * fourth bytes are always 80..BF. */
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    uint32_t c;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 2, c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3, c = b & 0x0F;
        if (b == 0xE0)
            lo = 0xA0; /* no overlongs */
        else if (b == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4, c = b & 0x07;
        if (b == 0xF0)
            lo = 0x90; /* no overlongs */
        else if (b == 0xF4)
            hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        *len = 1; /* 80..C1, F5..FF never start a sequence */
        return AKV__UTF8_INVALID;
    }
    for (size_t i = 1; i < need; i++) {
        if (i == n) {
            *len = n;
            return AKV__UTF8_TRUNCATED;
        }
        uint8_t x = s[i];
        if (x < lo || x > hi) {
            *len = i; /* the maximal subpart ends before the offending byte */
            return AKV__UTF8_INVALID;
        }
        lo = 0x80, hi = 0xBF;
        c = (c << 6) | (x & 0x3F);
    }
    *len = need;
    *cp = c;
    return AKV__UTF8_VALID;
}

bool akv__utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0, len;
    uint32_t cp;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        if (akv__utf8_next(s + i, n - i, &len, &cp) != AKV__UTF8_VALID) return false;
        i += len;
    }
    return true;
}

size_t akv__utf8_sanitize(const uint8_t *s, size_t n, uint8_t *out) {
    size_t i = 0, o = 0, len;
    uint32_t cp;
    while (i < n) {
        if (s[i] < 0x80) {
            out[o++] = s[i++];
            continue;
        }
        if (akv__utf8_next(s + i, n - i, &len, &cp) == AKV__UTF8_VALID) {
            memcpy(out + o, s + i, len);
            o += len;
        } else {
            memcpy(out + o, AKV__UTF8_REPLACEMENT, 3);
            o += 3;
        }
        i += len;
    }
    return o;
}

size_t akv__utf8_put(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}
