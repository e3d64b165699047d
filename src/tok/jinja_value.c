/* jinja_value.c — the Jinja interpreter's values (tok/jinja_impl.h): the arena, strings and
 * their marked stretches, lists and dicts, JSON in and out, and values printed as Python
 * prints them. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "tok/jinja_impl.h"
#include "tok/utf8.h"

/* ---- the arena and the failure path ------------------------------------------------------- */

void jfail(jctx *c, akv_status st, const char *fmt, ...) {
    c->status = st;
    if (c->err && (st != AKV_ENOMEM || !c->err->msg[0])) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err->msg, sizeof c->err->msg, fmt, ap);
        va_end(ap);
        c->err->line = c->line;
    }
    longjmp(c->fail, 1);
}

void *jalloc(jctx *c, size_t n) {
    if (n > ((size_t)1 << 40)) jfail(c, AKV_EOVERFLOW, "an allocation of %zu bytes", n);
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    jchunk *h = c->chunks;
    if (!h || h->cap - h->used < n) {
        const size_t cap = n > (64u << 10) ? n : (64u << 10);
        jchunk *k = akv__malloc(sizeof *k + cap);
        if (!k) jfail(c, AKV_ENOMEM, "out of memory");
        k->next = h, k->used = 0, k->cap = cap;
        c->chunks = h = k;
    }
    void *p = (char *)h->data + h->used;
    h->used += n;
    memset(p, 0, n);
    return p;
}

void jarena_free(jctx *c) {
    for (jchunk *k = c->chunks, *next; k; k = next) {
        next = k->next;
        akv__free(k);
    }
    c->chunks = NULL;
}

/* ---- strings ------------------------------------------------------------------------------ */

const jstr *jstr_new(jctx *c, const char *p, size_t n) {
    jstr *s = jalloc(c, sizeof *s);
    char *q = jalloc(c, n + 1);
    if (n) memcpy(q, p, n);
    s->p = q, s->n = n;
    return s;
}

const jstr *jstr_lit(jctx *c, const char *p) {
    jstr *s = jalloc(c, sizeof *s);
    s->p = p, s->n = strlen(p);
    return s;
}

/* Marks of s clipped to [off, off + n), shifted by `shift` - off, appended to out[*k]. */
static void marks_clip(const jstr *s, size_t off, size_t n, size_t shift, jspan *out, uint32_t *k) {
    for (uint32_t i = 0; i < s->n_mark; i++) {
        size_t a = s->mark[i].off, b = a + s->mark[i].n;
        if (a < off) a = off;
        if (b > off + n) b = off + n;
        if (a >= b) continue;
        if (*k && out[*k - 1].off + out[*k - 1].n == a - off + shift)
            out[*k - 1].n += b - a; /* continues the one before */
        else
            out[(*k)++] = (jspan){a - off + shift, b - a};
    }
}

const jstr *jstr_cat(jctx *c, const jstr *a, const jstr *b) {
    if (!b->n) return a;
    if (!a->n) return b;
    jstr *s = jalloc(c, sizeof *s);
    char *q = jalloc(c, a->n + b->n + 1);
    memcpy(q, a->p, a->n), memcpy(q + a->n, b->p, b->n);
    s->p = q, s->n = a->n + b->n;
    if (a->n_mark + b->n_mark) {
        s->mark = jalloc(c, (a->n_mark + b->n_mark) * sizeof *s->mark);
        marks_clip(a, 0, a->n, 0, s->mark, &s->n_mark);
        marks_clip(b, 0, b->n, a->n, s->mark, &s->n_mark);
    }
    return s;
}

const jstr *jstr_sub(jctx *c, const jstr *s, size_t off, size_t n) {
    if (off == 0 && n == s->n) return s;
    jstr *r = jalloc(c, sizeof *r);
    r->p = s->p + off, r->n = n;
    if (s->n_mark) {
        r->mark = jalloc(c, s->n_mark * sizeof *r->mark);
        marks_clip(s, off, n, 0, r->mark, &r->n_mark);
    }
    return r;
}

