/* jinja_parse.c — a template into its syntax tree (tok/jinja_impl.h): the tags found with
 * jinja2's whitespace rules (trim_blocks and lstrip_blocks on, as apply_chat_template sets
 * them; {%- -%} and {%+), each tag's tokens, and a recursive descent with jinja2's
 * precedence.
 *
 * Node layouts (kid[] in order; kw[i], when kw is set, names kid[i] as a keyword argument):
 *   JS_BLOCK  the statements            JS_TEXT  lit: the text       JS_OUT  the expression
 *   JS_IF     cond, body, cond, body, ..., [else body]
 *   JS_FOR    target (a name or a tuple of names), iterable, filter or NULL, body, else or NULL
 *   JS_SET    target (a name, a tuple of names, an attribute), value
 *   JS_SET_BLOCK  target, body, then filters (JE_FILTER with no input)
 *   JS_MACRO  body, then a parameter (JE_NAME) and its default or NULL, for each
 *   JS_FILTER_BLOCK  body, then filters        JS_BREAK, JS_CONTINUE  nothing
 *   JE_LIT lit   JE_NAME name   JE_LIST / JE_TUPLE items   JE_DICT key, value, key, value, ...
 *   JE_ATTR object (name)   JE_INDEX object, index   JE_SLICE object, start, stop, step (each
 *   may be NULL)   JE_CALL callee, arguments   JE_FILTER input, arguments (name)
 *   JE_TEST input, arguments (name, negate)   JE_NOT / JE_NEG / JE_POS operand
 *   JE_AND / JE_OR left, right   JE_COND then, condition, else or NULL
 *   JE_BIN left, right (name: the operator: + - * / // % ** ~ == != < <= > >= in notin) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/jinja_impl.h"

/* ---- tokens of a tag ------------------------------------------------------------------------ */

typedef enum jtk { TK_END = 0, TK_NAME, TK_INT, TK_FLOAT, TK_STR, TK_OP } jtk;

typedef struct jtok {
    jtk t;
    const char *p; /* its text (TK_STR: the decoded string in s) */
    size_t n;
    const jstr *s;
    int64_t i;
    double f;
    unsigned line;
} jtok;

typedef struct jparser {
    jctx *c;
    const char *src;
    size_t n;
    /* the tag being parsed */
    jtok *tok;
    size_t n_tok, at;
    /* the tags of the template, in order */
    struct jtag *tags;
    size_t n_tags, tag_at;
    int depth; /* expressions and blocks open: bounded, so no template runs the stack out */
} jparser;

typedef enum jtagk { TAG_TEXT, TAG_OUT, TAG_STMT } jtagk;

typedef struct jtag {
    jtagk k;
    const char *p; /* TEXT: the text (stripped); OUT / STMT: the inside of the tag */
    size_t n;
    unsigned line;
} jtag;

static unsigned line_at(const jparser *ps, const char *p) {
    unsigned line = 1;
    for (const char *q = ps->src; q < p; q++) line += *q == '\n';
    return line;
}

_Noreturn static void syntax(jparser *ps, unsigned line, const char *fmt, const char *what) {
    ps->c->line = line;
    jfail(ps->c, AKV_EFORMAT, fmt, what);
}

