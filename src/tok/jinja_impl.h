/*
 * tok/jinja_impl.h — the Jinja interpreter's insides (akv/jinja.h), shared by its three rooms:
 * jinja_value.c (the arena, values, strings with their marked stretches, JSON in and out,
 * values printed as Python prints them), jinja_parse.c (the template's tags and the syntax
 * tree) and jinja_eval.c (the evaluator, filters, tests, methods, the public calls).
 *
 * Every allocation of a compile or a render comes from an arena freed at once at the end;
 * every error leaves through a longjmp to the call's entry (jctx.fail), with its message and
 * line in jctx.err. So no function below returns a status: it returns, or it fails.
 */
#ifndef AKV_TOK_JINJA_IMPL_H
#define AKV_TOK_JINJA_IMPL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/jinja.h"

/* ---- the arena and the failure path ---------------------------------------------------- */

typedef struct jchunk {
    struct jchunk *next;
    size_t used, cap;
    max_align_t data[];
} jchunk;

typedef struct jctx {
    jchunk *chunks;
    jmp_buf fail;
    akv_status status; /* of the failure */
    akv_jinja_error *err;
    unsigned line;     /* the line being compiled or run */
} jctx;

_Noreturn void jfail(jctx *c, akv_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void *jalloc(jctx *c, size_t n); /* zeroed */
void jarena_free(jctx *c);

/* ---- values ---------------------------------------------------------------------------- */

/* A stretch of a string marked as message text. */
typedef struct jspan {
    size_t off, n;
} jspan;

typedef struct jstr {
    const char *p; /* [n], not NUL-terminated */
    size_t n;
    jspan *mark;   /* [n_mark] sorted, disjoint */
    uint32_t n_mark;
    bool safe;     /* markup (|safe, |escape): a plain string added to it is HTML-escaped, as
                      jinja2's Markup does */
} jstr;

typedef enum jkind {
    JV_UNDEF = 0, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC, JV_MACRO
} jkind;

struct jlist;
struct jdict;
struct jnode;
struct jbuiltin;

typedef struct jv {
    jkind k;
    bool tuple; /* a list made as a tuple (printed with parentheses) */
    bool ns;    /* a dict that is a namespace: its attributes may be set */
    union {
        bool b;
        int64_t i;
        double f;
        const jstr *s;
        struct jlist *l;
        struct jdict *d;
        const struct jbuiltin *fn;
        const struct jnode *macro;
        const char *undef; /* the name that was not defined (for the error) */
    };
} jv;

typedef struct jlist {
    size_t n;
    jv *v;
} jlist;

typedef struct jdict {
    size_t n, cap;
    const jstr **key;
    jv *v;
} jdict;

static inline jv jv_undef(const char *name) { return (jv){.k = JV_UNDEF, .undef = name}; }
static inline jv jv_none(void) { return (jv){.k = JV_NONE}; }
static inline jv jv_bool(bool b) { return (jv){.k = JV_BOOL, .b = b}; }
static inline jv jv_int(int64_t i) { return (jv){.k = JV_INT, .i = i}; }
static inline jv jv_float(double f) { return (jv){.k = JV_FLOAT, .f = f}; }
static inline jv jv_str(const jstr *s) { return (jv){.k = JV_STR, .s = s}; }

const jstr *jstr_new(jctx *c, const char *p, size_t n);          /* copied, unmarked */
const jstr *jstr_lit(jctx *c, const char *p);                       /* static text, borrowed */
const jstr *jstr_cat(jctx *c, const jstr *a, const jstr *b);       /* marks kept */
const jstr *jstr_sub(jctx *c, const jstr *s, size_t off, size_t n); /* marks clipped */
const jstr *jstr_marked(jctx *c, const jstr *s);                    /* all of it marked */
bool jstr_eq(const jstr *a, const char *p, size_t n);

jv jv_list(jctx *c, size_t n); /* n items, undefined */
jv jv_dict(jctx *c);
void jdict_set(jctx *c, jdict *d, const jstr *key, jv v); /* replaces an existing key */
jv *jdict_get(const jdict *d, const char *key, size_t n); /* NULL: none */

/* A growing string (a render's output, str() of a value). */
typedef struct jbuf {
    char *p;
    size_t n, cap;
    jspan *mark;
    size_t n_mark, cap_mark;
    size_t limit; /* fails past it (0: none) */
} jbuf;
void jbuf_put(jctx *c, jbuf *b, const char *p, size_t n);
void jbuf_put_str(jctx *c, jbuf *b, const jstr *s); /* with its marks */
const jstr *jbuf_str(jctx *c, const jbuf *b);

bool jv_truthy(const jv *v);
const char *jv_kind_name(jkind k);
/* str(v) as Python (and jinja2) print it: into b. */
void jv_print(jctx *c, jbuf *b, const jv *v);
/* repr(v): strings quoted. */
void jv_repr(jctx *c, jbuf *b, const jv *v);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: none), sort_keys) */
void jv_tojson(jctx *c, jbuf *b, const jv *v, int indent, bool sort_keys);
/* Python's repr of a float. */
void jfloat_repr(double f, char *buf, size_t cap);
/* Parses JSON text into a value; strings under any of the plain keys are marked. */
jv jv_from_json(jctx *c, const char *p, size_t n, const char *const *plain_keys, size_t n_plain);
bool jv_equal(const jv *a, const jv *b);

/* ---- the syntax tree --------------------------------------------------------------------- */

typedef enum jop {
    /* expressions */
    JE_LIT, JE_NAME, JE_LIST, JE_TUPLE, JE_DICT, JE_ATTR, JE_INDEX, JE_SLICE, JE_CALL, JE_FILTER,
    JE_TEST, JE_NOT, JE_NEG, JE_POS, JE_AND, JE_OR, JE_COND, JE_BIN,
    /* statements */
    JS_TEXT, JS_OUT, JS_IF, JS_FOR, JS_SET, JS_SET_BLOCK, JS_MACRO, JS_BREAK, JS_CONTINUE,
    JS_FILTER_BLOCK, JS_BLOCK /* a body of statements */
} jop;

typedef struct jnode {
    jop op;
    unsigned line;
    const char *name;  /* JE_NAME, JE_ATTR, JE_FILTER, JE_TEST, JS_MACRO, JE_BIN's operator */
    size_t name_n;
    jv lit;            /* JE_LIT; JS_TEXT: its text */
    struct jnode **kid; /* operands, in order (see jinja_parse.c for each op's layout) */
    size_t n_kid;
    const char **kw;   /* JE_CALL / JE_FILTER / JE_TEST / JS_MACRO: keyword names of the last
                          n_kw kids (NULL entries for positional ones) */
    size_t n_kw;
    bool negate;       /* JE_TEST: is not */
    bool trailing;     /* JS_FOR: it has an else body */
} jnode;

/* Parses src into a JS_BLOCK node (fails with AKV_EFORMAT). */
jnode *jparse(jctx *c, const char *src, size_t n);

#endif
