/* jinja_eval.c — the Jinja evaluator (tok/jinja_impl.h): statements, expressions, filters,
 * tests, methods and globals with jinja2's semantics as apply_chat_template runs them; and
 * akv/jinja.h's calls. */
#define _POSIX_C_SOURCE 200809L /* strptime-free date parts, gmtime_r */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "tok/jinja_impl.h"
#include "tok/utf8.h"

enum { MAX_DEPTH = 64, MAX_STEPS = 10 * 1000 * 1000 };

typedef struct jframe {
    struct jframe *up;
    jdict *vars;
} jframe;

typedef struct jrun {
    jctx *c;
    jbuf *out;      /* where statements write (a macro's or a block set's own buffer inside) */
    jframe *frame;  /* the scope of the statement being run (exec sets it; names read in it) */
    jframe *root;   /* the context's variables and the template's top-level sets */
    int depth;
    uint64_t steps;
    int jump;       /* 1: break, 2: continue (pending) */
    struct tm date; /* what strftime_now formats */
} jrun;

struct akv_jinja {
    jctx c; /* its arena: the tree */
    jnode *root;
};

typedef jv (*jfn)(jrun *r, const jv *args, const char *const *kw, size_t n, unsigned line);
typedef struct jbuiltin {
    const char *name;
    jfn fn;
} jbuiltin;

static jv eval(jrun *r, const jnode *x);
static void exec(jrun *r, const jnode *x, jframe *f);

/* ---- failures ------------------------------------------------------------------------------- */

_Noreturn static void fail_at(jrun *r, unsigned line, const char *fmt, const char *a, const char *b) {
    r->c->line = line;
    jfail(r->c, AKV_EINVAL, fmt, a, b);
}

static void step(jrun *r, unsigned line) {
    if (++r->steps > MAX_STEPS) {
        r->c->line = line;
        jfail(r->c, AKV_EOVERFLOW, "the rendering passes %d steps", MAX_STEPS);
    }
}

static const char *kind(const jv *v) {
    return jv_kind_name(v->k);
}

/* ---- UTF-8 positions: Python indexes strings by code point -------------------------------- */

static size_t cp_len(const jstr *s) {
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) n += ((unsigned char)s->p[i] & 0xC0) != 0x80;
    return n;
}

/* Byte offset of code point k (k <= cp_len). */
static size_t cp_off(const jstr *s, size_t k) {
    size_t i = 0;
    for (; i < s->n; i++)
        if (((unsigned char)s->p[i] & 0xC0) != 0x80 && k-- == 0) return i;
    return s->n;
}

/* ---- frames and names ----------------------------------------------------------------------- */

static jframe *frame_new(jrun *r, jframe *up) {
    jframe *f = jalloc(r->c, sizeof *f);
    f->up = up;
    f->vars = jv_dict(r->c).d;
    return f;
}

static const jbuiltin *builtin_of(const char *name, size_t n);

static jv lookup(jrun *r, jframe *f, const char *name, size_t n) {
    for (; f; f = f->up) {
        jv *v = jdict_get(f->vars, name, n);
        if (v) return *v;
    }
    const jbuiltin *b = builtin_of(name, n);
    if (b) return (jv){.k = JV_FUNC, .fn = b};
    char *nm = jalloc(r->c, n + 1);
    memcpy(nm, name, n);
    return jv_undef(nm);
}

static void assign(jrun *r, jframe *f, const jnode *t, jv v) {
    if (t->op == JE_NAME) {
        jdict_set(r->c, f->vars, jstr_new(r->c, t->name, t->name_n), v);
        return;
    }
    if (t->op == JE_ATTR) {
        jv ns = lookup(r, f, t->kid[0]->name, t->kid[0]->name_n);
        if (ns.k != JV_DICT || !ns.ns)
            fail_at(r, t->line, "cannot assign attribute '%s' on %s (only a namespace's)", t->name, kind(&ns));
        jdict_set(r->c, ns.d, jstr_new(r->c, t->name, t->name_n), v);
        return;
    }
    /* a tuple of names from a sequence of as many items */
    if (v.k != JV_LIST || v.l->n != t->n_kid) {
        char want[24];
        snprintf(want, sizeof want, "%zu", t->n_kid);
        fail_at(r, t->line, "cannot unpack %s into %s names", kind(&v), want);
    }
    for (size_t i = 0; i < t->n_kid; i++) assign(r, f, t->kid[i], v.l->v[i]);
}

/* ---- conversions ---------------------------------------------------------------------------- */

static const jstr *to_str(jrun *r, const jv *v) {
    if (v->k == JV_STR) return v->s;
    jbuf b = {0};
    jv_print(r->c, &b, v);
    return jbuf_str(r->c, &b);
}

static bool is_num(const jv *v) {
    return v->k == JV_INT || v->k == JV_FLOAT || v->k == JV_BOOL;
}

static double num(const jv *v) {
    return v->k == JV_FLOAT ? v->f : v->k == JV_INT ? (double)v->i : v->b;
}

static int64_t as_int(const jv *v) {
    return v->k == JV_INT ? v->i : v->b;
}

/* The items a value iterates: a list's, a dict's keys, a string's characters; none for
 * undefined. */
static jlist *items_of(jrun *r, const jv *v, unsigned line) {
    if (v->k == JV_LIST) return v->l;
    if (v->k == JV_UNDEF) return jv_list(r->c, 0).l;
    if (v->k == JV_DICT) {
        jlist *l = jv_list(r->c, v->d->n).l;
        for (size_t i = 0; i < v->d->n; i++) l->v[i] = jv_str(v->d->key[i]);
        return l;
    }
    if (v->k == JV_STR) { /* one pass over the bytes: a character at each lead byte */
        const jstr *s = v->s;
        jlist *l = jv_list(r->c, cp_len(s)).l;
        size_t k = 0, at = 0;
        for (size_t i = 1; i <= s->n; i++)
            if (i == s->n || ((unsigned char)s->p[i] & 0xC0) != 0x80) {
                l->v[k++] = jv_str(jstr_sub(r->c, s, at, i - at));
                at = i;
            }
        l->n = k;
        return l;
    }
    fail_at(r, line, "'%s' object is not iterable%s", kind(v), "");
}

static int64_t length_of(jrun *r, const jv *v, unsigned line) {
    switch (v->k) {
    case JV_STR: return (int64_t)cp_len(v->s);
    case JV_LIST: return (int64_t)v->l->n;
    case JV_DICT: return (int64_t)v->d->n;
    case JV_UNDEF: return 0;
    default: fail_at(r, line, "object of type '%s' has no len()%s", kind(v), "");
    }
}

/* ---- comparisons and arithmetic ------------------------------------------------------------ */

static int compare(jrun *r, const jv *a, const jv *b, unsigned line) {
    if (is_num(a) && is_num(b)) {
        if (a->k != JV_FLOAT && b->k != JV_FLOAT) return (as_int(a) > as_int(b)) - (as_int(a) < as_int(b));
        return (num(a) > num(b)) - (num(a) < num(b));
    }
    if (a->k == JV_STR && b->k == JV_STR) {
        const size_t n = a->s->n < b->s->n ? a->s->n : b->s->n;
        const int k = n ? memcmp(a->s->p, b->s->p, n) : 0;
        return k ? (k > 0) - (k < 0) : (a->s->n > b->s->n) - (a->s->n < b->s->n);
    }
    fail_at(r, line, "'<' not supported between %s and %s", kind(a), kind(b));
}

static bool contains(jrun *r, const jv *hay, const jv *needle, unsigned line) {
    if (hay->k == JV_STR) {
        if (needle->k != JV_STR) fail_at(r, line, "'in <string>' requires string as left operand, not %s%s", kind(needle), "");
        const jstr *h = hay->s, *n = needle->s;
        if (!n->n) return true;
        for (size_t i = 0; i + n->n <= h->n; i++)
            if (!memcmp(h->p + i, n->p, n->n)) return true;
        return false;
    }
    if (hay->k == JV_LIST) {
        for (size_t i = 0; i < hay->l->n; i++)
            if (jv_equal(&hay->l->v[i], needle)) return true;
        return false;
    }
    if (hay->k == JV_DICT) return needle->k == JV_STR && jdict_get(hay->d, needle->s->p, needle->s->n);
    if (hay->k == JV_UNDEF) return false;
    fail_at(r, line, "argument of type '%s' is not iterable%s", kind(hay), "");
}

/* A copy of a string's record that may be changed (its bytes and marks shared). */
static jstr *jstr_copy(jrun *r, const jstr *s) {
    jstr *o = jalloc(r->c, sizeof *o);
    *o = *s;
    return o;
}

/* HTML escape (jinja2's escape: & < > " '), marks dropped where the text changes length. */
static const jstr *html_escape(jrun *r, const jstr *s) {
    jbuf b = {0};
    size_t run = 0;
    for (size_t i = 0; i < s->n; i++) {
        const char ch = s->p[i];
        const char *esc = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;"
                        : ch == '"' ? "&#34;" : ch == '\'' ? "&#39;" : NULL;
        if (!esc) continue;
        jbuf_put_str(r->c, &b, jstr_sub(r->c, s, run, i - run));
        jbuf_put(r->c, &b, esc, strlen(esc));
        run = i + 1;
    }
    jbuf_put_str(r->c, &b, jstr_sub(r->c, s, run, s->n - run));
    jstr *o = (jstr *)jbuf_str(r->c, &b);
    o->safe = true;
    return o;
}

