/* json_prefix.c — the JSON prefix state machine of akv/json_prefix.h: one state per place the
 * grammar can be in between two bytes, a stack of open containers. */
#include "akv/json_prefix.h"

#include <string.h>

enum {
    J_VALUE = 0,   /* a value (whitespace first) */
    J_ARR_FIRST,   /* after '[': a value or ']' */
    J_OBJ_FIRST,   /* after '{': a key or '}' */
    J_OBJ_KEY,     /* after ',' in an object: a key */
    J_COLON,       /* after a key: ':' */
    J_AFTER,       /* after a value: ',' or the container's end; at the top, whitespace */
    J_STRING,      /* inside a string (sub: 1 = a key) */
    J_ESCAPE,      /* after '\' in a string */
    J_UNICODE,     /* \u: sub hex digits left */
    J_LITERAL,     /* true / false / null: sub bytes read */
    J_MINUS,       /* after '-': a digit */
    J_ZERO,        /* after a leading 0: '.', 'e', or the end */
    J_INT,         /* integer digits */
    J_DOT,         /* after '.': a digit */
    J_FRAC,        /* fraction digits */
    J_EXP,         /* after 'e': a sign or a digit */
    J_EXP_SIGN,    /* after the exponent's sign: a digit */
    J_EXP_DIGITS,  /* exponent digits */
};

static bool is_ws(uint8_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(uint8_t c) {
    return c >= '0' && c <= '9';
}

static bool is_hex(uint8_t c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static const char *literal_text(uint8_t first) {
    return first == 't' ? "true" : first == 'f' ? "false" : "null";
}

void akv_json_prefix_init(akv_json_prefix *p, bool object_only) {
    memset(p, 0, sizeof *p);
    p->state = J_VALUE;
    p->object_only = object_only;
}

/* A value is over: the container it sits in decides what follows. */
static void value_done(akv_json_prefix *p) {
    p->state = J_AFTER;
}

/* The first byte of a value (not whitespace). */
static bool value_start(akv_json_prefix *p, uint8_t c) {
    if (p->depth == 0) {
        if (p->started || (p->object_only && c != '{')) return false;
        p->started = true;
    }
    switch (c) {
    case '{':
    case '[':
        if (p->depth == AKV_JSON_MAX_DEPTH) return false;
        p->stack[p->depth++] = c;
        p->state = c == '{' ? J_OBJ_FIRST : J_ARR_FIRST;
        return true;
    case '"': p->state = J_STRING, p->sub = 0; return true;
    case '-': p->state = J_MINUS; return true;
    case '0': p->state = J_ZERO; return true;
    case 't':
    case 'f':
    case 'n': p->state = J_LITERAL, p->literal = c, p->sub = 1; return true;
    default:
        if (c >= '1' && c <= '9') {
            p->state = J_INT;
            return true;
        }
        return false;
    }
}

/* A container's end or a separator after a value. */
static bool after_value(akv_json_prefix *p, uint8_t c) {
    if (is_ws(c)) return true;
    if (p->depth == 0) return false; /* the text is complete: whitespace only */
    const uint8_t top = p->stack[p->depth - 1];
    if (c == ',') {
        p->state = top == '{' ? J_OBJ_KEY : J_VALUE;
        return true;
    }
    if ((top == '{' && c == '}') || (top == '[' && c == ']')) {
        p->depth--;
        value_done(p);
        return true;
    }
    return false;
}

/* A byte that ends a number (any byte no number state takes) goes on as after a value. */
static bool number_end(akv_json_prefix *p, uint8_t c) {
    value_done(p);
    return after_value(p, c);
}

static bool feed1(akv_json_prefix *p, uint8_t c) {
    switch (p->state) {
    case J_VALUE: return is_ws(c) || value_start(p, c);
    case J_ARR_FIRST:
        if (is_ws(c)) return true;
        if (c == ']') {
            p->depth--;
            value_done(p);
            return true;
        }
        return value_start(p, c);
    case J_OBJ_FIRST:
    case J_OBJ_KEY:
        if (is_ws(c)) return true;
        if (c == '}' && p->state == J_OBJ_FIRST) {
            p->depth--;
            value_done(p);
            return true;
        }
        if (c != '"') return false;
        p->state = J_STRING, p->sub = 1;
        return true;
    case J_COLON:
        if (is_ws(c)) return true;
        if (c != ':') return false;
        p->state = J_VALUE;
        return true;
    case J_AFTER: return after_value(p, c);
    case J_STRING:
        if (c == '"') {
            if (p->sub) p->state = J_COLON;
            else value_done(p);
            return true;
        }
        if (c == '\\') {
            p->state = J_ESCAPE;
            return true;
        }
        return c >= 0x20;
    case J_ESCAPE:
        if (c == 'u') {
            p->state = J_UNICODE, p->literal = 4;
            return true;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0) return false;
        p->state = J_STRING;
        return true;
    case J_UNICODE:
        if (!is_hex(c)) return false;
        if (--p->literal == 0) p->state = J_STRING;
        return true;
    case J_LITERAL: {
        const char *lit = literal_text(p->literal);
        if ((uint8_t)lit[p->sub] != c) return false;
        if (lit[++p->sub] == 0) value_done(p);
        return true;
    }
    case J_MINUS:
        if (c == '0') p->state = J_ZERO;
        else if (is_digit(c)) p->state = J_INT;
        else return false;
        return true;
    case J_ZERO:
    case J_INT:
        if (is_digit(c) && p->state == J_INT) return true;
        if (c == '.') p->state = J_DOT;
        else if (c == 'e' || c == 'E') p->state = J_EXP;
        else return number_end(p, c);
        return true;
    case J_DOT:
        if (!is_digit(c)) return false;
        p->state = J_FRAC;
        return true;
    case J_FRAC:
        if (is_digit(c)) return true;
        if (c == 'e' || c == 'E') {
            p->state = J_EXP;
            return true;
        }
        return number_end(p, c);
    case J_EXP:
        if (c == '+' || c == '-') p->state = J_EXP_SIGN;
        else if (is_digit(c)) p->state = J_EXP_DIGITS;
        else return false;
        return true;
    case J_EXP_SIGN:
        if (!is_digit(c)) return false;
        p->state = J_EXP_DIGITS;
        return true;
    case J_EXP_DIGITS: return is_digit(c) || number_end(p, c);
    default: return false;
    }
}

bool akv_json_prefix_feed(akv_json_prefix *p, const uint8_t *bytes, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!feed1(p, bytes[i])) return false;
    return true;
}

bool akv_json_prefix_complete(const akv_json_prefix *p) {
    if (!p->started || p->depth != 0) return false;
    switch (p->state) {
    case J_AFTER:
    case J_ZERO:
    case J_INT:
    case J_FRAC:
    case J_EXP_DIGITS: return true; /* a top-level number may end here */
    default: return false;
    }
}
