/*
 * tok/utf8.h — UTF-8 validation with the "maximal subpart" replacement rule.
 *
 * Well-formed sequences are those of Unicode Table 3-7 (no overlongs, no surrogates, nothing
 * above U+10FFFF). An ill-formed stretch is replaced by one U+FFFD per maximal subpart: the
 * longest prefix of a well-formed sequence starting at the bad position, or one byte when
 * no sequence starts there (Unicode §3.9 "U+FFFD Substitution of Maximal Subparts", which
 * WHATWG's decoder and Python's errors="replace" also follow).
 */
#ifndef AKV_TOK_UTF8_H
#define AKV_TOK_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* U+FFFD REPLACEMENT CHARACTER in UTF-8. */
#define AKV__UTF8_REPLACEMENT "\xEF\xBF\xBD"

typedef enum akv__utf8_kind {
    AKV__UTF8_VALID,     /* s starts with a well-formed sequence of *len bytes */
    AKV__UTF8_INVALID,   /* s starts with an ill-formed maximal subpart of *len (>= 1) bytes */
    AKV__UTF8_TRUNCATED, /* all n bytes are a proper prefix of a well-formed sequence */
} akv__utf8_kind;

/* Classifies the sequence at s[0..n), n >= 1. *cp gets the code point when VALID. */
akv__utf8_kind akv__utf8_next(const uint8_t *s, size_t n, size_t *len, uint32_t *cp);

/* Whether s[0..n) is entirely well-formed. */
bool akv__utf8_valid(const uint8_t *s, size_t n);

/* Writes s[0..n) to out with every maximal ill-formed subpart (a truncated tail included)
 * replaced by U+FFFD; out must have room for 3 * n bytes. Returns the bytes written. */
size_t akv__utf8_sanitize(const uint8_t *s, size_t n, uint8_t *out);

/* Appends the UTF-8 encoding of cp (< 0x110000, not a surrogate) to out; returns 1..4. */
size_t akv__utf8_put(uint32_t cp, uint8_t *out);

#endif