static bool is_ws(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

static void tag_push(jparser *ps, jtagk k, const char *p, size_t n, unsigned line) {
    static const size_t grow = 64;
    if (ps->n_tags % grow == 0) {
        jtag *more = jalloc(ps->c, (ps->n_tags + grow) * sizeof *more);
        if (ps->n_tags) memcpy(more, ps->tags, ps->n_tags * sizeof *more);
        ps->tags = more;
    }
    ps->tags[ps->n_tags++] = (jtag){k, p, n, line};
}

/* Where the tag opened at `open` ("{{", "{%", "{#") closes: the index of its closing pair,
 * past strings in expressions. */
static size_t tag_close(jparser *ps, size_t open, char kind) {
    const char close = kind == '{' ? '}' : kind;
    char quote = 0;
    int depth = 0; /* brackets open inside an expression: a "}}" there closes a dict */
    for (size_t i = open + 2; i + 1 < ps->n; i++) {
        const char ch = ps->src[i];
        if (kind != '#' && quote) {
            if (ch == '\\') i++;
            else if (ch == quote) quote = 0;
            continue;
        }
        if (kind != '#' && (ch == '\'' || ch == '"')) {
            quote = ch;
            continue;
        }
        if (ch == close && ps->src[i + 1] == '}' && depth <= 0) return i;
        if (kind != '#' && (ch == '(' || ch == '[' || ch == '{')) depth++;
        if (kind != '#' && (ch == ')' || ch == ']' || ch == '}')) depth--;
    }
    syntax(ps, line_at(ps, ps->src + open), "a tag opened here is never closed%s", "");
}

/* The template's tags, with jinja2's whitespace rules. */
static void scan(jparser *ps) {
    const char *s = ps->src;
    size_t pos = 0, text = 0;
    bool line_starting = true;
    while (pos < ps->n) {
        const char *hit = NULL;
        for (size_t i = pos; i + 1 < ps->n; i++)
            if (s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')) {
                hit = s + i;
                break;
            }
        if (!hit) break;
        const size_t open = (size_t)(hit - s);
        const char kind = s[open + 1];
        const char sign = open + 2 < ps->n ? s[open + 2] : 0;
        size_t text_end = open;
        if (sign == '-') {
            while (text_end > text && is_ws(s[text_end - 1])) text_end--;
        } else if (sign != '+' && kind != '{') { /* lstrip_blocks */
            size_t l = text_end;
            while (l > text && s[l - 1] != '\n') l--;
            bool blank = true;
            for (size_t i = l; i < text_end && blank; i++) blank = s[i] == ' ' || s[i] == '\t';
            if (blank && (l > text || line_starting)) text_end = l;
        }
        if (text_end > text) tag_push(ps, TAG_TEXT, s + text, text_end - text, line_at(ps, s + text));
        const size_t close = tag_close(ps, open, kind);
        size_t in0 = open + 2, in1 = close;
        if (sign == '-' || sign == '+') in0++;
        const bool strip_after = in1 > in0 && s[in1 - 1] == '-';
        if (strip_after) in1--;
        size_t after = close + 2;
        if (strip_after) {
            while (after < ps->n && is_ws(s[after])) after++;
        } else if (kind != '{' && after < ps->n && s[after] == '\n') { /* trim_blocks */
            after++;
        }
        line_starting = after > close + 2 && s[after - 1] == '\n';
        const unsigned line = line_at(ps, s + open);
        if (kind == '{') tag_push(ps, TAG_OUT, s + in0, in1 - in0, line);
        else if (kind == '%') {
            /* raw: everything to {% endraw %} is text */
            size_t a = in0;
            while (a < in1 && is_ws(s[a])) a++;
            size_t b = in1;
            while (b > a && is_ws(s[b - 1])) b--;
            if (b - a == 3 && !memcmp(s + a, "raw", 3)) {
                const char *end = NULL;
                for (size_t i = after; i + 1 < ps->n && !end; i++) {
                    if (s[i] != '{' || s[i + 1] != '%') continue;
                    size_t k = i + 2;
                    if (k < ps->n && (s[k] == '-' || s[k] == '+')) k++;
                    while (k < ps->n && is_ws(s[k])) k++;
                    if (ps->n - k >= 6 && !memcmp(s + k, "endraw", 6)) end = s + i;
                }
                if (!end) syntax(ps, line, "a raw block is never closed%s", "");
                size_t raw_end = (size_t)(end - s);
                if (s[raw_end + 2] == '-')
                    while (raw_end > after && is_ws(s[raw_end - 1])) raw_end--;
                tag_push(ps, TAG_TEXT, s + after, raw_end - after, line);
                const size_t endclose = tag_close(ps, (size_t)(end - s), '%');
                after = endclose + 2;
                if (s[endclose - 1] == '-') {
                    while (after < ps->n && is_ws(s[after])) after++;
                } else if (after < ps->n && s[after] == '\n') {
                    after++;
                }
                line_starting = s[after - 1] == '\n';
            } else {
                tag_push(ps, TAG_STMT, s + in0, in1 - in0, line);
            }
        }
        pos = text = after;
    }
    if (ps->n > text) tag_push(ps, TAG_TEXT, s + text, ps->n - text, line_at(ps, s + text));
}

/* ---- a tag's tokens ------------------------------------------------------------------------- */

static void tok_push(jparser *ps, jtok t) {
    static const size_t grow = 32;
    if (ps->n_tok % grow == 0) {
        jtok *more = jalloc(ps->c, (ps->n_tok + grow) * sizeof *more);
        if (ps->n_tok) memcpy(more, ps->tok, ps->n_tok * sizeof *more);
        ps->tok = more;
    }
    ps->tok[ps->n_tok++] = t;
}

/* A string literal at p[0] (a quote): Python's escapes. */
static const jstr *lex_string(jparser *ps, const char *p, const char *end, const char **out,
                              unsigned line) {
    const char q = *p++;
    jbuf b = {0};
    while (p < end && *p != q) {
        if (*p != '\\') {
            jbuf_put(ps->c, &b, p++, 1);
            continue;
        }
        if (++p >= end) break;
        char one;
        switch (*p) {
        case 'n': one = '\n'; break;
        case 't': one = '\t'; break;
        case 'r': one = '\r'; break;
        case '\\': one = '\\'; break;
        case '\'': one = '\''; break;
        case '"': one = '"'; break;
        case '0': one = '\0'; break;
        case 'a': one = '\a'; break;
        case 'b': one = '\b'; break;
        case 'f': one = '\f'; break;
        case 'v': one = '\v'; break;
        case '\n': p++; continue;
        default: /* kept as written, as Python keeps an unknown escape */
            jbuf_put(ps->c, &b, p - 1, 2);
            p++;
            continue;
        }
        jbuf_put(ps->c, &b, &one, 1);
        p++;
    }
    if (p >= end) syntax(ps, line, "a string literal is never closed%s", "");
    *out = p + 1;
    return jbuf_str(ps->c, &b);
}

static void lex(jparser *ps, const jtag *tag) {
    ps->n_tok = ps->at = 0;
    const char *p = tag->p, *end = tag->p + tag->n;
    unsigned line = tag->line;
    while (p < end) {
        if (is_ws(*p)) {
            line += *p++ == '\n';
            continue;
        }
        jtok t = {.p = p, .line = line};
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_') {
            while (p < end && ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
                               (*p >= '0' && *p <= '9')))
                p++;
            t.t = TK_NAME;
        } else if (*p >= '0' && *p <= '9') {
            bool fl = false;
            while (p < end && ((*p >= '0' && *p <= '9') || *p == '_')) p++;
            if (p + 1 < end && *p == '.' && p[1] >= '0' && p[1] <= '9') {
                fl = true, p++;
                while (p < end && ((*p >= '0' && *p <= '9') || *p == '_')) p++;
            }
            if (p < end && (*p == 'e' || *p == 'E')) {
                const char *q = p + 1;
                if (q < end && (*q == '+' || *q == '-')) q++;
                if (q < end && *q >= '0' && *q <= '9') {
                    fl = true, p = q;
                    while (p < end && *p >= '0' && *p <= '9') p++;
                }
            }
            char num[64];
            size_t k = 0;
            for (const char *q = t.p; q < p && k + 1 < sizeof num; q++)
                if (*q != '_') num[k++] = *q;
            num[k] = 0;
            t.t = fl ? TK_FLOAT : TK_INT;
            if (fl) t.f = strtod(num, NULL);
            else t.i = strtoll(num, NULL, 10);
        } else if (*p == '\'' || *p == '"') {
            t.t = TK_STR;
            t.s = lex_string(ps, p, end, &p, line);
        } else {
            static const char *const ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                              "/", "%", "~", "<", ">", "(", ")", "[", "]", "{",
                                              "}", ",", ".", ":", "|", "="};
            size_t k = 0;
            for (; k < sizeof ops / sizeof *ops; k++)
                if ((size_t)(end - p) >= strlen(ops[k]) && !memcmp(p, ops[k], strlen(ops[k]))) break;
            if (k == sizeof ops / sizeof *ops) {
                char what[2] = {*p, 0};
                syntax(ps, line, "an unexpected character '%s'", what);
            }
            t.t = TK_OP;
            p += strlen(ops[k]);
        }
        t.n = (size_t)(p - t.p);
        tok_push(ps, t);
    }
    tok_push(ps, (jtok){.t = TK_END, .p = end, .line = line});
}

