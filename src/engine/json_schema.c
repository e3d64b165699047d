/* json_schema.c — the schema-directed JSON prefix machine of akv/json_schema.h: a stack of
 * frames, one per open value, each in one of the states below. A byte that ends a value which
 * may end without one (a number, a matched enum text, an ANY value) finishes it and goes on to
 * the value's parent. */
#include "akv/json_schema.h"

#include <string.h>

#include "engine/json_lex.h"

enum {
    F_START = 0,  /* the value's first byte (whitespace first) */
    F_OBJ_FIRST,  /* after '{': a key or '}' */
    F_OBJ_KEY,    /* after ',': a key */
    F_KEY,        /* inside a key: s->at bytes matched, s->cand its possible properties */
    F_COLON,      /* after a key (sub: its property): ':' */
    F_OBJ_VALUE,  /* a property's value is open above */
    F_OBJ_AFTER,  /* after a property's value: ',' or '}' */
    F_ARR_FIRST,  /* after '[': a value or ']' */
    F_ARR_VALUE,  /* an item is open above */
    F_ARR_AFTER,  /* after an item: ',' or ']' */
    F_STR,        /* inside a string (sub: json_lex_string's state) */
    F_LIT,        /* true / false / null: count = its first letter, sub bytes matched */
    F_NUM,        /* a number (sub: json_lex_number's state) */
    F_ENUM,       /* an enum text: s->at bytes matched, used its possible texts */
    F_ANY,        /* any value: s->any */
};

static const akv_js_node *node_of(const akv_js_state *s, const akv_js_frame *f) {
    return &s->schema->nodes[f->node];
}

static uint64_t all_bits(uint32_t n) {
    return n >= 64 ? ~0ull : (1ull << n) - 1;
}

/* String i of node n's candidates: a property's name (an object's key) or an enum's text. */
static const char *cand_text(const akv_js_state *s, const akv_js_node *n, uint32_t i) {
    return n->kind == AKV_JS_OBJECT ? s->schema->props[n->first + i].name : s->schema->texts[n->first + i];
}

/* The candidates of cand whose string has byte c (not NUL) at s->at. */
static uint64_t cand_narrow(const akv_js_state *s, const akv_js_node *n, uint64_t cand, uint8_t c) {
    uint64_t keep = 0;
    for (uint32_t i = 0; c && i < n->n; i++)
        if ((cand >> i & 1) && (uint8_t)cand_text(s, n, i)[s->at] == c) keep |= 1ull << i;
    return keep;
}

/* The candidates of cand whose string ends at s->at. */
static uint64_t cand_ended(const akv_js_state *s, const akv_js_node *n, uint64_t cand) {
    uint64_t done = 0;
    for (uint32_t i = 0; i < n->n; i++)
        if ((cand >> i & 1) && cand_text(s, n, i)[s->at] == 0) done |= 1ull << i;
    return done;
}

void akv_js_init(akv_js_state *s, const akv_json_schema *schema) {
    memset(s, 0, sizeof *s);
    s->schema = schema;
    s->depth = 1;
    s->frames[0] = (akv_js_frame){.node = 0, .state = F_START};
}

/* Opens a value of `node` above the current frame. */
static bool push(akv_js_state *s, uint32_t node) {
    if (s->depth == AKV_JS_MAX_DEPTH) return false;
    s->frames[s->depth++] = (akv_js_frame){.node = node, .state = F_START};
    return true;
}

/* The current value is whole: its parent moves on (or the root is done); an object's tag
 * keeps which text it took. */
static void pop(akv_js_state *s) {
    const akv_js_frame *c = &s->frames[s->depth - 1];
    if (--s->depth == 0) {
        s->done = true;
        return;
    }
    akv_js_frame *p = &s->frames[s->depth - 1];
    if (p->state == F_OBJ_VALUE) {
        const akv_js_node *pn = node_of(s, p);
        if (pn->items && p->sub == pn->items - 1 && c->state == F_ENUM) {
            const uint64_t ended = cand_ended(s, node_of(s, c), c->used);
            p->count = (uint16_t)(__builtin_ctzll(ended) + 1);
        }
        p->state = F_OBJ_AFTER;
    } else {
        p->count++, p->state = F_ARR_AFTER;
    }
}

