/*
 * akv/jinja.h — the Jinja interpreter chat templates need: a model's own template
 * (tokenizer.chat_template) rendered as Hugging Face's apply_chat_template renders it (Python's
 * jinja2 with trim_blocks, lstrip_blocks and loop controls, a sandbox that forbids mutating
 * lists and dicts, tojson as json.dumps with ensure_ascii off, raise_exception and
 * strftime_now), so its output is the text the model was trained on, byte for byte
 * (tests/test_jinja.py holds it to jinja2 over a corpus of real templates).
 *
 * The language taken (what the templates in the wild use):
 *   text, {{ expression }}, {# comment #}, whitespace control {%- -%} {{- -}} {#- -#}, and
 *   {%+ (no lstrip);
 *   statements: if / elif / else, for (one or two targets, loop.index, index0, revindex,
 *   revindex0, first, last, length, previtem, nextitem; an `if` filter; else; break,
 *   continue), set (a name, names from a sequence, a namespace's attribute, a block), macro
 *   (positional and keyword parameters with defaults), filter blocks, generation blocks (their
 *   body rendered as is), raw;
 *   expressions: literals (strings with Python escapes, integers, floats, true / false /
 *   none in either case), lists, tuples, dicts, names, attributes and subscripts (a dict's
 *   attribute is its item), slices, calls with keyword arguments, filters, tests (is [not]),
 *   not / and / or, in / not in, == != < <= > >=, + - * / // % ** ~, unary -, a if b else c;
 *   filters: abs, capitalize, count, default (d), dictsort, escape (e), first, float, indent,
 *   int, items,
 *   join, last, length, list, lower, map (attribute= or a filter), max, min, reject,
 *   rejectattr, replace, reverse, round, safe, select, selectattr, sort, string, sum, title,
 *   tojson, trim, unique, upper, wordcount;
 *   tests: boolean, callable, defined, divisibleby, eq / equalto / ==, even, false, float, ge,
 *   gt, in, integer, iterable, le, lower, lt, mapping, ne, none, number, odd, sameas,
 *   sequence, string, true, undefined, upper;
 *   methods: a string's capitalize, count, endswith, find, isdigit, isalpha, isspace,
 *   join, lower, lstrip, replace, rstrip, split, rsplit, splitlines, startswith, strip, title,
 *   upper; a dict's get, items, keys, values;
 *   globals: namespace, range, dict, raise_exception, strftime_now, and what the context
 *   gives.
 * Values print as Python prints them (None, True, 1.0, ['a', 1], {'k': 'v'}).
 *
 * Message contents stay text. A string that comes from a message's "content" (or any key the
 * caller names) is marked; the mark follows it through concatenation, slicing, trim and the
 * like, and every marked stretch of the output is reported, so the encoder reads it as plain
 * text (akv/chat.h): a control-token text a user writes cannot open or close a turn.
 *
 * Errors name the template's line: a syntax error when compiling (AKV_EFORMAT), and at render
 * time an undefined name used as a value, a wrong type, raise_exception's message
 * (AKV_EINVAL), or a render past its limits (AKV_EOVERFLOW: output bytes, loop iterations,
 * recursion), all with the message in akv_jinja_error.
 *
 * Thread-safety: a compiled template is immutable; renders of one template may run at once.
 */
#ifndef AKV_JINJA_H
#define AKV_JINJA_H

#include <stdbool.h>
#include <stddef.h>

#include "akv/status.h"
#include "akv/tok.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_jinja akv_jinja;

/* What went wrong, with the template line (0: not known). */
typedef struct akv_jinja_error {
    unsigned line;
    char msg[256];
} akv_jinja_error;

/* Compiles Jinja source src[0..n). AKV_EFORMAT with *err (not logged) for a syntax error;
 * AKV_ENOMEM. */
akv_status akv_jinja_compile(const char *src, size_t n, akv_jinja **out, akv_jinja_error *err);

void akv_jinja_destroy(akv_jinja *t);

typedef struct akv_jinja_render_params {
    const char *context_json;   /* a JSON object: the template's variables (messages, tools,
                                   add_generation_prompt, bos_token, ...) */
    size_t context_bytes;       /* 0 = NUL-terminated */
    const char *const *plain_keys; /* object keys whose string values are marked as message
                                      text (NULL: {"content"}) */
    size_t n_plain_keys;
    const char *date;           /* what strftime_now formats: "YYYY-MM-DD" (NULL = today, UTC) */
    size_t max_output;          /* bytes; 0 = 16 MiB */
} akv_jinja_render_params;

/* Renders into *out (appended), and the stretches of marked text into *plain when not NULL.
 * AKV_EFORMAT (*err) for context JSON that does not parse or is not an object; AKV_EINVAL
 * (*err) for an error the template raises or makes; AKV_EOVERFLOW (*err) past a limit;
 * AKV_ENOMEM. On error *out and *plain are as they were. */
akv_status akv_jinja_render(const akv_jinja *t, const akv_jinja_render_params *p,
                            akv_tok_text *out, akv_tok_spans *plain, akv_jinja_error *err);

#ifdef __cplusplus
}
#endif
#endif /* AKV_JINJA_H */
