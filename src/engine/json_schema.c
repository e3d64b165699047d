/* json_schema.c — the schema-directed JSON prefix machine of akv/json_schema.h: a stack of
 * frames, one per open value, each in one of the states below. A byte that ends a value which
 * may end without one (a number, a matched enum text, an ANY value) finishes it and goes on to
 * the value's parent. */
#include "akv/json_schema.h"

#include <math.h>
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

/* ---- bounds -------------------------------------------------------------------------------
 * A bounded number's digits: count holds how many (NUM_DIGITS), how many after the dot, whether
 * the dot came, the sign; used holds all the digits as one integer (M). Its value is
 * sign * M / 10^frac, weighed exactly (decimals as integers over powers of ten) against the
 * bounds, which the compiler keeps to 6 decimals (server/schema.c). At most 15 digits: two
 * decimals that short are distinct doubles in the same order, so what is exact here is what a
 * validator parsing the text into a double finds. Every byte keeps [what the digits so far can
 * still become] meeting the bounds; no prefix is a dead end because the bounds are short
 * decimals (an integer's within 10^14, a number's within 10^8): a prefix whose range meets
 * them is within them, or can write the bound's own digits (and one more) next. */
enum { NUM_DIGITS = 0x1f, NUM_FRAC_SHIFT = 5, NUM_DOT = 1 << 10, NUM_NEG = 1 << 11, NUM_MAX = 15 };

__extension__ typedef __int128 dec_n; /* GCC and Clang: 10^36 and more */
typedef struct dec { /* n / 10^e; inf: +-infinity by the sign of n */
    dec_n n;
    int e;
    bool inf;
} dec;

static dec_n pow10_(int k) {
    dec_n p = 1;
    while (k-- > 0) p *= 10;
    return p;
}

static int dec_cmp(dec a, dec b) {
    if (a.inf || b.inf) {
        const int sa = a.inf ? (a.n > 0 ? 2 : -2) : 0, sb = b.inf ? (b.n > 0 ? 2 : -2) : 0;
        return (sa > sb) - (sa < sb);
    }
    const int e = a.e > b.e ? a.e : b.e;
    const dec_n x = a.n * pow10_(e - a.e), y = b.n * pow10_(e - b.e);
    return (x > y) - (x < y);
}

/* A bound as a decimal, exactly: its whole part and 6 decimals (the compiler admits no more),
 * or infinite. */
static dec bound_dec(double b) {
    if (isinf(b)) return (dec){.n = b > 0 ? 1 : -1, .inf = true};
    const double ip = trunc(b);
    return (dec){.n = (dec_n)ip * 1000000 + (dec_n)llround((b - ip) * 1e6), .e = 6};
}

/* Whether some value in [a, b] (each end open or not; a <= b) lies within n's bounds. */
static bool bounds_meet(const akv_js_node *n, dec a, bool a_open, dec b, bool b_open) {
    const dec lo = bound_dec(n->lo), hi = bound_dec(n->hi);
    dec low = a, high = b;
    bool low_open = a_open, high_open = b_open;
    const int cl = dec_cmp(lo, a), ch = dec_cmp(hi, b);
    if (cl > 0) low = lo, low_open = n->lo_open;
    else if (cl == 0) low_open = a_open || n->lo_open;
    if (ch < 0) high = hi, high_open = n->hi_open;
    else if (ch == 0) high_open = b_open || n->hi_open;
    const int c = dec_cmp(low, high);
    return c < 0 || (c == 0 && !low_open && !high_open);
}

static dec dec_neg(dec d) {
    d.n = -d.n;
    return d;
}

/* [a, b] of magnitudes, signed: a negative number's values are [-b, -a]. */
static bool signed_meet(const akv_js_node *n, bool neg, dec a, bool a_open, dec b, bool b_open) {
    return neg ? bounds_meet(n, dec_neg(b), b_open, dec_neg(a), a_open) : bounds_meet(n, a, a_open, b, b_open);
}

/* Whether a bounded number's digits so far (f) still have a continuation within n's bounds:
 * ending now, more integer digits (none after a leading 0), or a fraction. */
static bool num_feasible(const akv_js_node *n, const akv_js_frame *f, uint8_t lex) {
    const bool neg = f->count & NUM_NEG, integer = n->kind == AKV_JS_INTEGER;
    const int digits = f->count & NUM_DIGITS, frac = (f->count >> NUM_FRAC_SHIFT) & NUM_DIGITS;
    const dec_n m = (dec_n)f->used;
    if (digits == 0) /* a sign alone: any number of that sign */
        return signed_meet(n, neg, (dec){0, 0, false}, false, (dec){1, 0, true}, false);
    if (f->count & NUM_DOT) { /* [M, M + 1) / 10^frac; right after the dot, the same */
        if (digits == NUM_MAX) return signed_meet(n, neg, (dec){m, frac, false}, false, (dec){m, frac, false}, false);
        return signed_meet(n, neg, (dec){m, frac, false}, false, (dec){m + 1, frac, false}, true);
    }
    const dec here = {m, 0, false};
    if (signed_meet(n, neg, here, false, here, false)) return true; /* it ends here */
    if (!integer && digits < NUM_MAX && signed_meet(n, neg, here, false, (dec){m + 1, 0, false}, true))
        return true; /* a fraction */
    if (lex == JL_ZERO) return false; /* no digit after a leading 0 */
    for (int j = 1; digits + j <= NUM_MAX; j++) { /* j more digits: [M, M + 1) * 10^j */
        const dec_n p = pow10_(j);
        if (integer ? signed_meet(n, neg, (dec){m * p, 0, false}, false, (dec){(m + 1) * p - 1, 0, false}, false)
                    : signed_meet(n, neg, (dec){m * p, 0, false}, false, (dec){(m + 1) * p, 0, false}, true))
            return true;
    }
    return false;
}