static jv arith(jrun *r, const char *op, const jv *a, const jv *b, unsigned line) {
    if (!strcmp(op, "~")) return jv_str(jstr_cat(r->c, to_str(r, a), to_str(r, b)));
    if (!strcmp(op, "==")) return jv_bool(jv_equal(a, b));
    if (!strcmp(op, "!=")) return jv_bool(!jv_equal(a, b));
    if (!strcmp(op, "<")) return jv_bool(compare(r, a, b, line) < 0);
    if (!strcmp(op, "<=")) return jv_bool(compare(r, a, b, line) <= 0);
    if (!strcmp(op, ">")) return jv_bool(compare(r, a, b, line) > 0);
    if (!strcmp(op, ">=")) return jv_bool(compare(r, a, b, line) >= 0);
    if (!strcmp(op, "in")) return jv_bool(contains(r, b, a, line));
    if (!strcmp(op, "notin")) return jv_bool(!contains(r, b, a, line));
    if (!strcmp(op, "+")) {
        if (a->k == JV_STR && b->k == JV_STR && (a->s->safe || b->s->safe)) {
            /* markup: the plain side HTML-escaped, the sum markup (jinja2's Markup) */
            jstr *sum = jstr_copy(r, jstr_cat(r->c, a->s->safe ? a->s : html_escape(r, a->s),
                                                     b->s->safe ? b->s : html_escape(r, b->s)));
            sum->safe = true;
            return jv_str(sum);
        }
        if (a->k == JV_STR && b->k == JV_STR) return jv_str(jstr_cat(r->c, a->s, b->s));
        if (a->k == JV_LIST && b->k == JV_LIST) {
            jv l = jv_list(r->c, a->l->n + b->l->n);
            if (a->l->n) memcpy(l.l->v, a->l->v, a->l->n * sizeof *l.l->v);
            if (b->l->n) memcpy(l.l->v + a->l->n, b->l->v, b->l->n * sizeof *l.l->v);
            return l;
        }
    }
    if (!strcmp(op, "*") && ((a->k == JV_STR && b->k == JV_INT) || (a->k == JV_INT && b->k == JV_STR))) {
        const jv *s = a->k == JV_STR ? a : b;
        const int64_t k = a->k == JV_INT ? a->i : b->i;
        if (k <= 0 || !s->s->n) return jv_str(jstr_new(r->c, "", 0));
        if ((uint64_t)k > (64u << 20) / s->s->n) fail_at(r, line, "a string repeated past %s%s", "64 MiB", "");
        jbuf out = {0};
        for (int64_t i = 0; i < k; i++) jbuf_put_str(r->c, &out, s->s);
        return jv_str(jbuf_str(r->c, &out));
    }
    if (!is_num(a) || !is_num(b))
        fail_at(r, line, "unsupported operand types for an arithmetic operator: %s and %s", kind(a), kind(b));
    const bool fl = a->k == JV_FLOAT || b->k == JV_FLOAT;
    const int64_t x = fl ? 0 : as_int(a), y = fl ? 0 : as_int(b);
    const double fx = num(a), fy = num(b);
    int64_t z;
    if (!strcmp(op, "+")) {
        if (fl) return jv_float(fx + fy);
        if (__builtin_add_overflow(x, y, &z)) fail_at(r, line, "integer overflow%s%s", "", "");
        return jv_int(z);
    }
    if (!strcmp(op, "-")) {
        if (fl) return jv_float(fx - fy);
        if (__builtin_sub_overflow(x, y, &z)) fail_at(r, line, "integer overflow%s%s", "", "");
        return jv_int(z);
    }
    if (!strcmp(op, "*")) {
        if (fl) return jv_float(fx * fy);
        if (__builtin_mul_overflow(x, y, &z)) fail_at(r, line, "integer overflow%s%s", "", "");
        return jv_int(z);
    }
    if (!strcmp(op, "/")) {
        if (fy == 0) fail_at(r, line, "division by zero%s%s", "", "");
        return jv_float(fx / fy);
    }
    if (!strcmp(op, "//") || !strcmp(op, "%")) {
        if (fy == 0) fail_at(r, line, "integer division or modulo by zero%s%s", "", "");
        if (fl) {
            const double q = floor(fx / fy), m = fx - q * fy;
            return op[0] == '/' ? jv_float(q) : jv_float(m);
        }
        if (x == INT64_MIN && y == -1) fail_at(r, line, "integer overflow%s%s", "", "");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) q--, m += y;
        return op[0] == '/' ? jv_int(q) : jv_int(m);
    }
    if (!strcmp(op, "**")) {
        if (fl || y < 0) return jv_float(pow(fx, fy));
        int64_t acc = 1, base = x, e = y; /* by squaring */
        while (e > 0) {
            if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) fail_at(r, line, "integer overflow%s%s", "", "");
            e >>= 1;
            if (e && __builtin_mul_overflow(base, base, &base)) fail_at(r, line, "integer overflow%s%s", "", "");
        }
        return jv_int(acc);
    }
    fail_at(r, line, "unknown operator '%s'%s", op, "");
}

/* ---- strings: Python's methods ------------------------------------------------------------ */

