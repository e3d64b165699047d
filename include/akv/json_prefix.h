/*
 * akv/json_prefix.h — whether a byte string can begin a JSON text (RFC 8259), fed a piece at a
 * time: the state a constrained generation keeps (a JSON object answer,
 * akv_request_params.format) and tries each token's piece against.
 *
 * Words
 *   prefix    bytes that some continuation makes a complete JSON text; feeding is refused at
 *             the first byte that no continuation can follow.
 *   complete  the bytes so far are a whole JSON text (then only whitespace may follow).
 *
 * The state is a plain value (copy it to try a piece and keep the copy only if it is taken).
 * Strings take well-formed UTF-8 (Unicode's Table 3-7: no overlongs, no surrogates; a piece may
 * end inside a character and the next finish it) but the quote and the backslash, and no
 * control character (it must be escaped); escapes are the RFC's, \u with four hex digits. Nesting deeper than AKV_JSON_MAX_DEPTH is refused. With object_only, the text must
 * be an object (OpenAI's json_object answers).
 *
 * Thread-safety: pure functions over the caller's state.
 */
#ifndef AKV_JSON_PREFIX_H
#define AKV_JSON_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Whitespace between tokens (not inside a string) comes in runs of at most AKV_JSON_MAX_WS
 * bytes with at most AKV_JSON_MAX_NEWLINES line feeds: a pretty-printed text fits, and a
 * sampler held to JSON cannot loop on blank lines (what a small model does when nothing stops
 * it; llama.cpp's JSON grammars bound it alike). */
enum { AKV_JSON_MAX_DEPTH = 64, AKV_JSON_MAX_WS = 64, AKV_JSON_MAX_NEWLINES = 2 };

typedef struct akv_json_prefix {
    uint8_t stack[AKV_JSON_MAX_DEPTH]; /* open containers: '{' or '[' */
    uint16_t depth;
    uint8_t state;   /* where the next byte lands (json_prefix.c) */
    uint8_t sub;     /* a literal's next byte's index; a string's role (1: a key) */
    uint8_t literal; /* the literal being read ('t', 'f', 'n') */
    uint8_t lex;     /* a string's or a number's own state (engine/json_lex.h) */
    bool object_only;
    bool started;    /* the top-level value has begun */
    uint8_t ws, nl;  /* the whitespace run between tokens so far: bytes, line feeds */
} akv_json_prefix;

/* An empty prefix: a whole JSON text to come (with object_only, an object). */
void akv_json_prefix_init(akv_json_prefix *p, bool object_only);

/* Feeds bytes[0..n). true: the bytes so far are still a prefix (p advanced); false: byte k of
 * them cannot follow (p is then undefined: feed a copy to try a piece). */
bool akv_json_prefix_feed(akv_json_prefix *p, const uint8_t *bytes, size_t n);

/* Whether the bytes so far are a complete JSON text. */
bool akv_json_prefix_complete(const akv_json_prefix *p);

/* A whitespace run's next byte c, fed by a machine outside a string: false past the bounds
 * above (the run's counters *ws, *nl; any other byte ends the run). */
static inline bool akv_json_ws_run(uint8_t *ws, uint8_t *nl, uint8_t c) {
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
        *ws = *nl = 0;
        return true;
    }
    return ++*ws <= AKV_JSON_MAX_WS && (c != '\n' || ++*nl <= AKV_JSON_MAX_NEWLINES);
}

#ifdef __cplusplus
}
#endif
#endif /* AKV_JSON_PREFIX_H */
