/*
 * engine/json_lex.h — the lexical pieces both JSON prefix machines share (json_prefix.c,
 * json_schema.c): a string's bytes after its opening quote, and a number's, each a small state
 * in one byte.
 */
#ifndef AKV_ENGINE_JSON_LEX_H
#define AKV_ENGINE_JSON_LEX_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef enum json_lex_r {
    JL_TAKEN = 0, /* the byte continues it */
    JL_DONE,      /* the byte ends it (a string's closing quote, taken) */
    JL_ENDS,      /* the byte does not continue it, but it may end before the byte (a number) */
    JL_REFUSED,   /* nothing can follow */
} json_lex_r;

static inline bool json_lex_ws(uint8_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static inline bool json_lex_digit(uint8_t c) {
    return c >= '0' && c <= '9';
}

/* Inside a string, the bytes a UTF-8 sequence still needs (Unicode's Table 3-7, no overlongs,
 * no surrogates, nothing above U+10FFFF): JL_U1..JL_U3 continuation bytes 80..BF left, and the
 * lead bytes whose first continuation is narrower. */
enum { JL_U1 = 16, JL_U2, JL_U3, JL_UE0, JL_UED, JL_UF0, JL_UF4 };

/* A UTF-8 sequence's next byte inside a string (st one of the states above, or 0 for a lead
 * byte): the state after it (0 when the character is whole), or 255 when it is ill-formed. */
static inline uint8_t json_lex_utf8(uint8_t st, uint8_t c) {
    const bool cont = c >= 0x80 && c <= 0xBF;
    switch (st) {
    case 0:
        if (c < 0x80) return 0;
        if (c >= 0xC2 && c <= 0xDF) return JL_U1;
        if (c == 0xE0) return JL_UE0;
        if (c == 0xED) return JL_UED;
        if (c >= 0xE1 && c <= 0xEF) return JL_U2;
        if (c == 0xF0) return JL_UF0;
        if (c >= 0xF1 && c <= 0xF3) return JL_U3;
        if (c == 0xF4) return JL_UF4;
        return 255;
    case JL_U1: return cont ? 0 : 255;
    case JL_U2: return cont ? JL_U1 : 255;
    case JL_U3: return cont ? JL_U2 : 255;
    case JL_UE0: return c >= 0xA0 && c <= 0xBF ? JL_U1 : 255;
    case JL_UED: return c >= 0x80 && c <= 0x9F ? JL_U1 : 255;
    case JL_UF0: return c >= 0x90 && c <= 0xBF ? JL_U2 : 255;
    case JL_UF4: return c >= 0x80 && c <= 0x8F ? JL_U2 : 255;
    default: return 255;
    }
}

/* A string after its opening quote; *st starts at 0: 0 inside, 1 after '\', 2 + k with k hex
 * digits of a \u left, JL_U1.. inside a UTF-8 sequence (a token's piece may end in one; the
 * next must finish it). Control bytes must be escaped; other bytes must be well-formed UTF-8. */
static inline json_lex_r json_lex_string(uint8_t *st, uint8_t c) {
    if (*st >= JL_U1) {
        const uint8_t next = json_lex_utf8(*st, c);
        if (next == 255) return JL_REFUSED;
        *st = next;
        return JL_TAKEN;
    }
    if (*st == 0) {
        if (c == '"') return JL_DONE;
        if (c == '\\') *st = 1;
        else if (c >= 0x80) {
            const uint8_t next = json_lex_utf8(0, c);
            if (next == 255) return JL_REFUSED;
            *st = next;
        }
        return c >= 0x20 ? JL_TAKEN : JL_REFUSED;
    }
    if (*st == 1) {
        if (c == 'u') *st = 2 + 4;
        else if (c != 0 && strchr("\"\\/bfnrt", c)) *st = 0;
        else return JL_REFUSED;
        return JL_TAKEN;
    }
    const bool hex = json_lex_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    if (!hex) return JL_REFUSED;
    *st = *st == 3 ? 0 : (uint8_t)(*st - 1);
    return JL_TAKEN;
}

/* A literal (true, false, null) begun with `first`, *at bytes of it read (from 1): its next
 * byte c; JL_DONE when that made it whole. */
static inline json_lex_r json_lex_literal(uint8_t first, uint8_t *at, uint8_t c) {
    const char *lit = first == 't' ? "true" : first == 'f' ? "false" : "null";
    if ((uint8_t)lit[*at] != c) return JL_REFUSED;
    return lit[++*at] == 0 ? JL_DONE : JL_TAKEN;
}

/* A number's states after its first byte. */
enum { JL_MINUS = 1, JL_ZERO, JL_INT, JL_DOT, JL_FRAC, JL_EXP, JL_EXP_SIGN, JL_EXP_DIGITS };

/* The state after a number's first byte, or 0 when c cannot begin one. */
static inline uint8_t json_lex_number_start(uint8_t c) {
    return c == '-' ? JL_MINUS : c == '0' ? JL_ZERO : json_lex_digit(c) ? JL_INT : 0;
}

/* Whether a number in state st is whole. */
static inline bool json_lex_number_whole(uint8_t st) {
    return st == JL_ZERO || st == JL_INT || st == JL_FRAC || st == JL_EXP_DIGITS;
}

/* A number's next byte (integer: no fraction or exponent). */
static inline json_lex_r json_lex_number(uint8_t *st, uint8_t c, bool integer) {
    const bool digit = json_lex_digit(c), e = c == 'e' || c == 'E';
    switch (*st) {
    case JL_MINUS: *st = c == '0' ? JL_ZERO : digit ? JL_INT : 0; break;
    case JL_ZERO:
    case JL_INT:
        if (digit && *st == JL_INT) return JL_TAKEN;
        if (!integer && c == '.') *st = JL_DOT;
        else if (!integer && e) *st = JL_EXP;
        else return JL_ENDS;
        return JL_TAKEN;
    case JL_DOT: *st = digit ? JL_FRAC : 0; break;
    case JL_FRAC:
        if (digit) return JL_TAKEN;
        if (!e) return JL_ENDS;
        *st = JL_EXP;
        return JL_TAKEN;
    case JL_EXP: *st = c == '+' || c == '-' ? JL_EXP_SIGN : digit ? JL_EXP_DIGITS : 0; break;
    case JL_EXP_SIGN: *st = digit ? JL_EXP_DIGITS : 0; break;
    case JL_EXP_DIGITS: return digit ? JL_TAKEN : JL_ENDS;
    default: return JL_REFUSED;
    }
    return *st ? JL_TAKEN : JL_REFUSED;
}

#endif