static bool py_space(const jstr *s, size_t i, size_t *len) {
    uint32_t cp;
    if (akv__utf8_next((const uint8_t *)s->p + i, s->n - i, len, &cp) != AKV__UTF8_VALID) {
        *len = 1;
        return false;
    }
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Whether the code point at byte i (of length *len) is in chars (NULL: whitespace). */
static bool strip_hit(const jstr *s, size_t i, const jstr *chars, size_t *len) {
    if (!chars) return py_space(s, i, len);
    uint32_t cp;
    if (akv__utf8_next((const uint8_t *)s->p + i, s->n - i, len, &cp) != AKV__UTF8_VALID) *len = 1;
    for (size_t k = 0; k + *len <= chars->n; k++)
        if (!memcmp(chars->p + k, s->p + i, *len)) return true;
    return false;
}

static const jstr *strip(jrun *r, const jstr *s, const jstr *chars, bool left, bool right) {
    size_t lo = 0, hi = s->n, len;
    while (left && lo < hi && strip_hit(s, lo, chars, &len)) lo += len;
    while (right && hi > lo) {
        size_t start = hi - 1;
        while (start > lo && hi - start < 4 && ((unsigned char)s->p[start] & 0xC0) == 0x80) start--;
        if (!strip_hit(s, start, chars, &len) || start + len != hi) break;
        hi = start;
    }
    return jstr_sub(r->c, s, lo, hi - lo);
}

static const jstr *change_case(jrun *r, const jstr *s, int how /* 0 lower 1 upper 2 title 3 cap */) {
    char *p = jalloc(r->c, s->n + 1);
    bool word_start = true;
    for (size_t i = 0; i < s->n; i++) {
        char ch = s->p[i];
        const bool alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
        bool up = how == 1 || ((how == 2 && word_start) || (how == 3 && i == 0));
        if (how == 0 || (how >= 2 && !up)) up = false;
        if (alpha) ch = up ? (char)(ch & ~0x20) : (char)(ch | 0x20);
        if (how == 1 && !alpha) ch = s->p[i];
        p[i] = ch;
        word_start = !alpha && !((unsigned char)ch >= 0x80) && !(ch >= '0' && ch <= '9');
    }
    jstr *o = jalloc(r->c, sizeof *o);
    *o = *s;
    o->p = p;
    return o;
}

static const jstr *replace(jrun *r, const jstr *s, const jstr *old, const jstr *with, int64_t count) {
    jbuf b = {0};
    size_t i = 0, run = 0;
    int64_t done = 0;
    if (!old->n) /* Python inserts the new text between every character: not taken */
        fail_at(r, 0, "replace with an empty pattern is not supported%s%s", "", "");
    while (i + old->n <= s->n && (count < 0 || done < count)) {
        if (memcmp(s->p + i, old->p, old->n)) {
            i++;
            continue;
        }
        jbuf_put_str(r->c, &b, jstr_sub(r->c, s, run, i - run));
        jbuf_put_str(r->c, &b, with);
        i += old->n, run = i, done++;
    }
    jbuf_put_str(r->c, &b, jstr_sub(r->c, s, run, s->n - run));
    return jbuf_str(r->c, &b);
}

static jv split(jrun *r, const jstr *s, const jstr *sep, int64_t maxsplit) {
    jv out = jv_list(r->c, 0);
    size_t cap = 0;
    jv *items = NULL;
#define PUSH(v)                                                                                    \
    do {                                                                                           \
        if (out.l->n == cap) {                                                                     \
            cap = cap ? 2 * cap : 8;                                                               \
            jv *m_ = jalloc(r->c, cap * sizeof *m_);                                               \
            if (out.l->n) memcpy(m_, items, out.l->n * sizeof *m_);                                \
            items = m_;                                                                            \
        }                                                                                          \
        items[out.l->n++] = (v);                                                                   \
    } while (0)
    size_t i = 0, len;
    int64_t done = 0;
    if (!sep) { /* runs of whitespace, none at the ends */
        while (i < s->n) {
            while (i < s->n && py_space(s, i, &len)) i += len;
            if (i >= s->n) break;
            size_t start = i;
            if (maxsplit >= 0 && done >= maxsplit) {
                size_t end = s->n;
                while (end > start) {
                    size_t k = end - 1;
                    while (k > start && ((unsigned char)s->p[k] & 0xC0) == 0x80) k--;
                    if (!py_space(s, k, &len)) break;
                    end = k;
                }
                PUSH(jv_str(jstr_sub(r->c, s, start, end - start)));
                break;
            }
            while (i < s->n && !py_space(s, i, &len)) i += len;
            PUSH(jv_str(jstr_sub(r->c, s, start, i - start)));
            done++;
        }
    } else {
        if (!sep->n) fail_at(r, 0, "empty separator%s%s", "", "");
        size_t run = 0;
        while (i + sep->n <= s->n && (maxsplit < 0 || done < maxsplit)) {
            if (memcmp(s->p + i, sep->p, sep->n)) {
                i++;
                continue;
            }
            PUSH(jv_str(jstr_sub(r->c, s, run, i - run)));
            i += sep->n, run = i, done++;
        }
        PUSH(jv_str(jstr_sub(r->c, s, run, s->n - run)));
    }
#undef PUSH
    out.l->v = items;
    return out;
}

/* ---- arguments ------------------------------------------------------------------------------ */

/* The argument called `name`, or the pos-th positional one; NULL when not given. */
static const jv *arg(const jv *args, const char *const *kw, size_t n, size_t pos, const char *name) {
    size_t p = 0;
    for (size_t i = 0; i < n; i++) {
        if (kw && kw[i]) {
            if (name && !strcmp(kw[i], name)) return &args[i];
            continue;
        }
        if (p++ == pos) return &args[i];
    }
    return NULL;
}

static const jstr *arg_str(jrun *r, const jv *a, const char *what, unsigned line) {
    if (!a || a->k != JV_STR) fail_at(r, line, "%s must be a string, not %s", what, a ? kind(a) : "missing");
    return a->s;
}

static int64_t arg_int(jrun *r, const jv *a, int64_t dflt, const char *what, unsigned line) {
    if (!a || a->k == JV_NONE) return dflt;
    if (a->k != JV_INT && a->k != JV_BOOL) fail_at(r, line, "%s must be an integer, not %s", what, kind(a));
    return as_int(a);
}

/* ---- tests ---------------------------------------------------------------------------------- */

static bool test(jrun *r, const char *name, const jv *v, const jv *args, size_t n, unsigned line) {
    const jv *a = n ? &args[0] : NULL;
    if (!strcmp(name, "defined")) return v->k != JV_UNDEF;
    if (!strcmp(name, "undefined")) return v->k == JV_UNDEF;
    if (!strcmp(name, "none")) return v->k == JV_NONE;
    if (!strcmp(name, "string")) return v->k == JV_STR;
    if (!strcmp(name, "mapping")) return v->k == JV_DICT;
    if (!strcmp(name, "sequence")) return v->k == JV_STR || v->k == JV_LIST || v->k == JV_DICT;
    if (!strcmp(name, "iterable")) return v->k == JV_STR || v->k == JV_LIST || v->k == JV_DICT;
    if (!strcmp(name, "number")) return is_num(v);
    if (!strcmp(name, "integer")) return v->k == JV_INT;
    if (!strcmp(name, "float")) return v->k == JV_FLOAT;
    if (!strcmp(name, "boolean")) return v->k == JV_BOOL;
    if (!strcmp(name, "true")) return v->k == JV_BOOL && v->b;
    if (!strcmp(name, "false")) return v->k == JV_BOOL && !v->b;
    if (!strcmp(name, "callable")) return v->k == JV_FUNC || v->k == JV_MACRO;
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (v->k != JV_INT) fail_at(r, line, "test '%s' of %s", name, kind(v));
        return (v->i % 2 != 0) == (name[0] == 'o');
    }
    if (!strcmp(name, "divisibleby")) {
        if (v->k != JV_INT || !a || a->k != JV_INT || a->i == 0) fail_at(r, line, "test '%s' of %s", name, kind(v));
        return v->i % a->i == 0;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->k != JV_STR) return false;
        bool any = false;
        for (size_t i = 0; i < v->s->n; i++) {
            const char ch = v->s->p[i];
            if ((ch >= 'A' && ch <= 'Z' && name[0] == 'l') || (ch >= 'a' && ch <= 'z' && name[0] == 'u')) return false;
            any |= (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z');
        }
        return any;
    }
    if (!a) fail_at(r, line, "test '%s' needs an argument%s", name, "");
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) return jv_equal(v, a);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jv_equal(v, a);
    if (!strcmp(name, "sameas")) return v->k == a->k && jv_equal(v, a) && (v->k != JV_LIST || v->l == a->l);
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan")) return compare(r, v, a, line) < 0;
    if (!strcmp(name, "le")) return compare(r, v, a, line) <= 0;
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan")) return compare(r, v, a, line) > 0;
    if (!strcmp(name, "ge")) return compare(r, v, a, line) >= 0;
    if (!strcmp(name, "in")) return contains(r, a, v, line);
    fail_at(r, line, "no test named '%s'%s", name, "");
}

/* ---- filters -------------------------------------------------------------------------------- */

static jv attr_of(jrun *r, const jv *v, const char *name, size_t n, unsigned line);
static jv filter(jrun *r, const char *name, jv v, const jv *args, const char *const *kw, size_t n,
                 unsigned line);

/* A dotted attribute path ("a.b") of v; undefined when missing. */
static jv attr_path(jrun *r, const jv *v, const jstr *path, unsigned line) {
    jv cur = *v;
    size_t at = 0;
    while (at <= path->n) {
        size_t end = at;
        while (end < path->n && path->p[end] != '.') end++;
        if (cur.k == JV_UNDEF) return cur;
        if (cur.k == JV_LIST) {
            char num[24];
            const size_t k = end - at < sizeof num - 1 ? end - at : sizeof num - 1;
            memcpy(num, path->p + at, k), num[k] = 0;
            char *e;
            const long long i = strtoll(num, &e, 10);
            cur = *e || i < 0 || (size_t)i >= cur.l->n ? jv_undef("item") : cur.l->v[i];
        } else {
            cur = attr_of(r, &cur, path->p + at, end - at, line);
        }
        at = end + 1;
    }
    return cur;
}

static __thread int sort_cmp_ctx_case; /* the sort under way: case-sensitive (qsort has no context) */
static int sort_cmp(const void *x, const void *y) {
    const jv *a = x, *b = y;
    if (a->k == JV_STR && b->k == JV_STR && !sort_cmp_ctx_case) {
        const size_t n = a->s->n < b->s->n ? a->s->n : b->s->n;
        for (size_t i = 0; i < n; i++) {
            int ca = (unsigned char)a->s->p[i], cb = (unsigned char)b->s->p[i];
            if (ca >= 'A' && ca <= 'Z') ca |= 0x20;
            if (cb >= 'A' && cb <= 'Z') cb |= 0x20;
            if (ca != cb) return ca - cb;
        }
        return (a->s->n > b->s->n) - (a->s->n < b->s->n);
    }
    if (is_num(a) && is_num(b)) return (num(a) > num(b)) - (num(a) < num(b));
    if (a->k == JV_STR && b->k == JV_STR) {
        const size_t n = a->s->n < b->s->n ? a->s->n : b->s->n;
        const int k = n ? memcmp(a->s->p, b->s->p, n) : 0;
        return k ? k : (a->s->n > b->s->n) - (a->s->n < b->s->n);
    }
    return a->k - b->k;
}

/* A stable sort of l's items by key[] (mergesort on indexes; qsort is not stable). */
static void stable_sort(jrun *r, jv *items, jv *keys, size_t n, bool reverse) {
    size_t *ix = jalloc(r->c, n * sizeof *ix), *tmp = jalloc(r->c, n * sizeof *tmp);
    for (size_t i = 0; i < n; i++) ix[i] = i;
    for (size_t w = 1; w < n; w *= 2)
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) {
                int c = sort_cmp(&keys[ix[a]], &keys[ix[b]]);
                if (reverse) c = -c;
                tmp[k++] = c <= 0 ? ix[a++] : ix[b++];
            }
            while (a < mid) tmp[k++] = ix[a++];
            while (b < hi) tmp[k++] = ix[b++];
            memcpy(ix + lo, tmp + lo, (hi - lo) * sizeof *ix);
        }
    jv *copy = jalloc(r->c, n * sizeof *copy);
    for (size_t i = 0; i < n; i++) copy[i] = items[ix[i]];
    memcpy(items, copy, n * sizeof *copy);
}

static jv list_from(jrun *r, const jv *items, size_t n) {
    jv l = jv_list(r->c, n);
    if (n) memcpy(l.l->v, items, n * sizeof *items);
    return l;
}