const jstr *jstr_marked(jctx *c, const jstr *s) {
    if (!s->n || (s->n_mark == 1 && s->mark[0].off == 0 && s->mark[0].n == s->n)) return s;
    jstr *r = jalloc(c, sizeof *r);
    *r = *s;
    r->mark = jalloc(c, sizeof *r->mark);
    r->mark[0] = (jspan){0, s->n};
    r->n_mark = 1;
    return r;
}

bool jstr_eq(const jstr *a, const char *p, size_t n) {
    return a->n == n && (n == 0 || memcmp(a->p, p, n) == 0);
}

/* ---- lists and dicts ---------------------------------------------------------------------- */

jv jv_list(jctx *c, size_t n) {
    jlist *l = jalloc(c, sizeof *l);
    l->n = n;
    l->v = n ? jalloc(c, n * sizeof *l->v) : NULL;
    return (jv){.k = JV_LIST, .l = l};
}

jv jv_dict(jctx *c) {
    return (jv){.k = JV_DICT, .d = jalloc(c, sizeof(jdict))};
}

jv *jdict_get(const jdict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (jstr_eq(d->key[i], key, n)) return &d->v[i];
    return NULL;
}

void jdict_set(jctx *c, jdict *d, const jstr *key, jv v) {
    jv *at = jdict_get(d, key->p, key->n);
    if (at) {
        *at = v;
        return;
    }
    if (d->n == d->cap) {
        const size_t cap = d->cap ? 2 * d->cap : 8;
        const jstr **k = jalloc(c, cap * sizeof *k);
        jv *vv = jalloc(c, cap * sizeof *vv);
        if (d->n) memcpy(k, d->key, d->n * sizeof *k), memcpy(vv, d->v, d->n * sizeof *vv);
        d->key = k, d->v = vv, d->cap = cap;
    }
    d->key[d->n] = key, d->v[d->n] = v;
    d->n++;
}

/* ---- the growing string --------------------------------------------------------------------- */