static const jtok *cur(jparser *ps) {
    return &ps->tok[ps->at];
}

static bool is_op(const jtok *t, const char *op) {
    return t->t == TK_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n);
}

static bool is_name(const jtok *t, const char *name) {
    return t->t == TK_NAME && t->n == strlen(name) && !memcmp(t->p, name, t->n);
}

static bool accept_op(jparser *ps, const char *op) {
    if (!is_op(cur(ps), op)) return false;
    ps->at++;
    return true;
}

static bool accept_name(jparser *ps, const char *name) {
    if (!is_name(cur(ps), name)) return false;
    ps->at++;
    return true;
}

_Noreturn static void unexpected(jparser *ps, const char *wanted) {
    const jtok *t = cur(ps);
    char what[96];
    if (t->t == TK_END) snprintf(what, sizeof what, "the end of the tag where %s was expected", wanted);
    else snprintf(what, sizeof what, "'%.*s' where %s was expected", (int)(t->n < 40 ? t->n : 40), t->p, wanted);
    syntax(ps, t->line, "unexpected %s", what);
}

static void expect_op(jparser *ps, const char *op) {
    if (!accept_op(ps, op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(ps, w);
    }
}

static const jtok *expect_name(jparser *ps) {
    if (cur(ps)->t != TK_NAME) unexpected(ps, "a name");
    return &ps->tok[ps->at++];
}

/* ---- nodes ---------------------------------------------------------------------------------- */

static jnode *node(jparser *ps, jop op, size_t n_kid) {
    jnode *x = jalloc(ps->c, sizeof *x);
    x->op = op;
    x->line = ps->tok ? cur(ps)->line : ps->c->line;
    x->n_kid = n_kid;
    x->kid = n_kid ? jalloc(ps->c, n_kid * sizeof *x->kid) : NULL;
    return x;
}

/* A growing list of nodes (and their keyword names). */
typedef struct jnodes {
    jnode **v;
    const char **kw;
    size_t n, cap;
    bool any_kw;
} jnodes;

static void nodes_push(jparser *ps, jnodes *l, jnode *x, const char *kw) {
    if (l->n == l->cap) {
        const size_t cap = l->cap ? 2 * l->cap : 8;
        jnode **v = jalloc(ps->c, cap * sizeof *v);
        const char **k = jalloc(ps->c, cap * sizeof *k);
        if (l->n) memcpy(v, l->v, l->n * sizeof *v), memcpy(k, l->kw, l->n * sizeof *k);
        l->v = v, l->kw = k, l->cap = cap;
    }
    l->v[l->n] = x, l->kw[l->n] = kw;
    l->any_kw |= kw != NULL;
    l->n++;
}

/* A node of op whose kids are first (may be NULL) then the list's. */
static jnode *node_of(jparser *ps, jop op, jnode *first, bool has_first, const jnodes *l) {
    jnode *x = node(ps, op, l->n + has_first);
    if (has_first) x->kid[0] = first;
    for (size_t i = 0; i < l->n; i++) x->kid[i + has_first] = l->v[i];
    if (l->any_kw) {
        x->kw = jalloc(ps->c, x->n_kid * sizeof *x->kw);
        for (size_t i = 0; i < l->n; i++) x->kw[i + has_first] = l->kw[i];
        x->n_kw = l->n;
    }
    return x;
}

static char *name_copy(jparser *ps, const jtok *t) {
    char *s = jalloc(ps->c, t->n + 1);
    memcpy(s, t->p, t->n);
    return s;
}

/* ---- expressions ---------------------------------------------------------------------------- */

enum { MAX_NEST = 200 };

static void nest(jparser *ps, int by) {
    if ((ps->depth += by) > MAX_NEST) {
        ps->c->line = ps->tok ? cur(ps)->line : ps->c->line;
        jfail(ps->c, AKV_EFORMAT, "the template nests expressions or blocks deeper than %d", MAX_NEST);
    }
}


static jnode *expr(jparser *ps);
static jnode *expr_or(jparser *ps);
static jnode *unary(jparser *ps, bool with_filter);

static bool ends_expr(const jtok *t) {
    return t->t == TK_END || is_name(t, "else") || is_name(t, "or") || is_name(t, "and") ||
           is_name(t, "if") || is_name(t, "is") || is_name(t, "in") || is_name(t, "not") ||
           is_op(t, ")") || is_op(t, "]") || is_op(t, "}") || is_op(t, ",") || is_op(t, ":") ||
           is_op(t, "|") || is_op(t, "=");
}

/* Call arguments after '(' up to ')': positional, then name=value. */
static void call_args(jparser *ps, jnodes *l) {
    while (!accept_op(ps, ")")) {
        if (l->n) expect_op(ps, ",");
        if (accept_op(ps, ")")) break; /* a trailing comma */
        const char *kw = NULL;
        if (cur(ps)->t == TK_NAME && is_op(&ps->tok[ps->at + 1], "=")) {
            kw = name_copy(ps, cur(ps));
            ps->at += 2;
        }
        nodes_push(ps, l, expr(ps), kw);
    }
}

static jnode *lit(jparser *ps, jv v) {
    jnode *x = node(ps, JE_LIT, 0);
    x->lit = v;
    return x;
}

/* A list [a, b] or (pairs) a dict {k: v} literal after its opener, up to `close`; commas
 * between items, one trailing allowed. */
static jnode *seq_literal(jparser *ps, const char *close, bool pairs) {
    jnodes l = {0};
    while (!accept_op(ps, close)) {
        if (l.n) expect_op(ps, ",");
        if (accept_op(ps, close)) break;
        nodes_push(ps, &l, expr(ps), NULL);
        if (!pairs) continue;
        expect_op(ps, ":");
        nodes_push(ps, &l, expr(ps), NULL);
    }
    return node_of(ps, pairs ? JE_DICT : JE_LIST, NULL, false, &l);
}

static jnode *primary(jparser *ps) {
    const jtok *t = cur(ps);
    if (t->t == TK_STR) {
        const jstr *s = t->s;
        ps->at++;
        while (cur(ps)->t == TK_STR) s = jstr_cat(ps->c, s, cur(ps)->s), ps->at++;
        return lit(ps, jv_str(s));
    }
    if (t->t == TK_INT) return ps->at++, lit(ps, jv_int(t->i));
    if (t->t == TK_FLOAT) return ps->at++, lit(ps, jv_float(t->f));
    if (t->t == TK_NAME) {
        if (is_name(t, "true") || is_name(t, "True")) return ps->at++, lit(ps, jv_bool(true));
        if (is_name(t, "false") || is_name(t, "False")) return ps->at++, lit(ps, jv_bool(false));
        if (is_name(t, "none") || is_name(t, "None")) return ps->at++, lit(ps, jv_none());
        jnode *x = node(ps, JE_NAME, 0);
        x->name = name_copy(ps, t), x->name_n = t->n;
        ps->at++;
        return x;
    }
    if (accept_op(ps, "(")) {
        if (accept_op(ps, ")")) return node(ps, JE_TUPLE, 0);
        jnode *e = expr(ps);
        if (accept_op(ps, ")")) return e;
        jnodes l = {0};
        nodes_push(ps, &l, e, NULL);
        while (accept_op(ps, ",")) {
            if (is_op(cur(ps), ")")) break;
            nodes_push(ps, &l, expr(ps), NULL);
        }
        expect_op(ps, ")");
        return node_of(ps, JE_TUPLE, NULL, false, &l);
    }
    if (accept_op(ps, "[")) return seq_literal(ps, "]", false);
    if (accept_op(ps, "{")) return seq_literal(ps, "}", true);
    unexpected(ps, "an expression");
}

/* A call of x, after its '(': the arguments, then the call node. */
static jnode *call_node(jparser *ps, jnode *x) {
    jnodes l = {0};
    call_args(ps, &l);
    return node_of(ps, JE_CALL, x, true, &l);
}

static jnode *postfix(jparser *ps, jnode *x) {
    for (;;) {
        if (accept_op(ps, ".")) {
            const jtok *t = cur(ps);
            jnode *a;
            if (t->t == TK_INT) { /* x.0: an item */
                a = node(ps, JE_INDEX, 2);
                a->kid[0] = x, a->kid[1] = lit(ps, jv_int(t->i));
            } else {
                t = expect_name(ps);
                a = node(ps, JE_ATTR, 1);
                a->kid[0] = x, a->name = name_copy(ps, t), a->name_n = t->n;
                x = a;
                continue;
            }
            ps->at++;
            x = a;
        } else if (accept_op(ps, "[")) {
            jnode *parts[3] = {NULL, NULL, NULL};
            int k = 0;
            bool slice = false;
            for (;;) {
                if (is_op(cur(ps), "]")) break;
                if (accept_op(ps, ":")) {
                    slice = true;
                    if (++k > 2) unexpected(ps, "']'");
                    continue;
                }
                if (parts[k]) unexpected(ps, "':' or ']'");
                parts[k] = expr(ps);
            }
            expect_op(ps, "]");
            if (slice) {
                jnode *s = node(ps, JE_SLICE, 4);
                s->kid[0] = x, s->kid[1] = parts[0], s->kid[2] = parts[1], s->kid[3] = parts[2];
                x = s;
            } else {
                if (!parts[0]) unexpected(ps, "an index");
                jnode *s = node(ps, JE_INDEX, 2);
                s->kid[0] = x, s->kid[1] = parts[0];
                x = s;
            }
        } else if (accept_op(ps, "(")) {
            x = call_node(ps, x);
        } else {
            return x;
        }
    }
}

/* A filter's name and arguments (after '|'), on input x (NULL: a block's). */
static jnode *filter(jparser *ps, jnode *x) {
    const jtok *t = expect_name(ps);
    char *name = name_copy(ps, t);
    size_t name_n = t->n;
    while (accept_op(ps, ".")) { /* a dotted filter name: keep the last part */
        t = expect_name(ps);
        name = name_copy(ps, t), name_n = t->n;
    }
    jnodes l = {0};
    if (accept_op(ps, "(")) call_args(ps, &l);
    jnode *f = node_of(ps, JE_FILTER, x, true, &l);
    f->name = name, f->name_n = name_n;
    return f;
}

static jnode *filter_expr(jparser *ps, jnode *x) {
    for (;;) {
        if (accept_op(ps, "|")) {
            x = filter(ps, x);
        } else if (accept_name(ps, "is")) {
            const bool neg = accept_name(ps, "not");
            const jtok *t = expect_name(ps);
            jnodes l = {0};
            if (accept_op(ps, "(")) call_args(ps, &l);
            else if (!ends_expr(cur(ps)) && !is_op(cur(ps), "(") &&
                     (cur(ps)->t != TK_OP || is_op(cur(ps), "[") || is_op(cur(ps), "{") ||
                      is_op(cur(ps), "-")))
                nodes_push(ps, &l, unary(ps, false), NULL);
            jnode *test = node_of(ps, JE_TEST, x, true, &l);
            test->name = name_copy(ps, t), test->name_n = t->n, test->negate = neg;
            x = test;
        } else if (accept_op(ps, "(")) {
            x = call_node(ps, x);
        } else {
            return x;
        }
    }
}

static jnode *unary(jparser *ps, bool with_filter) {
    nest(ps, 1);
    jnode *x;
    if (accept_op(ps, "-")) {
        x = node(ps, JE_NEG, 1);
        x->kid[0] = unary(ps, false);
    } else if (accept_op(ps, "+")) {
        x = node(ps, JE_POS, 1);
        x->kid[0] = unary(ps, false);
    } else {
        x = postfix(ps, primary(ps));
    }
    x = with_filter ? filter_expr(ps, x) : x;
    nest(ps, -1);
    return x;
}

static jnode *bin(jparser *ps, const char *op, jnode *a, jnode *b) {
    jnode *x = node(ps, JE_BIN, 2);
    x->name = op, x->name_n = strlen(op);
    x->kid[0] = a, x->kid[1] = b;
    return x;
}

static jnode *expr_pow(jparser *ps) {
    jnode *x = unary(ps, true);
    while (accept_op(ps, "**")) x = bin(ps, "**", x, unary(ps, true));
    return x;
}

static jnode *expr_mul(jparser *ps) {
    jnode *x = expr_pow(ps);
    for (;;) {
        if (accept_op(ps, "*")) x = bin(ps, "*", x, expr_pow(ps));
        else if (accept_op(ps, "//")) x = bin(ps, "//", x, expr_pow(ps));
        else if (accept_op(ps, "/")) x = bin(ps, "/", x, expr_pow(ps));
        else if (accept_op(ps, "%")) x = bin(ps, "%", x, expr_pow(ps));
        else return x;
    }
}

static jnode *expr_concat(jparser *ps) {
    jnode *x = expr_mul(ps);
    while (accept_op(ps, "~")) x = bin(ps, "~", x, expr_mul(ps));
    return x;
}

static jnode *expr_add(jparser *ps) {
    jnode *x = expr_concat(ps);
    for (;;) {
        if (accept_op(ps, "+")) x = bin(ps, "+", x, expr_concat(ps));
        else if (accept_op(ps, "-")) x = bin(ps, "-", x, expr_concat(ps));
        else return x;
    }
}

static jnode *expr_cmp(jparser *ps) {
    jnode *x = expr_add(ps);
    for (;;) {
        static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">"};
        bool hit = false;
        for (size_t i = 0; i < 6 && !hit; i++)
            if (accept_op(ps, ops[i])) x = bin(ps, ops[i], x, expr_add(ps)), hit = true;
        if (hit) continue;
        if (accept_name(ps, "in")) {
            x = bin(ps, "in", x, expr_add(ps));
        } else if (is_name(cur(ps), "not") && is_name(&ps->tok[ps->at + 1], "in")) {
            ps->at += 2;
            x = bin(ps, "notin", x, expr_add(ps));
        } else {
            return x;
        }
    }
}