static jv filter(jrun *r, const char *name, jv v, const jv *args, const char *const *kw, size_t n,
                 unsigned line) {
    const jv *a0 = arg(args, kw, n, 0, NULL);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        const jv *dflt = arg(args, kw, n, 0, "default_value");
        const jv *boolean = arg(args, kw, n, 1, "boolean");
        if (v.k == JV_UNDEF || (boolean && jv_truthy(boolean) && !jv_truthy(&v)))
            return dflt ? *dflt : jv_str(jstr_new(r->c, "", 0));
        return v;
    }
    if (!strcmp(name, "safe")) {
        jstr *o = jstr_copy(r, to_str(r, &v));
        o->safe = true;
        return jv_str(o);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) return jv_int(length_of(r, &v, line));
    if (!strcmp(name, "string")) return jv_str(to_str(r, &v));
    if (!strcmp(name, "list")) {
        jlist *l = items_of(r, &v, line);
        return list_from(r, l->v, l->n);
    }
    if (!strcmp(name, "tojson")) {
        const jv *indent = arg(args, kw, n, 1, "indent"), *sk = arg(args, kw, n, 3, "sort_keys");
        const jv *ea = arg(args, kw, n, 0, "ensure_ascii");
        if (ea && jv_truthy(ea)) fail_at(r, line, "tojson: ensure_ascii is not supported%s%s", "", "");
        jbuf b = {0};
        const int ind = indent && indent->k == JV_INT ? (indent->i < 0 ? 0 : indent->i > 64 ? 64 : (int)indent->i) : -1;
        jv_tojson(r->c, &b, &v, ind, sk && jv_truthy(sk));
        return jv_str(jbuf_str(r->c, &b));
    }
    if (!strcmp(name, "join")) {
        const jv *sep = arg(args, kw, n, 0, "d"), *at = arg(args, kw, n, 1, "attribute");
        jlist *l = items_of(r, &v, line);
        jbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i && sep) jbuf_put_str(r->c, &b, to_str(r, sep));
            jv item = at ? attr_path(r, &l->v[i], to_str(r, at), line) : l->v[i];
            jbuf_put_str(r->c, &b, to_str(r, &item));
        }
        return jv_str(jbuf_str(r->c, &b));
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        jlist *l = items_of(r, &v, line);
        if (!l->n) return jv_undef(name);
        return name[0] == 'f' ? l->v[0] : l->v[l->n - 1];
    }
    if (!strcmp(name, "reverse")) {
        if (v.k == JV_STR) {
            jlist *l = items_of(r, &v, line);
            jbuf b = {0};
            for (size_t i = l->n; i-- > 0;) jbuf_put_str(r->c, &b, l->v[i].s);
            return jv_str(jbuf_str(r->c, &b));
        }
        jlist *l = items_of(r, &v, line);
        jv out = jv_list(r->c, l->n);
        for (size_t i = 0; i < l->n; i++) out.l->v[i] = l->v[l->n - 1 - i];
        return out;
    }
    if (!strcmp(name, "items")) {
        if (v.k == JV_UNDEF) return jv_list(r->c, 0);
        if (v.k != JV_DICT) fail_at(r, line, "items of %s, not a dict%s", kind(&v), "");
        jv out = jv_list(r->c, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) {
            jv pair = jv_list(r->c, 2);
            pair.tuple = true;
            pair.l->v[0] = jv_str(v.d->key[i]), pair.l->v[1] = v.d->v[i];
            out.l->v[i] = pair;
        }
        return out;
    }
    if (!strcmp(name, "dictsort")) {
        jv pairs = filter(r, "items", v, NULL, NULL, 0, line);
        const jv *cs = arg(args, kw, n, 0, "case_sensitive"), *by = arg(args, kw, n, 1, "by");
        const jv *rev = arg(args, kw, n, 2, "reverse");
        const bool by_value = by && by->k == JV_STR && jstr_eq(by->s, "value", 5);
        jv *keys = jalloc(r->c, (pairs.l->n + 1) * sizeof *keys);
        for (size_t i = 0; i < pairs.l->n; i++) keys[i] = pairs.l->v[i].l->v[by_value];
        sort_cmp_ctx_case = cs && jv_truthy(cs);
        stable_sort(r, pairs.l->v, keys, pairs.l->n, rev && jv_truthy(rev));
        return pairs;
    }
    if (!strcmp(name, "sort") || !strcmp(name, "unique")) {
        jlist *l = items_of(r, &v, line);
        const jv *rev = arg(args, kw, n, 0, "reverse"), *cs = arg(args, kw, n, 1, "case_sensitive");
        const jv *at = arg(args, kw, n, 2, "attribute");
        if (name[0] == 'u') cs = arg(args, kw, n, 0, "case_sensitive"), at = arg(args, kw, n, 1, "attribute"), rev = NULL;
        jv out = list_from(r, l->v, l->n);
        jv *keys = jalloc(r->c, (l->n + 1) * sizeof *keys);
        for (size_t i = 0; i < l->n; i++) keys[i] = at ? attr_path(r, &l->v[i], to_str(r, at), line) : l->v[i];
        sort_cmp_ctx_case = cs && jv_truthy(cs);
        if (name[0] == 's') {
            stable_sort(r, out.l->v, keys, l->n, rev && jv_truthy(rev));
            return out;
        }
        size_t k = 0;
        for (size_t i = 0; i < l->n; i++) {
            bool seen = false;
            for (size_t j = 0; j < i && !seen; j++) seen = sort_cmp(&keys[i], &keys[j]) == 0 && keys[i].k == keys[j].k;
            if (!seen) out.l->v[k++] = l->v[i];
        }
        out.l->n = k;
        return out;
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr") || !strcmp(name, "select") ||
        !strcmp(name, "reject")) {
        const bool by_attr = strstr(name, "attr") != NULL, keep = name[0] == 's';
        jlist *l = jv_truthy(&v) ? items_of(r, &v, line) : jv_list(r->c, 0).l; /* jinja2: `if value` */
        const jv *at = by_attr ? arg(args, kw, n, 0, NULL) : NULL;
        const size_t t0 = by_attr ? 1 : 0;
        const jv *tname = arg(args, kw, n, t0, NULL);
        jv out = jv_list(r->c, l->n);
        size_t k = 0;
        for (size_t i = 0; i < l->n; i++) {
            jv item = by_attr ? attr_path(r, &l->v[i], arg_str(r, at, "the attribute", line), line) : l->v[i];
            bool hit;
            if (!tname) hit = jv_truthy(&item);
            else {
                const jstr *tn = arg_str(r, tname, "the test", line);
                char tbuf[32];
                snprintf(tbuf, sizeof tbuf, "%.*s", (int)(tn->n < 31 ? tn->n : 31), tn->p);
                /* the test's arguments: those after its name, positional */
                size_t n_rest = 0;
                jv rest[4];
                for (size_t j = t0 + 1; n_rest < 4; j++) {
                    const jv *x = arg(args, kw, n, j, NULL);
                    if (!x) break;
                    rest[n_rest++] = *x;
                }
                hit = test(r, tbuf, &item, rest, n_rest, line);
            }
            if (hit == keep) out.l->v[k++] = l->v[i];
        }
        out.l->n = k;
        return out;
    }
    if (!strcmp(name, "map")) {
        jlist *l = jv_truthy(&v) ? items_of(r, &v, line) : jv_list(r->c, 0).l; /* jinja2: `if value` */
        const jv *at = arg(args, kw, n, 99, "attribute"), *dflt = arg(args, kw, n, 99, "default");
        jv out = jv_list(r->c, l->n);
        for (size_t i = 0; i < l->n; i++) {
            if (at) {
                out.l->v[i] = attr_path(r, &l->v[i], to_str(r, at), line);
                if (out.l->v[i].k == JV_UNDEF && dflt) out.l->v[i] = *dflt;
                continue;
            }
            const jstr *fn = arg_str(r, a0, "map's filter", line);
            char fbuf[32];
            snprintf(fbuf, sizeof fbuf, "%.*s", (int)(fn->n < 31 ? fn->n : 31), fn->p);
            /* the filter's own arguments: the rest */
            out.l->v[i] = filter(r, fbuf, l->v[i], n > 1 ? args + 1 : NULL, kw ? kw + 1 : NULL, n ? n - 1 : 0, line);
        }
        return out;
    }
    if (!strcmp(name, "sum")) {
        jlist *l = items_of(r, &v, line);
        const jv *at = arg(args, kw, n, 0, "attribute"), *start = arg(args, kw, n, 1, "start");
        jv acc = start ? *start : jv_int(0);
        for (size_t i = 0; i < l->n; i++) {
            jv item = at ? attr_path(r, &l->v[i], to_str(r, at), line) : l->v[i];
            acc = arith(r, "+", &acc, &item, line);
        }
        return acc;
    }
    if (!strcmp(name, "max") || !strcmp(name, "min")) {
        jlist *l = items_of(r, &v, line);
        if (!l->n) return jv_undef(name);
        jv best = l->v[0];
        for (size_t i = 1; i < l->n; i++) {
            const int c = compare(r, &l->v[i], &best, line);
            if ((name[1] == 'a' && c > 0) || (name[1] == 'i' && c < 0)) best = l->v[i];
        }
        return best;
    }
    if (!strcmp(name, "abs")) {
        if (v.k == JV_INT) {
            if (v.i == INT64_MIN) fail_at(r, line, "integer overflow%s%s", "", "");
            return jv_int(v.i < 0 ? -v.i : v.i);
        }
        if (v.k == JV_FLOAT) return jv_float(fabs(v.f));
        fail_at(r, line, "abs of %s%s", kind(&v), "");
    }
    if (!strcmp(name, "int")) {
        const jv *dflt = arg(args, kw, n, 0, "default");
        if (v.k == JV_INT) return v;
        if (v.k == JV_BOOL) return jv_int(v.b);
        if (v.k == JV_FLOAT && v.f > -9.2e18 && v.f < 9.2e18) return jv_int((int64_t)v.f);
        if (v.k == JV_STR) {
            char buf[64];
            snprintf(buf, sizeof buf, "%.*s", (int)(v.s->n < 63 ? v.s->n : 63), v.s->p);
            char *e;
            const long long i = strtoll(buf, &e, 10);
            if (*buf && !*e) return jv_int(i);
            const double f = strtod(buf, &e);
            if (*buf && !*e && f > -9.2e18 && f < 9.2e18) return jv_int((int64_t)f);
        }
        return dflt ? *dflt : jv_int(0);
    }
    if (!strcmp(name, "float")) {
        const jv *dflt = arg(args, kw, n, 0, "default");
        if (is_num(&v)) return jv_float(num(&v));
        if (v.k == JV_STR) {
            char buf[64];
            snprintf(buf, sizeof buf, "%.*s", (int)(v.s->n < 63 ? v.s->n : 63), v.s->p);
            char *e;
            const double f = strtod(buf, &e);
            if (*buf && !*e) return jv_float(f);
        }
        return dflt ? *dflt : jv_float(0);
    }
    if (!strcmp(name, "round")) {
        const int64_t prec = arg_int(r, arg(args, kw, n, 0, "precision"), 0, "precision", line);
        const jv *method = arg(args, kw, n, 1, "method");
        if (v.k == JV_INT && prec >= 0) return v; /* round(int, n): the int */
        const double m = pow(10, (double)prec), x = num(&v) * m;
        double y = rint(x); /* half to even, as Python's round */
        if (method && method->k == JV_STR && jstr_eq(method->s, "floor", 5)) y = floor(x);
        if (method && method->k == JV_STR && jstr_eq(method->s, "ceil", 4)) y = ceil(x);
        return jv_float(y / m);
    }
    if (v.k == JV_UNDEF) v = jv_str(jstr_new(r->c, "", 0)); /* the string filters see "" */
    if (!strcmp(name, "trim")) {
        const jv *chars = arg(args, kw, n, 0, "chars");
        return jv_str(strip(r, to_str(r, &v), chars && chars->k == JV_STR ? chars->s : NULL, true, true));
    }
    if (!strcmp(name, "upper")) return jv_str(change_case(r, to_str(r, &v), 1));
    if (!strcmp(name, "lower")) return jv_str(change_case(r, to_str(r, &v), 0));
    if (!strcmp(name, "title")) return jv_str(change_case(r, to_str(r, &v), 2));
    if (!strcmp(name, "capitalize")) {
        const jstr *low = change_case(r, to_str(r, &v), 0);
        return jv_str(change_case(r, low, 3));
    }
    if (!strcmp(name, "replace")) {
        const jv *cnt = arg(args, kw, n, 2, "count");
        return jv_str(replace(r, to_str(r, &v), arg_str(r, arg(args, kw, n, 0, "old"), "replace's old", line),
                              to_str(r, arg(args, kw, n, 1, "new") ? arg(args, kw, n, 1, "new") : &v),
                              cnt ? arg_int(r, cnt, -1, "count", line) : -1));
    }
    if (!strcmp(name, "wordcount")) return split(r, to_str(r, &v), NULL, -1).l->n ? jv_int((int64_t)split(r, to_str(r, &v), NULL, -1).l->n) : jv_int(0);
    if (!strcmp(name, "indent")) {
        const int64_t width = arg_int(r, arg(args, kw, n, 0, "width"), 4, "width", line);
        const jv *first = arg(args, kw, n, 1, "first"), *blank = arg(args, kw, n, 2, "blank");
        const jstr *s = to_str(r, &v);
        jbuf b = {0};
        char pad[64];
        const size_t w = width < 0 ? 0 : width > 63 ? 63 : (size_t)width;
        memset(pad, ' ', w);
        size_t at = 0;
        bool first_line = true;
        while (at <= s->n) {
            size_t end = at;
            while (end < s->n && s->p[end] != '\n') end++;
            const bool empty = end == at;
            if ((!first_line || (first && jv_truthy(first))) && (!empty || (blank && jv_truthy(blank))))
                jbuf_put(r->c, &b, pad, w);
            jbuf_put_str(r->c, &b, jstr_sub(r->c, s, at, end - at));
            if (end < s->n) jbuf_put(r->c, &b, "\n", 1);
            first_line = false;
            at = end + 1;
            if (end == s->n) break;
        }
        return jv_str(jbuf_str(r->c, &b));
    }
    if (!strcmp(name, "e") || !strcmp(name, "escape")) {
        const jstr *s = to_str(r, &v);
        return jv_str(s->safe ? s : html_escape(r, s));
    }
    fail_at(r, line, "no filter named '%s'%s", name, "");
}