void jbuf_put(jctx *c, jbuf *b, const char *p, size_t n) {
    if (!n) return;
    if (b->limit && b->n + n > b->limit)
        jfail(c, AKV_EOVERFLOW, "the rendering passes its limit of %zu bytes", b->limit);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = jalloc(c, cap);
        if (b->n) memcpy(q, b->p, b->n);
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jbuf_put_str(jctx *c, jbuf *b, const jstr *s) {
    const size_t at = b->n;
    jbuf_put(c, b, s->p, s->n);
    for (uint32_t i = 0; i < s->n_mark; i++) {
        const jspan m = {at + s->mark[i].off, s->mark[i].n};
        if (b->n_mark && b->mark[b->n_mark - 1].off + b->mark[b->n_mark - 1].n == m.off) {
            b->mark[b->n_mark - 1].n += m.n;
            continue;
        }
        if (b->n_mark == b->cap_mark) {
            const size_t cap = b->cap_mark ? 2 * b->cap_mark : 16;
            jspan *q = jalloc(c, cap * sizeof *q);
            if (b->n_mark) memcpy(q, b->mark, b->n_mark * sizeof *q);
            b->mark = q, b->cap_mark = cap;
        }
        b->mark[b->n_mark++] = m;
    }
}

const jstr *jbuf_str(jctx *c, const jbuf *b) {
    jstr *s = jalloc(c, sizeof *s);
    s->p = b->p ? b->p : "", s->n = b->n;
    if (b->n_mark) {
        s->mark = jalloc(c, b->n_mark * sizeof *s->mark);
        memcpy(s->mark, b->mark, b->n_mark * sizeof *s->mark);
        s->n_mark = (uint32_t)b->n_mark;
    }
    return s;
}

/* ---- truth, names, equality ----------------------------------------------------------------- */

bool jv_truthy(const jv *v) {
    switch (v->k) {
    case JV_BOOL: return v->b;
    case JV_INT: return v->i != 0;
    case JV_FLOAT: return v->f != 0;
    case JV_STR: return v->s->n != 0;
    case JV_LIST: return v->l->n != 0;
    case JV_DICT: return v->d->n != 0;
    case JV_FUNC:
    case JV_MACRO: return true;
    default: return false;
    }
}

const char *jv_kind_name(jkind k) {
    static const char *const names[] = {"Undefined", "NoneType", "bool", "int", "float",
                                        "str", "list", "dict", "function", "macro"};
    return names[k];
}

static bool jv_is_num(const jv *v) {
    return v->k == JV_INT || v->k == JV_FLOAT || v->k == JV_BOOL;
}

static double jv_num(const jv *v) {
    return v->k == JV_FLOAT ? v->f : v->k == JV_INT ? (double)v->i : v->b;
}

bool jv_equal(const jv *a, const jv *b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a->k != JV_FLOAT && b->k != JV_FLOAT)
            return (a->k == JV_INT ? a->i : a->b) == (b->k == JV_INT ? b->i : b->b);
        return jv_num(a) == jv_num(b);
    }
    if (a->k != b->k) return false;
    switch (a->k) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return jstr_eq(a->s, b->s->p, b->s->n);
    case JV_LIST:
        if (a->l->n != b->l->n) return false;
        for (size_t i = 0; i < a->l->n; i++)
            if (!jv_equal(&a->l->v[i], &b->l->v[i])) return false;
        return true;
    case JV_DICT:
        if (a->d->n != b->d->n) return false;
        for (size_t i = 0; i < a->d->n; i++) {
            const jv *o = jdict_get(b->d, a->d->key[i]->p, a->d->key[i]->n);
            if (!o || !jv_equal(&a->d->v[i], o)) return false;
        }
        return true;
    case JV_FUNC: return a->fn == b->fn;
    case JV_MACRO: return a->macro == b->macro;
    default: return false;
    }
}

/* ---- printing ------------------------------------------------------------------------------- */

void jfloat_repr(double f, char *buf, size_t cap) {
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    /* the shortest digits that read back as f, then Python's layout of them */
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    char digits[24];
    size_t nd = 0;
    const char *q = e;
    bool neg = false;
    if (*q == '-') neg = true, q++;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    size_t k = 0;
    char out[64];
    if (neg) out[k++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            out[k++] = '0', out[k++] = '.';
            for (int i = -1; i > exp10; i--) out[k++] = '0';
            for (size_t i = 0; i < nd; i++) out[k++] = digits[i];
        } else {
            for (int i = 0; i <= exp10; i++) out[k++] = (size_t)i < nd ? digits[i] : '0';
            out[k++] = '.';
            if ((size_t)exp10 + 1 < nd)
                for (size_t i = (size_t)exp10 + 1; i < nd; i++) out[k++] = digits[i];
            else
                out[k++] = '0';
        }
        out[k] = 0;
    } else {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (size_t i = 1; i < nd; i++) out[k++] = digits[i];
        }
        out[k] = 0;
        snprintf(out + k, sizeof out - k, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
    snprintf(buf, cap, "%s", out);
}

/* Whether byte i of s lies in a marked stretch. */
static bool marked_at(const jstr *s, size_t i) {
    for (uint32_t k = 0; k < s->n_mark; k++)
        if (i >= s->mark[k].off && i < s->mark[k].off + s->mark[k].n) return true;
    return false;
}

/* An escape written for byte i of s: marked when that byte is (message text stays text when
 * a template prints it through repr or tojson). */