static jnode *expr_not(jparser *ps) {
    if (accept_name(ps, "not")) {
        nest(ps, 1);
        jnode *x = node(ps, JE_NOT, 1);
        x->kid[0] = expr_not(ps);
        nest(ps, -1);
        return x;
    }
    return expr_cmp(ps);
}

/* left (`word` right)*: and over not, or over and. */
static jnode *expr_logic(jparser *ps, bool is_or) {
    jnode *x = is_or ? expr_logic(ps, false) : expr_not(ps);
    while (accept_name(ps, is_or ? "or" : "and")) {
        jnode *a = node(ps, is_or ? JE_OR : JE_AND, 2);
        a->kid[0] = x, a->kid[1] = is_or ? expr_logic(ps, false) : expr_not(ps);
        x = a;
    }
    return x;
}

static jnode *expr_or(jparser *ps) {
    return expr_logic(ps, true);
}

static jnode *expr(jparser *ps) {
    jnode *x = expr_or(ps);
    while (accept_name(ps, "if")) {
        jnode *c = node(ps, JE_COND, 3);
        c->kid[0] = x, c->kid[1] = expr_or(ps);
        if (accept_name(ps, "else")) c->kid[2] = expr(ps);
        x = c;
    }
    return x;
}

/* An assignment or loop target: a name, names separated by commas (a tuple), or (set only) a
 * name's attribute. */