/* ---- attributes, items, methods ------------------------------------------------------------ */

static jv attr_of(jrun *r, const jv *v, const char *name, size_t n, unsigned line) {
    if (v->k == JV_DICT) {
        jv *x = jdict_get(v->d, name, n);
        if (x) return *x;
        char *nm = jalloc(r->c, n + 1);
        memcpy(nm, name, n);
        return jv_undef(nm);
    }
    if (v->k == JV_UNDEF) {
        char nm[48];
        snprintf(nm, sizeof nm, "%.*s", (int)(n < 40 ? n : 40), name);
        fail_at(r, line, "'%s' is undefined (reading its attribute '%s')", v->undef ? v->undef : "value", nm);
    }
    return jv_undef("attribute"); /* a method read as a value: not supported */
}

static jv item_of(jrun *r, const jv *v, const jv *k, unsigned line) {
    if (v->k == JV_DICT) {
        if (k->k != JV_STR) return jv_undef("item");
        jv *x = jdict_get(v->d, k->s->p, k->s->n);
        return x ? *x : jv_undef("item");
    }
    if (v->k == JV_LIST || v->k == JV_STR) {
        if (k->k != JV_INT && k->k != JV_BOOL) {
            if (k->k == JV_STR) return attr_of(r, v, k->s->p, k->s->n, line); /* e.g. a method */
            fail_at(r, line, "indices must be integers, not %s%s", kind(k), "");
        }
        const int64_t len = length_of(r, v, line);
        int64_t i = as_int(k);
        if (i < 0) i += len;
        if (i < 0 || i >= len) return jv_undef("item");
        if (v->k == JV_LIST) return v->l->v[i];
        const size_t a = cp_off(v->s, (size_t)i), b = cp_off(v->s, (size_t)i + 1);
        return jv_str(jstr_sub(r->c, v->s, a, b - a));
    }
    if (v->k == JV_UNDEF)
        fail_at(r, line, "'%s' is undefined (reading an item)%s", v->undef ? v->undef : "value", "");
    fail_at(r, line, "'%s' object is not subscriptable%s", kind(v), "");
}

static jv slice(jrun *r, const jv *v, const jv *lo, const jv *hi, const jv *st, unsigned line) {
    if (v->k != JV_LIST && v->k != JV_STR) fail_at(r, line, "'%s' object is not sliceable%s", kind(v), "");
    const int64_t len = length_of(r, v, line);
    const int64_t stp = st && st->k != JV_NONE ? arg_int(r, st, 1, "a slice step", line) : 1;
    if (stp == 0) fail_at(r, line, "slice step cannot be zero%s%s", "", "");
    int64_t a, b;
    const bool has_a = lo && lo->k != JV_NONE, has_b = hi && hi->k != JV_NONE;
    if (stp > 0) {
        a = has_a ? arg_int(r, lo, 0, "a slice bound", line) : 0;
        b = has_b ? arg_int(r, hi, 0, "a slice bound", line) : len;
        if (a < 0) a += len;
        if (b < 0) b += len;
        a = a < 0 ? 0 : a > len ? len : a;
        b = b < 0 ? 0 : b > len ? len : b;
    } else {
        a = has_a ? arg_int(r, lo, 0, "a slice bound", line) : len - 1;
        b = has_b ? arg_int(r, hi, 0, "a slice bound", line) : -len - 1;
        if (a < 0) a += len;
        if (b < 0) b += len;
        a = a < -1 ? -1 : a > len - 1 ? len - 1 : a;
        b = b < -1 ? -1 : b > len - 1 ? len - 1 : b;
    }
    /* a and b lie in [-1, len]: their span fits; the step may be any int64 */
    const int64_t span = stp > 0 ? b - a : a - b;
    const uint64_t ust = stp > 0 ? (uint64_t)stp : (uint64_t)(-(stp + 1)) + 1;
    const size_t count = span > 0 ? (size_t)(((uint64_t)span - 1) / ust + 1) : 0;
    if (v->k == JV_STR && stp == 1) { /* a run of characters: its bytes at once */
        const size_t from = cp_off(v->s, (size_t)a);
        return jv_str(jstr_sub(r->c, v->s, from, count ? cp_off(v->s, (size_t)b) - from : 0));
    }
    jlist *items = items_of(r, v, line);
    jv out = jv_list(r->c, count);
    for (size_t k = 0; k < count; k++) out.l->v[k] = items->v[a + (int64_t)k * stp]; /* within the span */
    if (v->k == JV_LIST) return out;
    jbuf b2 = {0};
    for (size_t i = 0; i < count; i++) jbuf_put_str(r->c, &b2, out.l->v[i].s);
    return jv_str(jbuf_str(r->c, &b2));
}