static void put_escape(jctx *c, jbuf *b, const jstr *s, size_t i, const char *esc, size_t n) {
    if (!marked_at(s, i)) {
        jbuf_put(c, b, esc, n);
        return;
    }
    const jspan all = {0, n};
    const jstr e = {.p = esc, .n = n, .mark = (jspan *)&all, .n_mark = 1};
    jbuf_put_str(c, b, &e);
}

/* Python's repr of a string: single quotes unless it holds one and no double quote. */
static void str_repr(jctx *c, jbuf *b, const jstr *s) {
    const bool dq = memchr(s->p, '\'', s->n) && !memchr(s->p, '"', s->n);
    const char q = dq ? '"' : '\'';
    jbuf_put(c, b, &q, 1);
    size_t run = 0;
    for (size_t i = 0; i < s->n; i++) {
        const unsigned char ch = (unsigned char)s->p[i];
        char esc[8];
        size_t k = 0;
        if (ch == (unsigned char)q || ch == '\\') esc[0] = '\\', esc[1] = (char)ch, k = 2;
        else if (ch == '\n') memcpy(esc, "\\n", 2), k = 2;
        else if (ch == '\r') memcpy(esc, "\\r", 2), k = 2;
        else if (ch == '\t') memcpy(esc, "\\t", 2), k = 2;
        else if (ch < 0x20 || ch == 0x7f) k = (size_t)snprintf(esc, sizeof esc, "\\x%02x", ch);
        if (!k) continue;
        jbuf_put_str(c, b, jstr_sub(c, s, run, i - run));
        put_escape(c, b, s, i, esc, k);
        run = i + 1;
    }
    jbuf_put_str(c, b, jstr_sub(c, s, run, s->n - run));
    jbuf_put(c, b, &q, 1);
}

static void jv_show(jctx *c, jbuf *b, const jv *v, bool repr) {
    char num[64];
    switch (v->k) {
    case JV_UNDEF: return; /* prints as nothing */
    case JV_NONE: jbuf_put(c, b, "None", 4); return;
    case JV_BOOL: v->b ? jbuf_put(c, b, "True", 4) : jbuf_put(c, b, "False", 5); return;
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v->i); break;
    case JV_FLOAT: jfloat_repr(v->f, num, sizeof num); break;
    case JV_STR:
        if (repr) str_repr(c, b, v->s);
        else jbuf_put_str(c, b, v->s);
        return;
    case JV_LIST:
        jbuf_put(c, b, v->tuple ? "(" : "[", 1);
        for (size_t i = 0; i < v->l->n; i++) {
            if (i) jbuf_put(c, b, ", ", 2);
            jv_show(c, b, &v->l->v[i], true);
        }
        if (v->tuple && v->l->n == 1) jbuf_put(c, b, ",", 1);
        jbuf_put(c, b, v->tuple ? ")" : "]", 1);
        return;
    case JV_DICT:
        if (v->ns) jbuf_put(c, b, "<Namespace ", 11);
        jbuf_put(c, b, "{", 1);
        for (size_t i = 0; i < v->d->n; i++) {
            if (i) jbuf_put(c, b, ", ", 2);
            str_repr(c, b, v->d->key[i]);
            jbuf_put(c, b, ": ", 2);
            jv_show(c, b, &v->d->v[i], true);
        }
        jbuf_put(c, b, "}", 1);
        if (v->ns) jbuf_put(c, b, ">", 1);
        return;
    default: snprintf(num, sizeof num, "<%s>", jv_kind_name(v->k)); break;
    }
    jbuf_put(c, b, num, strlen(num));
}

void jv_print(jctx *c, jbuf *b, const jv *v) {
    jv_show(c, b, v, false);
}

void jv_repr(jctx *c, jbuf *b, const jv *v) {
    jv_show(c, b, v, true);
}

/* ---- JSON out: json.dumps ------------------------------------------------------------------- */

