/* json_prefix.c — the JSON prefix state machine of akv/json_prefix.h: one state per place the
 * grammar can be in between two bytes, a stack of open containers. */
#include "akv/json_prefix.h"

#include <string.h>

#include "engine/json_lex.h"

enum {
    J_VALUE = 0,   /* a value (whitespace first) */
    J_ARR_FIRST,   /* after '[': a value or ']' */
    J_OBJ_FIRST,   /* after '{': a key or '}' */
    J_OBJ_KEY,     /* after ',' in an object: a key */
    J_COLON,       /* after a key: ':' */
    J_AFTER,       /* after a value: ',' or the container's end; at the top, whitespace */
    J_STRING,      /* inside a string (sub: 1 = a key; lex: json_lex_string's state) */
    J_LITERAL,     /* true / false / null: sub bytes read */
    J_NUMBER,      /* a number (lex: json_lex_number's state) */
};

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
    case '"': p->state = J_STRING, p->sub = 0, p->lex = 0; return true;
    case 't':
    case 'f':
    case 'n': p->state = J_LITERAL, p->literal = c, p->sub = 1; return true;
    default:
        p->lex = json_lex_number_start(c);
        p->state = J_NUMBER;
        return p->lex != 0;
    }
}

/* A container's end or a separator after a value. */
static bool after_value(akv_json_prefix *p, uint8_t c) {
    if (json_lex_ws(c)) return true;
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

static bool feed1(akv_json_prefix *p, uint8_t c) {
    switch (p->state) {
    case J_VALUE: return json_lex_ws(c) || value_start(p, c);
    case J_ARR_FIRST:
        if (json_lex_ws(c)) return true;
        if (c == ']') {
            p->depth--;
            value_done(p);
            return true;
        }
        return value_start(p, c);
    case J_OBJ_FIRST:
    case J_OBJ_KEY:
        if (json_lex_ws(c)) return true;
        if (c == '}' && p->state == J_OBJ_FIRST) {
            p->depth--;
            value_done(p);
            return true;
        }
        if (c != '"') return false;
        p->state = J_STRING, p->sub = 1, p->lex = 0;
        return true;
    case J_COLON:
        if (json_lex_ws(c)) return true;
        if (c != ':') return false;
        p->state = J_VALUE;
        return true;
    case J_AFTER: return after_value(p, c);
    case J_STRING:
        switch (json_lex_string(&p->lex, c)) {
        case JL_TAKEN: return true;
        case JL_DONE:
            if (p->sub) p->state = J_COLON;
            else value_done(p);
            return true;
        default: return false;
        }
    case J_LITERAL:
        switch (json_lex_literal(p->literal, &p->sub, c)) {
        case JL_TAKEN: return true;
        case JL_DONE: value_done(p); return true;
        default: return false;
        }
    case J_NUMBER:
        switch (json_lex_number(&p->lex, c, false)) {
        case JL_TAKEN: return true;
        case JL_ENDS: /* c goes on as after the value */
            value_done(p);
            return after_value(p, c);
        default: return false;
        }
    default: return false;
    }
}

bool akv_json_prefix_feed(akv_json_prefix *p, const uint8_t *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const bool text = p->state == J_STRING;
        if (!feed1(p, bytes[i])) return false;
        if (text) p->ws = p->nl = 0;
        else if (!akv_json_ws_run(&p->ws, &p->nl, bytes[i])) return false;
    }
    return true;
}


bool akv_json_prefix_complete(const akv_json_prefix *p) {
    if (!p->started || p->depth != 0) return false;
    return p->state == J_AFTER || (p->state == J_NUMBER && json_lex_number_whole(p->lex));
}