/* A method of a string, a dict or the loop; *found false when v has no such method. */
static jv method(jrun *r, const jv *v, const char *name, const jv *args, const char *const *kw,
                 size_t n, unsigned line, bool *found) {
    *found = true;
    const jv *a0 = arg(args, kw, n, 0, NULL), *a1 = arg(args, kw, n, 1, NULL);
    if (v->k == JV_STR) {
        const jstr *s = v->s;
        if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
            const jstr *chars = a0 && a0->k == JV_STR ? a0->s : NULL;
            return jv_str(strip(r, s, chars, name[0] != 'r', name[0] != 'l'));
        }
        if (!strcmp(name, "upper")) return jv_str(change_case(r, s, 1));
        if (!strcmp(name, "lower")) return jv_str(change_case(r, s, 0));
        if (!strcmp(name, "title")) return jv_str(change_case(r, s, 2));
        if (!strcmp(name, "capitalize")) return jv_str(change_case(r, change_case(r, s, 0), 3));
        if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
            const jv *sep = arg(args, kw, n, 0, "sep"), *mx = arg(args, kw, n, 1, "maxsplit");
            if (!strcmp(name, "rsplit") && mx && arg_int(r, mx, -1, "maxsplit", line) >= 0)
                fail_at(r, line, "rsplit with maxsplit is not supported%s%s", "", "");
            return split(r, s, sep && sep->k == JV_STR ? sep->s : NULL, mx ? arg_int(r, mx, -1, "maxsplit", line) : -1);
        }
        if (!strcmp(name, "splitlines")) {
            jv out = split(r, s, jstr_new(r->c, "\n", 1), -1);
            if (out.l->n && !out.l->v[out.l->n - 1].s->n) out.l->n--;
            return out;
        }
        if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
            if (!a0) fail_at(r, line, "%s needs an argument%s", name, "");
            const jlist *opts = a0->k == JV_LIST ? a0->l : NULL;
            const size_t k = opts ? opts->n : 1;
            for (size_t i = 0; i < k; i++) {
                const jstr *x = arg_str(r, opts ? &opts->v[i] : a0, name, line);
                if (x->n <= s->n && !memcmp(name[0] == 's' ? s->p : s->p + s->n - x->n, x->p, x->n))
                    return jv_bool(true);
            }
            return jv_bool(false);
        }
        if (!strcmp(name, "replace"))
            return jv_str(replace(r, s, arg_str(r, a0, "replace's old", line), arg_str(r, a1, "replace's new", line),
                                  arg_int(r, arg(args, kw, n, 2, NULL), -1, "count", line)));
        if (!strcmp(name, "find") || !strcmp(name, "count")) {
            const jstr *x = arg_str(r, a0, name, line);
            int64_t hits = 0;
            for (size_t i = 0; i + x->n <= s->n; i++)
                if (!memcmp(s->p + i, x->p, x->n)) {
                    if (name[0] == 'f') {
                        size_t cps = 0;
                        for (size_t k = 0; k < i; k++) cps += ((unsigned char)s->p[k] & 0xC0) != 0x80;
                        return jv_int((int64_t)cps);
                    }
                    hits++;
                    i += x->n ? x->n - 1 : 0;
                }
            return jv_int(name[0] == 'f' ? -1 : hits);
        }
        if (!strcmp(name, "join")) {
            jlist *l = items_of(r, a0 ? a0 : v, line);
            jbuf b = {0};
            for (size_t i = 0; i < l->n; i++) {
                if (i) jbuf_put_str(r->c, &b, s);
                jbuf_put_str(r->c, &b, arg_str(r, &l->v[i], "join's item", line));
            }
            return jv_str(jbuf_str(r->c, &b));
        }
        if (!strcmp(name, "isdigit") || !strcmp(name, "isalpha") || !strcmp(name, "isspace")) {
            if (!s->n) return jv_bool(false);
            for (size_t i = 0; i < s->n; i++) {
                const char ch = s->p[i];
                const bool ok = name[2] == 'd' ? ch >= '0' && ch <= '9'
                                : name[2] == 'a' ? (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')
                                                 : ch == ' ' || (ch >= '\t' && ch <= '\r');
                if (!ok) return jv_bool(false);
            }
            return jv_bool(true);
        }
    }
    if (v->k == JV_DICT && !v->ns) {
        if (!strcmp(name, "items")) return filter(r, "items", *v, NULL, NULL, 0, line);
        if (!strcmp(name, "keys") || !strcmp(name, "values")) {
            jv out = jv_list(r->c, v->d->n);
            for (size_t i = 0; i < v->d->n; i++) out.l->v[i] = name[0] == 'k' ? jv_str(v->d->key[i]) : v->d->v[i];
            return out;
        }
        if (!strcmp(name, "get")) {
            const jstr *k = arg_str(r, a0, "get's key", line);
            jv *x = jdict_get(v->d, k->p, k->n);
            return x ? *x : a1 ? *a1 : jv_none();
        }
    }
    *found = false;
    return jv_undef(name);
}

/* ---- calls: builtins and macros ----------------------------------------------------------- */

static jv fn_range(jrun *r, const jv *args, const char *const *kw, size_t n, unsigned line) {
    (void)kw;
    int64_t a = 0, b, s = 1;
    if (n == 1) b = arg_int(r, &args[0], 0, "range's stop", line);
    else if (n == 2 || n == 3) {
        a = arg_int(r, &args[0], 0, "range's start", line), b = arg_int(r, &args[1], 0, "range's stop", line);
        if (n == 3) s = arg_int(r, &args[2], 1, "range's step", line);
    } else fail_at(r, line, "range takes 1 to 3 arguments%s%s", "", "");
    if (s == 0) fail_at(r, line, "range's step must not be zero%s%s", "", "");
    /* in unsigned arithmetic: b - a may pass int64 */
    const bool some = s > 0 ? b > a : a > b;
    const uint64_t span = s > 0 ? (uint64_t)b - (uint64_t)a : (uint64_t)a - (uint64_t)b;
    const uint64_t ust = s > 0 ? (uint64_t)s : (uint64_t)(-(s + 1)) + 1;
    const uint64_t count = some ? (span - 1) / ust + 1 : 0;
    if (count > 1000000) fail_at(r, line, "range of more than %s items%s", "1000000", "");
    jv out = jv_list(r->c, (size_t)count);
    for (uint64_t i = 0; i < count; i++) out.l->v[i] = jv_int((int64_t)((uint64_t)a + i * (uint64_t)s));
    return out;
}

static jv fn_dict(jrun *r, const jv *args, const char *const *kw, size_t n, unsigned line, bool ns) {
    jv d = jv_dict(r->c);
    d.ns = ns;
    for (size_t i = 0; i < n; i++) {
        if (!kw || !kw[i]) {
            if (args[i].k == JV_DICT && !i) {
                for (size_t k = 0; k < args[i].d->n; k++) jdict_set(r->c, d.d, args[i].d->key[k], args[i].d->v[k]);
                continue;
            }
            fail_at(r, line, "%s takes keyword arguments%s", ns ? "namespace" : "dict", "");
        }
        jdict_set(r->c, d.d, jstr_lit(r->c, kw[i]), args[i]);
    }
    return d;
}

static jv fn_namespace(jrun *r, const jv *args, const char *const *kw, size_t n, unsigned line) {
    return fn_dict(r, args, kw, n, line, true);
}

static jv fn_dict_plain(jrun *r, const jv *args, const char *const *kw, size_t n, unsigned line) {
    return fn_dict(r, args, kw, n, line, false);
}

static jv fn_raise(jrun *r, const jv *args, const char *const *kw, size_t n, unsigned line) {
    (void)kw;
    const jstr *m = n ? to_str(r, &args[0]) : jstr_new(r->c, "", 0);
    char msg[200];
    snprintf(msg, sizeof msg, "%.*s", (int)(m->n < 199 ? m->n : 199), m->p);
    fail_at(r, line, "the template raised: %s%s", msg, "");
}