static jnode *target(jparser *ps, bool attr_ok) {
    jnodes l = {0};
    do {
        const jtok *t = expect_name(ps);
        jnode *x = node(ps, JE_NAME, 0);
        x->name = name_copy(ps, t), x->name_n = t->n;
        if (attr_ok && accept_op(ps, ".")) {
            const jtok *a = expect_name(ps);
            jnode *at = node(ps, JE_ATTR, 1);
            at->kid[0] = x, at->name = name_copy(ps, a), at->name_n = a->n;
            x = at;
        }
        nodes_push(ps, &l, x, NULL);
    } while (accept_op(ps, ","));
    return l.n == 1 ? l.v[0] : node_of(ps, JE_TUPLE, NULL, false, &l);
}

/* ---- statements ----------------------------------------------------------------------------- */

static void end_of_tag(jparser *ps) {
    if (cur(ps)->t != TK_END) unexpected(ps, "the end of the tag");
}

/* Statements until a tag whose first word is one of stop[] (left unconsumed in ps->tag_at,
 * its tokens in ps->tok); *which: that word (NULL: the template ended). */
static jnode *body(jparser *ps, const char *const *stop, const char **which);

static jnode *stmt_if(jparser *ps) {
    jnodes l = {0};
    static const char *const stop[] = {"elif", "else", "endif", NULL};
    nodes_push(ps, &l, expr(ps), NULL);
    end_of_tag(ps);
    const unsigned line = cur(ps)->line;
    for (;;) {
        const char *which;
        nodes_push(ps, &l, body(ps, stop, &which), NULL);
        if (!which) syntax(ps, line, "an if%s is never closed by endif", "");
        if (!strcmp(which, "elif")) {
            nodes_push(ps, &l, expr(ps), NULL);
            end_of_tag(ps);
        } else if (!strcmp(which, "else")) {
            end_of_tag(ps);
            static const char *const stop_end[] = {"endif", NULL};
            nodes_push(ps, &l, body(ps, stop_end, &which), NULL);
            if (!which) syntax(ps, line, "an if%s is never closed by endif", "");
            end_of_tag(ps);
            break;
        } else {
            end_of_tag(ps);
            break;
        }
    }
    return node_of(ps, JS_IF, NULL, false, &l);
}