/* A bounded number's byte c, taken by the lexer (its state now lex): the digits kept, and
 * whether a continuation within the bounds remains. No exponent, at most NUM_MAX digits. */
static bool num_take(const akv_js_node *n, akv_js_frame *f, uint8_t c, uint8_t lex) {
    if (c == '-') f->count |= NUM_NEG;
    else if (c == '.' && (f->count & NUM_DIGITS) < NUM_MAX) f->count |= NUM_DOT;
    else if (json_lex_digit(c)) {
        if ((f->count & NUM_DIGITS) == NUM_MAX) return false;
        f->used = f->used * 10 + (uint64_t)(c - '0');
        f->count++;
        if (f->count & NUM_DOT) f->count += 1 << NUM_FRAC_SHIFT;
    } else {
        return false; /* an exponent, or a dot after the last digit it may write */
    }
    return num_feasible(n, f, lex);
}

/* Whether a bounded number may end where it stands. */
static bool num_in_bounds(const akv_js_node *n, const akv_js_frame *f) {
    const dec v = {(dec_n)f->used, (f->count >> NUM_FRAC_SHIFT) & NUM_DIGITS, false};
    return signed_meet(n, f->count & NUM_NEG, v, false, v, false);
}

/* A bounded string's escapes (f->used): the \u's first hex digit was D; the character just
 * written is a high surrogate (\uD800-\uDBFF), so its low half must follow; that low half is
 * being read. */
enum { STR_D = 1, STR_HIGH = 2, STR_LOW = 4 };

/* A bounded string's byte c before the lexer takes it (lexer state st): a character begins at
 * a byte that is not inside an escape or a UTF-8 sequence, and counts one. A high surrogate's
 * escape must be followed by its low half's, which does not count again (the pair is one
 * character, as a validator counts code points); an unpaired one is refused. False when c
 * would pass hi or break a pair. */
static bool str_count(const akv_js_node *n, akv_js_frame *f, uint8_t st, uint8_t c) {
    if (st == 0 && c != '"') {
        if (f->used & STR_HIGH) { /* only the low half may come */
            if (c != '\\') return false;
            f->used = STR_LOW;
            return true;
        }
        if (f->count == UINT16_MAX || f->count + 1 > n->hi) return false;
        f->count++;
    } else if (st == 0) { /* the closing quote: not after a high surrogate alone */
        return !(f->used & STR_HIGH);
    } else if (st == 1) {
        return !(f->used & STR_LOW) || c == 'u';
    } else if (st == 2 + 4) { /* the \u's first hex digit */
        if ((f->used & STR_LOW) && c != 'd' && c != 'D') return false;
        if (c == 'd' || c == 'D') f->used |= STR_D;
    } else if (st == 2 + 3) { /* its second */
        const bool d = f->used & STR_D, low = f->used & STR_LOW;
        f->used = 0;
        if (low) return c && strchr("cdefCDEF", c);
        if (d && c && strchr("89abAB", c)) f->used = STR_HIGH;
    }
    return true;
}

/* Whether the current value may end here (before a byte it does not take). */
static bool may_end(const akv_js_state *s, const akv_js_frame *f) {
    switch (f->state) {
    case F_NUM:
        return json_lex_number_whole(f->sub) && (!node_of(s, f)->bounded || num_in_bounds(node_of(s, f), f));
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
        f->state = F_STR, f->sub = 0, f->count = 0, f->used = 0;
        return true;
    case AKV_JS_NUMBER:
    case AKV_JS_INTEGER:
        f->state = F_NUM, f->sub = json_lex_number_start(c), f->count = 0, f->used = 0;
        return f->sub != 0 && (!n->bounded || num_take(n, f, c, f->sub));
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
        case F_STR: {
            if (n->bounded && !str_count(n, f, f->sub, c)) return false;
            switch (json_lex_string(&f->sub, c)) {
            case JL_TAKEN: return true;
            case JL_DONE:
                if (n->bounded && f->count < n->lo) return false;
                pop(s);
                return true;
            default: return false;
            }
        }
        case F_LIT:
            switch (json_lex_literal((uint8_t)f->count, &f->sub, c)) {
            case JL_TAKEN: return true;
            case JL_DONE: pop(s); return true;
            default: return false;
            }
        case F_NUM: {
            const json_lex_r r = json_lex_number(&f->sub, c, n->kind == AKV_JS_INTEGER);
            if (r == JL_TAKEN) return !n->bounded || num_take(n, f, c, f->sub);
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

/* Whether the next byte lands in a string's or an enum text's bytes, where whitespace is text
 * (an ANY value's own machine bounds its runs itself). */
static bool in_text(const akv_js_state *s) {
    if (s->done) return false;
    const uint8_t st = s->frames[s->depth - 1].state;
    return st == F_STR || st == F_KEY || st == F_ENUM || st == F_ANY;
}

bool akv_js_feed(akv_js_state *s, const uint8_t *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const bool text = in_text(s);
        if (!feed1(s, bytes[i])) return false;
        if (text) s->ws = s->nl = 0;
        else if (!akv_json_ws_run(&s->ws, &s->nl, bytes[i])) return false;
    }
    return true;
}

bool akv_js_complete(const akv_js_state *s) {
    if (s->done) return true;
    return s->depth == 1 && may_end(s, &s->frames[0]);
}