static void json_str(jctx *c, jbuf *b, const jstr *s) {
    jbuf_put(c, b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < s->n; i++) {
        const unsigned char ch = (unsigned char)s->p[i];
        const char *esc = NULL;
        char u[8];
        switch (ch) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (ch < 0x20) snprintf(u, sizeof u, "\\u%04x", ch), esc = u;
        }
        if (!esc) continue;
        jbuf_put_str(c, b, jstr_sub(c, s, run, i - run));
        put_escape(c, b, s, i, esc, strlen(esc));
        run = i + 1;
    }
    jbuf_put_str(c, b, jstr_sub(c, s, run, s->n - run));
    jbuf_put(c, b, "\"", 1);
}

static void json_nl(jctx *c, jbuf *b, int indent, int depth) {
    jbuf_put(c, b, "\n", 1);
    for (int i = 0; i < indent * depth; i++) jbuf_put(c, b, " ", 1);
}

static int key_cmp(const void *x, const void *y) {
    const jstr *a = *(const jstr *const *)x, *b = *(const jstr *const *)y;
    const size_t n = a->n < b->n ? a->n : b->n;
    const int r = n ? memcmp(a->p, b->p, n) : 0;
    return r ? r : (a->n > b->n) - (a->n < b->n);
}

static void json_val(jctx *c, jbuf *b, const jv *v, int indent, bool sort, int depth) {
    if (depth > 256) jfail(c, AKV_EOVERFLOW, "tojson: nested deeper than 256");
    char num[64];
    const char *item_sep = indent >= 0 ? "," : ", ";
    switch (v->k) {
    case JV_NONE: jbuf_put(c, b, "null", 4); return;
    case JV_BOOL: v->b ? jbuf_put(c, b, "true", 4) : jbuf_put(c, b, "false", 5); return;
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v->i); break;
    case JV_FLOAT:
        if (isnan(v->f)) snprintf(num, sizeof num, "NaN");
        else if (isinf(v->f)) snprintf(num, sizeof num, v->f < 0 ? "-Infinity" : "Infinity");
        else jfloat_repr(v->f, num, sizeof num);
        break;
    case JV_STR: json_str(c, b, v->s); return;
    case JV_LIST:
        if (!v->l->n) {
            jbuf_put(c, b, "[]", 2);
            return;
        }
        jbuf_put(c, b, "[", 1);
        for (size_t i = 0; i < v->l->n; i++) {
            if (i) jbuf_put(c, b, item_sep, strlen(item_sep));
            if (indent >= 0) json_nl(c, b, indent, depth + 1);
            json_val(c, b, &v->l->v[i], indent, sort, depth + 1);
        }
        if (indent >= 0) json_nl(c, b, indent, depth);
        jbuf_put(c, b, "]", 1);
        return;
    case JV_DICT: {
        if (!v->d->n) {
            jbuf_put(c, b, "{}", 2);
            return;
        }
        size_t *order = jalloc(c, v->d->n * sizeof *order);
        for (size_t i = 0; i < v->d->n; i++) order[i] = i;
        if (sort) {
            const jstr **keys = jalloc(c, v->d->n * sizeof *keys);
            memcpy(keys, v->d->key, v->d->n * sizeof *keys);
            qsort(keys, v->d->n, sizeof *keys, key_cmp);
            for (size_t i = 0; i < v->d->n; i++)
                for (size_t j = 0; j < v->d->n; j++)
                    if (v->d->key[j] == keys[i]) order[i] = j;
        }
        jbuf_put(c, b, "{", 1);
        for (size_t i = 0; i < v->d->n; i++) {
            if (i) jbuf_put(c, b, item_sep, strlen(item_sep));
            if (indent >= 0) json_nl(c, b, indent, depth + 1);
            json_str(c, b, v->d->key[order[i]]);
            jbuf_put(c, b, ": ", 2);
            json_val(c, b, &v->d->v[order[i]], indent, sort, depth + 1);
        }
        if (indent >= 0) json_nl(c, b, indent, depth);
        jbuf_put(c, b, "}", 1);
        return;
    }
    default: jfail(c, AKV_EINVAL, "Object of type %s is not JSON serializable", jv_kind_name(v->k));
    }
    jbuf_put(c, b, num, strlen(num));
}