static jnode *stmt_for(jparser *ps) {
    const unsigned line = cur(ps)->line;
    jnode *x = node(ps, JS_FOR, 5);
    x->kid[0] = target(ps, false);
    if (!accept_name(ps, "in")) unexpected(ps, "'in'");
    x->kid[1] = expr_or(ps);
    if (accept_name(ps, "if")) x->kid[2] = expr(ps);
    if (accept_name(ps, "recursive")) syntax(ps, line, "a recursive for loop is not supported%s", "");
    end_of_tag(ps);
    static const char *const stop[] = {"else", "endfor", NULL};
    const char *which;
    x->kid[3] = body(ps, stop, &which);
    if (!which) syntax(ps, line, "a for%s is never closed by endfor", "");
    end_of_tag(ps);
    if (!strcmp(which, "else")) {
        static const char *const stop_end[] = {"endfor", NULL};
        x->kid[4] = body(ps, stop_end, &which);
        if (!which) syntax(ps, line, "a for%s is never closed by endfor", "");
        end_of_tag(ps);
    }
    return x;
}

static jnode *stmt_set(jparser *ps) {
    const unsigned line = cur(ps)->line;
    jnode *t = target(ps, true);
    if (accept_op(ps, "=")) {
        jnode *x = node(ps, JS_SET, 2);
        x->kid[0] = t, x->kid[1] = expr(ps);
        if (is_op(cur(ps), ",")) { /* set a = 1, 2: a tuple */
            jnodes l = {0};
            nodes_push(ps, &l, x->kid[1], NULL);
            while (accept_op(ps, ",")) nodes_push(ps, &l, expr(ps), NULL);
            x->kid[1] = node_of(ps, JE_TUPLE, NULL, false, &l);
        }
        end_of_tag(ps);
        return x;
    }
    jnodes filters = {0};
    while (accept_op(ps, "|")) nodes_push(ps, &filters, filter(ps, NULL), NULL);
    end_of_tag(ps);
    static const char *const stop[] = {"endset", NULL};
    const char *which;
    jnode *b = body(ps, stop, &which);
    if (!which) syntax(ps, line, "a set block%s is never closed by endset", "");
    end_of_tag(ps);
    jnode *x = node_of(ps, JS_SET_BLOCK, NULL, false, &filters);
    jnode *full = node(ps, JS_SET_BLOCK, 2 + x->n_kid);
    full->kid[0] = t, full->kid[1] = b;
    for (size_t i = 0; i < x->n_kid; i++) full->kid[2 + i] = x->kid[i];
    return full;
}