/* An object's properties that may not come yet: its SWITCH ones before its tag. */
static uint64_t untagged(const akv_js_state *s, const akv_js_node *n, const akv_js_frame *f) {
    uint64_t out = 0;
    if (!n->items || f->count) return 0; /* no tag, or it has come */
    for (uint32_t i = 0; i < n->n; i++)
        if (s->schema->nodes[s->schema->props[n->first + i].node].kind == AKV_JS_SWITCH) out |= 1ull << i;
    return out;
}

/* Whether the current value may end here (before a byte it does not take). */
static bool may_end(const akv_js_state *s, const akv_js_frame *f) {
    switch (f->state) {
    case F_NUM: return json_lex_number_whole(f->sub);
    case F_ENUM: return cand_ended(s, node_of(s, f), f->used) != 0;
    case F_ANY: return akv_json_prefix_complete(&s->any);
    default: return false;
    }
}

/* The first byte of a value of f's node. */
static bool start(akv_js_state *s, akv_js_frame *f, uint8_t c) {
    const akv_js_node *n = node_of(s, f);
    if (json_lex_ws(c)) return true;
    if (c == 'n' && (n->nullable || n->kind == AKV_JS_NULL)) {
        f->state = F_LIT, f->count = 'n', f->sub = 1;
        return true;
    }
    switch (n->kind) {
    case AKV_JS_OBJECT:
        if (c != '{') return false;
        f->state = F_OBJ_FIRST, f->used = 0, f->count = 0;
        return true;
    case AKV_JS_ARRAY:
        if (c != '[') return false;
        f->state = F_ARR_FIRST, f->count = 0;
        return true;
    case AKV_JS_STRING:
        if (c != '"') return false;
        f->state = F_STR, f->sub = 0;
        return true;
    case AKV_JS_NUMBER:
    case AKV_JS_INTEGER:
        f->state = F_NUM, f->sub = json_lex_number_start(c);
        return f->sub != 0;
    case AKV_JS_BOOLEAN:
        if (c != 't' && c != 'f') return false;
        f->state = F_LIT, f->count = c, f->sub = 1;
        return true;
    case AKV_JS_ANY:
        akv_json_prefix_init(&s->any, n->object_only);
        f->state = F_ANY;
        return akv_json_prefix_feed(&s->any, &c, 1);
    default: return false;
    }
}