static jv fn_strftime_now(jrun *r, const jv *args, const char *const *kw, size_t n, unsigned line) {
    (void)kw;
    const jstr *f = arg_str(r, n ? &args[0] : NULL, "strftime_now's format", line);
    char fmt[128], out[256];
    snprintf(fmt, sizeof fmt, "%.*s", (int)(f->n < 127 ? f->n : 127), f->p);
    const size_t k = strftime(out, sizeof out, fmt, &r->date);
    return jv_str(jstr_new(r->c, out, k));
}

static const jbuiltin builtins[] = {{"range", fn_range},
                                    {"namespace", fn_namespace},
                                    {"dict", fn_dict_plain},
                                    {"raise_exception", fn_raise},
                                    {"strftime_now", fn_strftime_now}};

static const jbuiltin *builtin_of(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof builtins / sizeof *builtins; i++)
        if (strlen(builtins[i].name) == n && !memcmp(builtins[i].name, name, n)) return &builtins[i];
    return NULL;
}

static jv call_macro(jrun *r, const jnode *m, const jv *args, const char *const *kw, size_t n,
                     unsigned line) {
    if (r->depth >= MAX_DEPTH) {
        r->c->line = line;
        jfail(r->c, AKV_EOVERFLOW, "macros call each other deeper than %d", MAX_DEPTH);
    }
    jframe *f = frame_new(r, r->root);
    const size_t n_par = (m->n_kid - 1) / 2;
    size_t pos = 0;
    for (size_t i = 0; i < n; i++)
        if (!kw || !kw[i]) {
            if (pos >= n_par) fail_at(r, line, "macro '%s' takes %s positional arguments", m->name, "fewer");
            assign(r, f, m->kid[1 + 2 * pos], args[i]);
            pos++;
        }
    for (size_t p = 0; p < n_par; p++) {
        const jnode *pn = m->kid[1 + 2 * p];
        jv *given = NULL;
        for (size_t i = 0; i < n; i++)
            if (kw && kw[i] && strlen(kw[i]) == pn->name_n && !memcmp(kw[i], pn->name, pn->name_n))
                given = (jv *)&args[i];
        if (given) assign(r, f, pn, *given);
        else if (p >= pos) {
            jbuf *saved = r->out;
            jv d = m->kid[2 + 2 * p] ? eval(r, m->kid[2 + 2 * p]) : jv_undef(pn->name);
            r->out = saved;
            assign(r, f, pn, d);
        }
    }
    jbuf b = {0}, *saved = r->out;
    b.limit = saved->limit;
    r->out = &b;
    r->depth++;
    exec(r, m->kid[0], f);
    r->depth--;
    r->out = saved;
    r->jump = 0;
    return jv_str(jbuf_str(r->c, &b));
}

/* ---- expressions ---------------------------------------------------------------------------- */


static void eval_args(jrun *r, const jnode *x, size_t from, jv **args, const char *const **kw,
                      size_t *n) {
    *n = x->n_kid - from;
    *args = *n ? jalloc(r->c, *n * sizeof **args) : NULL;
    for (size_t i = 0; i < *n; i++) (*args)[i] = x->kid[from + i] ? eval(r, x->kid[from + i]) : jv_undef("");
    *kw = x->kw ? (const char *const *)x->kw + from : NULL;
}

static jv eval(jrun *r, const jnode *x) {
    step(r, x->line);
    switch (x->op) {
    case JE_LIT: return x->lit;
    case JE_NAME: return lookup(r, r->frame, x->name, x->name_n);
    case JE_LIST:
    case JE_TUPLE: {
        jv l = jv_list(r->c, x->n_kid);
        l.tuple = x->op == JE_TUPLE;
        for (size_t i = 0; i < x->n_kid; i++) l.l->v[i] = eval(r, x->kid[i]);
        return l;
    }
    case JE_DICT: {
        jv d = jv_dict(r->c);
        for (size_t i = 0; i + 1 < x->n_kid; i += 2) {
            jv k = eval(r, x->kid[i]);
            if (k.k != JV_STR) fail_at(r, x->line, "a dict key must be a string here, not %s%s", kind(&k), "");
            jdict_set(r->c, d.d, k.s, eval(r, x->kid[i + 1]));
        }
        return d;
    }
    case JE_ATTR: {
        jv o = eval(r, x->kid[0]);
        return attr_of(r, &o, x->name, x->name_n, x->line);
    }
    case JE_INDEX: {
        jv o = eval(r, x->kid[0]), k = eval(r, x->kid[1]);
        return item_of(r, &o, &k, x->line);
    }
    case JE_SLICE: {
        jv o = eval(r, x->kid[0]);
        jv lo = x->kid[1] ? eval(r, x->kid[1]) : jv_none(), hi = x->kid[2] ? eval(r, x->kid[2]) : jv_none();
        jv st = x->kid[3] ? eval(r, x->kid[3]) : jv_none();
        return slice(r, &o, &lo, &hi, &st, x->line);
    }
    case JE_CALL: {
        jv *args;
        const char *const *kw;
        size_t n;
        const jnode *callee = x->kid[0];
        if (callee->op == JE_ATTR) { /* a method */
            jv o = eval(r, callee->kid[0]);
            eval_args(r, x, 1, &args, &kw, &n);
            bool found;
            char nm[48];
            snprintf(nm, sizeof nm, "%.*s", (int)(callee->name_n < 47 ? callee->name_n : 47), callee->name);
            jv out = method(r, &o, nm, args, kw, n, x->line, &found);
            if (found) return out;
            jv f = attr_of(r, &o, callee->name, callee->name_n, x->line);
            if (f.k == JV_MACRO) return call_macro(r, f.macro, args, kw, n, x->line);
            if (f.k == JV_FUNC) return f.fn->fn(r, args, kw, n, x->line);
            fail_at(r, x->line, "%s has no method '%s'", kind(&o), nm);
        }
        jv f = eval(r, callee);
        eval_args(r, x, 1, &args, &kw, &n);
        if (f.k == JV_FUNC) return f.fn->fn(r, args, kw, n, x->line);
        if (f.k == JV_MACRO) return call_macro(r, f.macro, args, kw, n, x->line);
        fail_at(r, x->line, "'%s' is not callable%s", f.k == JV_UNDEF && f.undef ? f.undef : kind(&f), "");
    }
    case JE_FILTER:
    case JE_TEST: { /* v | name(args), v is [not] name(args) */
        jv v = eval(r, x->kid[0]);
        jv *args;
        const char *const *kw;
        size_t n;
        eval_args(r, x, 1, &args, &kw, &n);
        if (x->op == JE_FILTER) return filter(r, x->name, v, args, kw, n, x->line);
        return jv_bool(test(r, x->name, &v, args, n, x->line) != x->negate);
    }
    case JE_NOT: {
        jv v = eval(r, x->kid[0]);
        return jv_bool(!jv_truthy(&v));
    }
    case JE_NEG:
    case JE_POS: {
        jv v = eval(r, x->kid[0]);
        if (v.k == JV_INT) {
            if (x->op == JE_NEG && v.i == INT64_MIN) fail_at(r, x->line, "integer overflow%s%s", "", "");
            return jv_int(x->op == JE_NEG ? -v.i : v.i);
        }
        if (v.k == JV_FLOAT) return jv_float(x->op == JE_NEG ? -v.f : v.f);
        if (v.k == JV_BOOL) return jv_int(x->op == JE_NEG ? -(int64_t)v.b : v.b);
        fail_at(r, x->line, "bad operand type for unary -: '%s'%s", kind(&v), "");
    }
    case JE_AND: {
        jv a = eval(r, x->kid[0]);
        return jv_truthy(&a) ? eval(r, x->kid[1]) : a;
    }
    case JE_OR: {
        jv a = eval(r, x->kid[0]);
        return jv_truthy(&a) ? a : eval(r, x->kid[1]);
    }
    case JE_COND: {
        jv c = eval(r, x->kid[1]);
        if (jv_truthy(&c)) return eval(r, x->kid[0]);
        return x->kid[2] ? eval(r, x->kid[2]) : jv_undef("");
    }
    case JE_BIN: {
        jv a = eval(r, x->kid[0]), b = eval(r, x->kid[1]);
        if ((a.k == JV_UNDEF || b.k == JV_UNDEF) && strcmp(x->name, "==") && strcmp(x->name, "!=") &&
            strcmp(x->name, "~") && strcmp(x->name, "in") && strcmp(x->name, "notin"))
            fail_at(r, x->line, "'%s' is undefined (an operand of '%s')",
                    (a.k == JV_UNDEF ? a.undef : b.undef) ? (a.k == JV_UNDEF ? a.undef : b.undef) : "value",
                    x->name);
        return arith(r, x->name, &a, &b, x->line);
    }
    default: fail_at(r, x->line, "not an expression%s%s", "", "");
    }
}

/* ---- statements ----------------------------------------------------------------------------- */

