/*
 * akv/json_schema.h — a JSON Schema, compiled to a table of nodes, and the prefix state
 * machine that follows it a byte at a time: what a constrained generation keeps
 * (akv_request_params.schema) and tries each token's piece against, as akv/json_prefix.h does
 * for any JSON object.
 *
 * Words
 *   node     one schema: a kind (object, array, string, number, integer, boolean, null, an
 *            enum of JSON texts, or any JSON value), and whether null is allowed too.
 *   object   its properties (name, node), which of them are required; no other key may appear
 *            (additionalProperties false: what OpenAI's strict structured outputs require).
 *            Keys come in any order, each at most once; the object closes once every required
 *            one has come.
 *   array    its items' node, and how many at least and at most.
 *   enum     JSON texts (as a compiler writes them: "\"red\"", "3", "true"); the value must be
 *            one of them, byte for byte.
 *   tag      an object's property whose enum text chooses the schema of its other
 *            properties (SWITCH nodes): a union of objects told apart by one property (a tool
 *            call: "name" chooses the schema of "arguments"). The tag comes before them.
 *   prefix   as in akv/json_prefix.h: bytes that some continuation makes a complete value of
 *            the schema's root.
 *   bounds   a string's length in characters (code points; an escaped surrogate pair is one,
 *            an unpaired high surrogate refused) within [lo, hi]; an integer's or a number's value within [lo, hi], each end
 *            inclusive or not. A bounded number is written without an exponent and with at most
 *            15 digits (weighed exactly, as a validator parsing it into a double would); every byte keeps the value
 *            one that some continuation brings within its bounds, so no prefix is a dead end.
 * Not followed: patterns, multipleOf, uniqueness (a compiler refuses them naming the
 * keyword); formats are annotations (JSON Schema's default), not checked.
 *
 * The state is a plain value (copy it to try a piece). Thread-safety: pure functions over the
 * caller's state; a compiled schema is read-only.
 */
#ifndef AKV_JSON_SCHEMA_H
#define AKV_JSON_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/json_prefix.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum akv_js_kind {
    AKV_JS_ANY = 0,
    AKV_JS_OBJECT,
    AKV_JS_ARRAY,
    AKV_JS_STRING,
    AKV_JS_NUMBER,
    AKV_JS_INTEGER,
    AKV_JS_BOOLEAN,
    AKV_JS_NULL,
    AKV_JS_ENUM,
    AKV_JS_REF, /* the value of node `items` (a $ref: shared, so a schema may recur) */
    AKV_JS_SWITCH, /* a property's value whose schema is chosen by its object's tag: case i
                      (props[first + i].node) when the tag took its enum's text i */
} akv_js_kind;

enum {
    AKV_JS_MAX_PROPS = 64,  /* properties of one object; values of one enum */
    AKV_JS_MAX_DEPTH = 16,  /* nested schema values */
    AKV_JS_MAX_NAME = 120,  /* bytes of a property name or an enum text */
};

typedef struct akv_js_node {
    uint8_t kind;       /* akv_js_kind */
    bool nullable;      /* null is allowed too */
    bool object_only;   /* any: an object only (an object schema with no properties) */
    uint32_t first;     /* object: its first property in props; enum: its first text in texts */
    uint32_t n;         /* ... how many */
    uint64_t required;  /* object: bit i = property first + i is required */
    uint32_t items;     /* array: its items' node; ref: the node it stands for; object: its
                           tag property + 1 (0: none), an enum whose text chooses the case of
                           each of its SWITCH properties, which may come only after it */
    uint32_t min_items, max_items; /* array (max 0 = no limit) */
    bool bounded;       /* string, integer, number: lo..hi below hold */
    bool lo_open, hi_open; /* the end is exclusive */
    double lo, hi;      /* a string's length, a number's value (-INFINITY, INFINITY: none) */
} akv_js_node;

typedef struct akv_js_prop {
    const char *name;   /* NUL-terminated, no quote or backslash, at most AKV_JS_MAX_NAME bytes */
    uint32_t node;
} akv_js_prop;

/* A compiled schema: node 0 is the root. Owned by its maker (the server's compiler). */
typedef struct akv_json_schema {
    const akv_js_node *nodes;
    uint32_t n_nodes;
    const akv_js_prop *props;
    const char *const *texts; /* enum texts, NUL-terminated */
} akv_json_schema;

/* One open value of the state: its node and where it stands. */
typedef struct akv_js_frame {
    uint32_t node;
    uint8_t state;      /* json_schema.c */
    uint8_t sub;
    uint16_t count;     /* array: items so far; object: its tag's text + 1 (0: not yet);
                           bounded string: characters so far (a high surrogate's escape not
                           counted); bounded number: its digits (json_schema.c) */
    uint64_t used;      /* object: properties given; enum: texts still possible; bounded
                           number: its digits as one integer; bounded string: whether the
                           escape being read may be a high surrogate */
} akv_js_frame;

typedef struct akv_js_state {
    const akv_json_schema *schema;
    akv_js_frame frames[AKV_JS_MAX_DEPTH];
    uint16_t depth;     /* frames open; 0 with done: the root's value is whole */
    uint16_t at;        /* bytes of a key or an enum text matched so far */
    uint64_t cand;      /* a key's possible properties (bit i: first + i) */
    bool done;
    uint8_t ws, nl;     /* the whitespace run between tokens (akv_json_ws_run's bounds) */
    akv_json_prefix any; /* inside a value of kind ANY: the generic machine */
} akv_js_state;

/* The state before the root's value. */
void akv_js_init(akv_js_state *s, const akv_json_schema *schema);

/* As akv_json_prefix_feed: true while the bytes so far are a prefix of a value of the root. */
bool akv_js_feed(akv_js_state *s, const uint8_t *bytes, size_t n);

/* Whether the bytes so far are a whole value of the root. */
bool akv_js_complete(const akv_js_state *s);

#ifdef __cplusplus
}
#endif
#endif /* AKV_JSON_SCHEMA_H */