void jv_tojson(jctx *c, jbuf *b, const jv *v, int indent, bool sort_keys) {
    json_val(c, b, v, indent, sort_keys, 0);
}

/* ---- JSON in ------------------------------------------------------------------------------- */

typedef struct jjson {
    jctx *c;
    const char *p;
    size_t n, at;
    const char *const *plain;
    size_t n_plain;
} jjson;

_Noreturn static void json_bad(jjson *j, const char *what) {
    jfail(j->c, AKV_EFORMAT, "the context JSON: %s at byte %zu", what, j->at);
}

static void json_ws(jjson *j) {
    while (j->at < j->n && (j->p[j->at] == ' ' || j->p[j->at] == '\t' || j->p[j->at] == '\n' ||
                            j->p[j->at] == '\r'))
        j->at++;
}

static unsigned json_hex4(jjson *j) {
    if (j->n - j->at < 4) json_bad(j, "a short \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        const char ch = j->p[j->at++];
        v <<= 4;
        if (ch >= '0' && ch <= '9') v |= (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f') v |= (unsigned)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F') v |= (unsigned)(ch - 'A' + 10);
        else json_bad(j, "a bad \\u escape");
    }
    return v;
}

static const jstr *json_string(jjson *j) {
    jbuf b = {0};
    j->at++; /* the quote */
    for (;;) {
        if (j->at >= j->n) json_bad(j, "an unterminated string");
        const unsigned char ch = (unsigned char)j->p[j->at];
        if (ch == '"') break;
        if (ch < 0x20) json_bad(j, "a control character in a string");
        if (ch != '\\') {
            size_t run = j->at;
            while (j->at < j->n && j->p[j->at] != '"' && j->p[j->at] != '\\' &&
                   (unsigned char)j->p[j->at] >= 0x20)
                j->at++;
            jbuf_put(j->c, &b, j->p + run, j->at - run);
            continue;
        }
        if (++j->at >= j->n) json_bad(j, "an unterminated escape");
        const char e = j->p[j->at++];
        char one = 0;
        switch (e) {
        case '"': one = '"'; break;
        case '\\': one = '\\'; break;
        case '/': one = '/'; break;
        case 'b': one = '\b'; break;
        case 'f': one = '\f'; break;
        case 'n': one = '\n'; break;
        case 'r': one = '\r'; break;
        case 't': one = '\t'; break;
        case 'u': {
            unsigned cp = json_hex4(j);
            if (cp >= 0xD800 && cp < 0xDC00 && j->n - j->at >= 6 && j->p[j->at] == '\\' &&
                j->p[j->at + 1] == 'u') {
                const size_t back = j->at;
                j->at += 2;
                const unsigned lo = json_hex4(j);
                if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else j->at = back;
            }
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD; /* a lone surrogate */
            char u[4];
            size_t k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
            if (k == 1) u[0] = (char)cp;
            else if (k == 2) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F));
            else if (k == 3)
                u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
                u[2] = (char)(0x80 | (cp & 0x3F));
            else
                u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
                u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F));
            jbuf_put(j->c, &b, u, k);
            continue;
        }
        default: json_bad(j, "an unknown escape");
        }
        jbuf_put(j->c, &b, &one, 1);
    }
    j->at++;
    return jbuf_str(j->c, &b);
}

static jv json_value(jjson *j, int depth, bool plain);

/* After an item of an object or array: true past a ',' (another item follows), false past its
 * `close`; anything else is malformed. */
static bool json_more(jjson *j, char close) {
    json_ws(j);
    if (j->at < j->n && (j->p[j->at] == ',' || j->p[j->at] == close)) return j->p[j->at++] == ',';
    json_bad(j, close == '}' ? "',' or '}' missing" : "',' or ']' missing");
}