static jnode *stmt_macro(jparser *ps) {
    const unsigned line = cur(ps)->line;
    const jtok *name = expect_name(ps);
    jnodes l = {0};
    nodes_push(ps, &l, NULL, NULL); /* the body, below */
    expect_op(ps, "(");
    while (!accept_op(ps, ")")) {
        if (l.n > 1) expect_op(ps, ",");
        const jtok *p = expect_name(ps);
        jnode *pn = node(ps, JE_NAME, 0);
        pn->name = name_copy(ps, p), pn->name_n = p->n;
        nodes_push(ps, &l, pn, NULL);
        nodes_push(ps, &l, accept_op(ps, "=") ? expr(ps) : NULL, NULL);
    }
    end_of_tag(ps);
    static const char *const stop[] = {"endmacro", NULL};
    const char *which;
    l.v[0] = body(ps, stop, &which);
    if (!which) syntax(ps, line, "a macro%s is never closed by endmacro", "");
    end_of_tag(ps);
    jnode *x = node_of(ps, JS_MACRO, NULL, false, &l);
    x->name = name_copy(ps, name), x->name_n = name->n;
    return x;
}

static jnode *stmt_filter(jparser *ps) {
    const unsigned line = cur(ps)->line;
    jnodes l = {0};
    nodes_push(ps, &l, NULL, NULL);
    do nodes_push(ps, &l, filter(ps, NULL), NULL);
    while (accept_op(ps, "|"));
    end_of_tag(ps);
    static const char *const stop[] = {"endfilter", NULL};
    const char *which;
    l.v[0] = body(ps, stop, &which);
    if (!which) syntax(ps, line, "a filter block%s is never closed by endfilter", "");
    end_of_tag(ps);
    return node_of(ps, JS_FILTER_BLOCK, NULL, false, &l);
}