static bool feed1(akv_js_state *s, uint8_t c) {
    for (;;) {
        if (s->done) return json_lex_ws(c);
        akv_js_frame *f = &s->frames[s->depth - 1];
        const akv_js_node *n = node_of(s, f);
        switch (f->state) {
        case F_START:
            if (n->kind == AKV_JS_REF) { /* the node it stands for (null, where it allows it) */
                if (c == 'n' && n->nullable) return start(s, f, c);
                if (json_lex_ws(c)) return true;
                if (++f->count > s->schema->n_nodes) return false; /* a cycle of refs alone */
                f->node = n->items;
                continue;
            }
            if (n->kind == AKV_JS_SWITCH) { /* the case its object's tag chose */
                const akv_js_frame *o = &s->frames[s->depth - 2];
                if (!o->count || o->count > n->n) return false; /* cannot happen: untagged */
                f->node = s->schema->props[n->first + o->count - 1].node;
                continue;
            }
            if (n->kind == AKV_JS_ENUM && !json_lex_ws(c) && !(c == 'n' && n->nullable)) {
                f->state = F_ENUM, f->used = all_bits(n->n), s->at = 0;
                continue; /* c is the text's first byte */
            }
            return start(s, f, c);
        case F_OBJ_FIRST:
        case F_OBJ_KEY: {
            if (json_lex_ws(c)) return true;
            if (c == '}' && f->state == F_OBJ_FIRST) {
                if ((n->required & ~f->used) != 0) return false;
                pop(s);
                return true;
            }
            if (c != '"') return false;
            const uint64_t unused = all_bits(n->n) & ~f->used & ~untagged(s, n, f);
            if (!unused) return false;
            f->state = F_KEY, s->at = 0, s->cand = unused;
            return true;
        }
        case F_KEY: {
            const uint64_t keep = c == '"' ? cand_ended(s, n, s->cand) : cand_narrow(s, n, s->cand, c);
            if (!keep) return false;
            if (c == '"') { /* names are distinct: one property ends here */
                uint32_t i = 0;
                while (!(keep >> i & 1)) i++;
                f->used |= 1ull << i, f->sub = (uint8_t)i, f->state = F_COLON;
                return true;
            }
            s->cand = keep, s->at++;
            return true;
        }
        case F_COLON:
            if (json_lex_ws(c)) return true;
            if (c != ':') return false;
            f->state = F_OBJ_VALUE;
            return push(s, s->schema->props[n->first + f->sub].node);
        case F_OBJ_AFTER:
            if (json_lex_ws(c)) return true;
            if (c == ',') {
                if (!(all_bits(n->n) & ~f->used)) return false; /* every property given */
                f->state = F_OBJ_KEY;
                return true;
            }
            if (c != '}' || (n->required & ~f->used) != 0) return false;
            pop(s);
            return true;
        case F_ARR_FIRST:
            if (json_lex_ws(c)) return true;
            if (c == ']') {
                if (n->min_items > 0) return false;
                pop(s);
                return true;
            }
            f->state = F_ARR_VALUE;
            if (!push(s, n->items)) return false;
            continue; /* the byte starts the item */
        case F_ARR_AFTER:
            if (json_lex_ws(c)) return true;
            if (c == ',') {
                if (n->max_items && f->count >= n->max_items) return false;
                f->state = F_ARR_VALUE;
                return push(s, n->items);
            }
            if (c != ']' || f->count < n->min_items) return false;
            pop(s);
            return true;
        case F_STR:
            switch (json_lex_string(&f->sub, c)) {
            case JL_TAKEN: return true;
            case JL_DONE: pop(s); return true;
            default: return false;
            }
        case F_LIT:
            switch (json_lex_literal((uint8_t)f->count, &f->sub, c)) {
            case JL_TAKEN: return true;
            case JL_DONE: pop(s); return true;
            default: return false;
            }
        case F_NUM: {
            const json_lex_r r = json_lex_number(&f->sub, c, n->kind == AKV_JS_INTEGER);
            if (r == JL_TAKEN) return true;
            if (r == JL_REFUSED) return false;
            break; /* the number ends before c */
        }
        case F_ENUM: {
            const uint64_t keep = cand_narrow(s, n, f->used, c);
            if (keep) {
                f->used = keep, s->at++;
                /* a text that ends here and that nothing longer continues: whole */
                if (cand_ended(s, n, keep) == keep) pop(s);
                return true;
            }
            break;
        }
        case F_ANY: {
            akv_json_prefix q = s->any;
            if (akv_json_prefix_feed(&q, &c, 1)) {
                s->any = q;
                return true;
            }
            break;
        }
        default: return false;
        }
        /* c does not continue the value: it may end here, and c goes to its parent */
        if (!may_end(s, f)) return false;
        pop(s);
    }
}

bool akv_js_feed(akv_js_state *s, const uint8_t *bytes, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!feed1(s, bytes[i])) return false;
    return true;
}

bool akv_js_complete(const akv_js_state *s) {
    if (s->done) return true;
    return s->depth == 1 && may_end(s, &s->frames[0]);
}