static void loop_vars(jrun *r, jframe *f, jlist *items, size_t i) {
    jv loop = jv_dict(r->c);
    const int64_t n = (int64_t)items->n, k = (int64_t)i;
    jdict_set(r->c, loop.d, jstr_lit(r->c, "index"), jv_int(k + 1));
    jdict_set(r->c, loop.d, jstr_lit(r->c, "index0"), jv_int(k));
    jdict_set(r->c, loop.d, jstr_lit(r->c, "revindex"), jv_int(n - k));
    jdict_set(r->c, loop.d, jstr_lit(r->c, "revindex0"), jv_int(n - k - 1));
    jdict_set(r->c, loop.d, jstr_lit(r->c, "first"), jv_bool(k == 0));
    jdict_set(r->c, loop.d, jstr_lit(r->c, "last"), jv_bool(k == n - 1));
    jdict_set(r->c, loop.d, jstr_lit(r->c, "length"), jv_int(n));
    jdict_set(r->c, loop.d, jstr_lit(r->c, "depth"), jv_int(1));
    jdict_set(r->c, loop.d, jstr_lit(r->c, "depth0"), jv_int(0));
    if (i > 0) jdict_set(r->c, loop.d, jstr_lit(r->c, "previtem"), items->v[i - 1]);
    if (i + 1 < items->n) jdict_set(r->c, loop.d, jstr_lit(r->c, "nextitem"), items->v[i + 1]);
    jdict_set(r->c, f->vars, jstr_lit(r->c, "loop"), loop);
}

/* A block's body (kid[at]) rendered on its own, then the filters after it (kid[at + 1 ..]). */
static jv block_filtered(jrun *r, const jnode *x, size_t at, jframe *f) {
    jbuf b = {0}, *saved_out = r->out;
    b.limit = saved_out->limit;
    r->out = &b;
    exec(r, x->kid[at], f);
    r->out = saved_out;
    jv v = jv_str(jbuf_str(r->c, &b));
    for (size_t i = at + 1; i < x->n_kid; i++) {
        const jnode *fl = x->kid[i];
        jv *args;
        const char *const *kw;
        size_t n;
        eval_args(r, fl, 1, &args, &kw, &n);
        v = filter(r, fl->name, v, args, kw, n, fl->line);
    }
    return v;
}

static void exec(jrun *r, const jnode *x, jframe *f) {
    jframe *saved = r->frame;
    r->frame = f;
    r->c->line = x->line;
    step(r, x->line);
    switch (x->op) {
    case JS_BLOCK:
        for (size_t i = 0; i < x->n_kid && !r->jump; i++) exec(r, x->kid[i], f);
        break;
    case JS_TEXT: jbuf_put_str(r->c, r->out, x->lit.s); break;
    case JS_OUT: {
        jv v = eval(r, x->kid[0]);
        jv_print(r->c, r->out, &v);
        break;
    }
    case JS_IF: {
        size_t i = 0;
        for (; i + 1 < x->n_kid; i += 2) {
            jv c = eval(r, x->kid[i]);
            if (jv_truthy(&c)) {
                exec(r, x->kid[i + 1], f);
                break;
            }
        }
        if (i + 1 == x->n_kid) exec(r, x->kid[i], f); /* else */
        break;
    }
    case JS_FOR: {
        jv it = eval(r, x->kid[1]);
        jlist *all = items_of(r, &it, x->line);
        jlist *items = all;
        if (x->kid[2]) { /* the loop's filter, before loop.* counts */
            items = jv_list(r->c, all->n).l;
            size_t k = 0;
            for (size_t i = 0; i < all->n; i++) {
                jframe *tf = frame_new(r, f);
                assign(r, tf, x->kid[0], all->v[i]);
                r->frame = tf;
                jv c = eval(r, x->kid[2]);
                if (jv_truthy(&c)) items->v[k++] = all->v[i];
            }
            items->n = k;
            r->frame = f;
        }
        for (size_t i = 0; i < items->n; i++) {
            jframe *lf = frame_new(r, f);
            assign(r, lf, x->kid[0], items->v[i]);
            loop_vars(r, lf, items, i);
            exec(r, x->kid[3], lf);
            if (r->jump == 1) {
                r->jump = 0;
                break;
            }
            r->jump = 0;
        }
        if (!items->n && x->kid[4]) exec(r, x->kid[4], f);
        break;
    }
    case JS_SET: assign(r, f, x->kid[0], eval(r, x->kid[1])); break;
    case JS_SET_BLOCK: assign(r, f, x->kid[0], block_filtered(r, x, 1, f)); break;
    case JS_MACRO:
        jdict_set(r->c, f->vars, jstr_new(r->c, x->name, x->name_n), (jv){.k = JV_MACRO, .macro = x});
        break;
    case JS_FILTER_BLOCK: {
        jv v = block_filtered(r, x, 0, f);
        jv_print(r->c, r->out, &v);
        break;
    }
    case JS_BREAK: r->jump = 1; break;
    case JS_CONTINUE: r->jump = 2; break;
    default: fail_at(r, x->line, "not a statement%s%s", "", "");
    }
    r->frame = saved;
}

/* ---- the calls ------------------------------------------------------------------------------ */

akv_status akv_jinja_compile(const char *src, size_t n, akv_jinja **out, akv_jinja_error *err) {
    akv_jinja_error scratch;
    if (!err) err = &scratch;
    memset(err, 0, sizeof *err);
    akv_jinja *t = akv__calloc(1, sizeof *t);
    if (!t) return AKV_ENOMEM;
    t->c.err = err;
    if (setjmp(t->c.fail)) {
        const akv_status st = t->c.status;
        jarena_free(&t->c);
        akv__free(t);
        return st;
    }
    t->root = jparse(&t->c, src ? src : "", src ? n : 0);
    t->c.err = NULL;
    *out = t;
    return AKV_OK;
}

void akv_jinja_destroy(akv_jinja *t) {
    if (!t) return;
    jarena_free(&t->c);
    akv__free(t);
}

/* Days from 1970-01-01 to the civil date y-m-d (proleptic Gregorian). */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const int64_t yoe = y - era * 400;
    const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static bool parse_date(const char *s, struct tm *tm) {
    int y, m, d;
    char tail;
    if (!s || sscanf(s, "%d-%d-%d%c", &y, &m, &d, &tail) != 3 || y < 1 || y > 9999 || m < 1 ||
        m > 12 || d < 1 || d > 31)
        return false;
    const int64_t days = days_from_civil(y, m, d);
    if (days_from_civil(y, m, 1) + d - 1 >= days_from_civil(m == 12 ? y + 1 : y, m == 12 ? 1 : m + 1, 1))
        return false; /* past the month's end */
    memset(tm, 0, sizeof *tm);
    tm->tm_year = y - 1900, tm->tm_mon = m - 1, tm->tm_mday = d, tm->tm_hour = 12;
    tm->tm_wday = (int)(((days % 7) + 11) % 7); /* 1970-01-01 was a Thursday */
    tm->tm_yday = (int)(days - days_from_civil(y, 1, 1));
    return true;
}

akv_status akv_jinja_render(const akv_jinja *t, const akv_jinja_render_params *p,
                            akv_tok_text *out, akv_tok_spans *plain, akv_jinja_error *err) {
    akv_jinja_error scratch;
    if (!err) err = &scratch;
    memset(err, 0, sizeof *err);
    /* the arena's record on the heap: written between setjmp and a longjmp, read after it */
    jctx *const c = akv__calloc(1, sizeof *c);
    if (!c) return AKV_ENOMEM;
    c->err = err;
    jbuf b = {.limit = p->max_output ? p->max_output : (16u << 20)};
    jrun r = {.c = c, .out = &b};
    if (p->date) {
        if (!parse_date(p->date, &r.date)) {
            snprintf(err->msg, sizeof err->msg, "the date '%.40s' is not YYYY-MM-DD", p->date);
            akv__free(c);
            return AKV_EINVAL;
        }
    } else {
        time_t now = time(NULL);
        gmtime_r(&now, &r.date);
    }
    if (setjmp(c->fail)) {
        const akv_status st = c->status;
        jarena_free(c);
        akv__free(c);
        return st;
    }
    static const char *const content[] = {"content"};
    const char *const *keys = p->plain_keys ? p->plain_keys : content;
    const size_t n_keys = p->plain_keys ? p->n_plain_keys : 1;
    const size_t nb = p->context_bytes ? p->context_bytes : (p->context_json ? strlen(p->context_json) : 0);
    jv ctx = p->context_json ? jv_from_json(c, p->context_json, nb, keys, n_keys) : jv_dict(c);
    if (ctx.k != JV_DICT) jfail(c, AKV_EFORMAT, "the context JSON is %s, not an object", kind(&ctx));
    r.root = frame_new(&r, NULL);
    r.root->vars = ctx.d;
    jframe *top = frame_new(&r, r.root); /* the template's own sets */
    r.root = top;
    exec(&r, t->root, top);
    /* the output and its marked stretches, all or nothing */
    const size_t n0 = out->n_bytes, k0 = plain ? plain->n : 0;
    akv_status st = akv_tok_text_append(out, b.p ? b.p : "", b.n);
    for (size_t i = 0; !st && plain && i < b.n_mark; i++)
        st = akv_tok_spans_push(plain, n0 + b.mark[i].off, b.mark[i].n);
    if (st) {
        out->n_bytes = n0;
        if (out->bytes) out->bytes[n0] = 0;
        if (plain) plain->n = k0;
    }
    jarena_free(c);
    akv__free(c);
    return st;
}