static jnode *body(jparser *ps, const char *const *stop, const char **which) {
    jnodes l = {0};
    *which = NULL;
    nest(ps, 1);
    while (ps->tag_at < ps->n_tags) {
        const jtag *tag = &ps->tags[ps->tag_at++];
        ps->c->line = tag->line;
        if (tag->k == TAG_TEXT) {
            jnode *x = node(ps, JS_TEXT, 0);
            x->line = tag->line;
            x->lit = jv_str(jstr_new(ps->c, tag->p, tag->n));
            nodes_push(ps, &l, x, NULL);
            continue;
        }
        lex(ps, tag);
        if (tag->k == TAG_OUT) {
            jnode *x = node(ps, JS_OUT, 1);
            x->kid[0] = expr(ps);
            end_of_tag(ps);
            nodes_push(ps, &l, x, NULL);
            continue;
        }
        const jtok *kw = expect_name(ps);
        for (size_t i = 0; stop && stop[i]; i++)
            if (is_name(kw, stop[i])) {
                *which = stop[i];
                nest(ps, -1);
                return node_of(ps, JS_BLOCK, NULL, false, &l);
            }
        jnode *x;
        if (is_name(kw, "if")) x = stmt_if(ps);
        else if (is_name(kw, "for")) x = stmt_for(ps);
        else if (is_name(kw, "set")) x = stmt_set(ps);
        else if (is_name(kw, "macro")) x = stmt_macro(ps);
        else if (is_name(kw, "filter")) x = stmt_filter(ps);
        else if (is_name(kw, "break") || is_name(kw, "continue")) {
            x = node(ps, is_name(kw, "break") ? JS_BREAK : JS_CONTINUE, 0);
            end_of_tag(ps);
        } else if (is_name(kw, "generation")) { /* Hugging Face's marker: its body as is */
            end_of_tag(ps);
            static const char *const stop_gen[] = {"endgeneration", NULL};
            const char *w;
            x = body(ps, stop_gen, &w);
            if (!w) syntax(ps, kw->line, "a generation block%s is never closed", "");
            end_of_tag(ps);
        } else {
            char what[48];
            snprintf(what, sizeof what, "%.*s", (int)(kw->n < 40 ? kw->n : 40), kw->p);
            syntax(ps, kw->line, "the tag '%s' is not supported (or ends nothing open)", what);
        }
        nodes_push(ps, &l, x, NULL);
    }
    nest(ps, -1);
    return node_of(ps, JS_BLOCK, NULL, false, &l);
}

jnode *jparse(jctx *c, const char *src, size_t n) {
    jparser ps = {.c = c, .src = src, .n = n};
    scan(&ps);
    const char *which;
    jnode *root = body(&ps, NULL, &which);
    return root;
}