static bool json_key_plain(const jjson *j, const jstr *k) {
    for (size_t i = 0; i < j->n_plain; i++)
        if (jstr_eq(k, j->plain[i], strlen(j->plain[i]))) return true;
    return false;
}

static jv json_value(jjson *j, int depth, bool plain) {
    if (depth > 512) json_bad(j, "nesting deeper than 512");
    json_ws(j);
    if (j->at >= j->n) json_bad(j, "a value missing");
    const char ch = j->p[j->at];
    if (ch == '"') {
        const jstr *s = json_string(j);
        return jv_str(plain ? jstr_marked(j->c, s) : s);
    }
    if (ch == '{') {
        jv d = jv_dict(j->c);
        j->at++;
        json_ws(j);
        if (j->at < j->n && j->p[j->at] == '}') {
            j->at++;
            return d;
        }
        for (;;) {
            json_ws(j);
            if (j->at >= j->n || j->p[j->at] != '"') json_bad(j, "a key missing");
            const jstr *k = json_string(j);
            json_ws(j);
            if (j->at >= j->n || j->p[j->at] != ':') json_bad(j, "':' missing");
            j->at++;
            jdict_set(j->c, d.d, k, json_value(j, depth + 1, plain || json_key_plain(j, k)));
            if (!json_more(j, '}')) return d;
        }
    }
    if (ch == '[') {
        size_t n = 0, cap = 8;
        jv *items = jalloc(j->c, cap * sizeof *items);
        j->at++;
        json_ws(j);
        if (j->at < j->n && j->p[j->at] == ']') {
            j->at++;
            return jv_list(j->c, 0);
        }
        for (;;) {
            if (n == cap) {
                jv *more = jalloc(j->c, 2 * cap * sizeof *more);
                memcpy(more, items, n * sizeof *more);
                items = more, cap *= 2;
            }
            items[n++] = json_value(j, depth + 1, plain);
            if (!json_more(j, ']')) break;
        }
        jv l = jv_list(j->c, n);
        memcpy(l.l->v, items, n * sizeof *items);
        return l;
    }
    if (j->n - j->at >= 4 && !memcmp(j->p + j->at, "null", 4)) return j->at += 4, jv_none();
    if (j->n - j->at >= 4 && !memcmp(j->p + j->at, "true", 4)) return j->at += 4, jv_bool(true);
    if (j->n - j->at >= 5 && !memcmp(j->p + j->at, "false", 5)) return j->at += 5, jv_bool(false);
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        size_t s = j->at;
        bool is_float = false;
        if (j->p[j->at] == '-') j->at++;
        while (j->at < j->n && ((j->p[j->at] >= '0' && j->p[j->at] <= '9') || j->p[j->at] == '.' ||
                                j->p[j->at] == 'e' || j->p[j->at] == 'E' || j->p[j->at] == '+' ||
                                j->p[j->at] == '-')) {
            is_float |= j->p[j->at] == '.' || j->p[j->at] == 'e' || j->p[j->at] == 'E';
            j->at++;
        }
        char num[64];
        if (j->at - s >= sizeof num) json_bad(j, "a number too long");
        memcpy(num, j->p + s, j->at - s);
        num[j->at - s] = 0;
        char *end;
        if (!is_float) {
            long long v = strtoll(num, &end, 10);
            if (*end == 0) return jv_int(v);
        }
        double f = strtod(num, &end);
        if (*end) json_bad(j, "a bad number");
        return jv_float(f);
    }
    json_bad(j, "an unexpected character");
}

jv jv_from_json(jctx *c, const char *p, size_t n, const char *const *plain_keys, size_t n_plain) {
    jjson j = {c, p, n, 0, plain_keys, n_plain};
    jv v = json_value(&j, 0, false);
    json_ws(&j);
    if (j.at != n) json_bad(&j, "text after the value");
    return v;
}
