/* schema.c — a JSON Schema compiled into akv/json_schema.h's table (server/schema.h). */
#include "server/schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

/* nesting as deep as the state machine follows (a deeper required value would be a dead end) */
enum { SCHEMA_MAX_NODES = 1024, SCHEMA_MAX_NEST = AKV_JS_MAX_DEPTH };

struct akv_srv_schema {
    akv_json_schema view;
    akv_js_node *nodes;
    uint32_t n_nodes, cap_nodes;
    akv_js_prop *props;
    uint32_t n_props, cap_props;
    char **texts;            /* enum texts and property names, owned */
    uint32_t n_texts, cap_texts;
    const char **text_view;  /* texts as the view's const array */
    const cJSON *root;
    const cJSON *ref_from[SCHEMA_MAX_NODES]; /* a $ref's target and its node: recursion */
    uint32_t ref_node[SCHEMA_MAX_NODES];
    uint32_t n_refs;
    char *why;
    size_t why_cap;
};

static akv_status bad(akv_srv_schema *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->why, s->why_cap, fmt, ap);
    va_end(ap);
    return AKV_EINVAL;
}

static akv_status new_node(akv_srv_schema *s, uint32_t *out) {
    if (s->n_nodes == SCHEMA_MAX_NODES) return bad(s, "the schema has more than %d nodes", SCHEMA_MAX_NODES);
    size_t cap = s->cap_nodes;
    if (akv__array_reserve((void **)&s->nodes, &cap, s->n_nodes + 1, sizeof *s->nodes)) return AKV_ENOMEM;
    s->cap_nodes = (uint32_t)cap;
    memset(&s->nodes[s->n_nodes], 0, sizeof *s->nodes);
    *out = s->n_nodes++;
    return AKV_OK;
}

static akv_status keep_text(akv_srv_schema *s, char *t, uint32_t *at) {
    size_t cap = s->cap_texts;
    if (!t || akv__array_reserve((void **)&s->texts, &cap, s->n_texts + 1, sizeof *s->texts)) {
        akv__free(t);
        return AKV_ENOMEM;
    }
    s->cap_texts = (uint32_t)cap;
    *at = s->n_texts;
    s->texts[s->n_texts++] = t;
    return AKV_OK;
}

static akv_status compile(akv_srv_schema *s, const cJSON *sch, uint32_t nest, uint32_t *out);

/* A JSON value's compact text, as an enum text. */
static akv_status enum_text(akv_srv_schema *s, const cJSON *v, uint32_t *at) {
    char *p = cJSON_PrintUnformatted(v);
    if (!p) return AKV_ENOMEM;
    char *t = akv__strdup(p);
    cJSON_free(p);
    if (t && strlen(t) > AKV_JS_MAX_NAME) {
        akv__free(t);
        return bad(s, "an enum value's text is over %d bytes", AKV_JS_MAX_NAME);
    }
    return keep_text(s, t, at);
}

/* The schema a $ref names (#/$defs/X or #/definitions/X), or NULL. */
static const cJSON *resolve(const akv_srv_schema *s, const char *ref) {
    const char *names[2] = {"#/$defs/", "#/definitions/"}, *keys[2] = {"$defs", "definitions"};
    for (int i = 0; i < 2; i++) {
        const size_t k = strlen(names[i]);
        if (strncmp(ref, names[i], k)) continue;
        const cJSON *defs = cJSON_GetObjectItemCaseSensitive(s->root, keys[i]);
        return cJSON_IsObject(defs) ? cJSON_GetObjectItemCaseSensitive(defs, ref + k) : NULL;
    }
    return NULL;
}

/* Whether sch is {"type": "null"}. */
static bool is_null_schema(const cJSON *sch) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(sch, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, "null");
}

static akv_status compile_object(akv_srv_schema *s, const cJSON *sch, uint32_t nest, uint32_t node) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(sch, "properties");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(sch, "additionalProperties");
    if (!props || (cJSON_IsObject(props) && !props->child)) {
        if (add && !cJSON_IsBool(add) && !(cJSON_IsObject(add) && !add->child))
            return bad(s, "'additionalProperties' as a schema is not supported");
        s->nodes[node].kind = AKV_JS_ANY, s->nodes[node].object_only = true;
        return AKV_OK;
    }
    if (!cJSON_IsObject(props)) return bad(s, "'properties' must be an object");
    if (add && !cJSON_IsFalse(add))
        return bad(s, "'additionalProperties' other than false beside 'properties' is not supported");
    uint32_t n = 0;
    for (const cJSON *p = props->child; p; p = p->next) n++;
    if (n > AKV_JS_MAX_PROPS) return bad(s, "an object with more than %d properties", AKV_JS_MAX_PROPS);
    /* the properties take consecutive slots: reserved before their schemas add their own */
    size_t cap = s->cap_props;
    if (akv__array_reserve((void **)&s->props, &cap, s->n_props + n, sizeof *s->props)) return AKV_ENOMEM;
    s->cap_props = (uint32_t)cap;
    const uint32_t first = s->n_props;
    s->n_props += n;
    s->nodes[node].kind = AKV_JS_OBJECT, s->nodes[node].first = first, s->nodes[node].n = n;
    uint32_t i = 0;
    for (const cJSON *p = props->child; p; p = p->next, i++) {
        const char *name = p->string;
        if (strlen(name) > AKV_JS_MAX_NAME || strpbrk(name, "\"\\"))
            return bad(s, "property '%.40s': a name over %d bytes or with a quote or backslash", name,
                       AKV_JS_MAX_NAME);
        for (const unsigned char *c = (const unsigned char *)name; *c; c++)
            if (*c < 0x20) return bad(s, "property '%.40s': a control character in its name", name);
        uint32_t at, child;
        akv_status st = keep_text(s, akv__strdup(name), &at);
        if (!st) st = compile(s, p, nest + 1, &child);
        if (st) return st;
        s->props[first + i] = (akv_js_prop){.name = s->texts[at], .node = child};
    }
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(sch, "required");
    if (req && !cJSON_IsArray(req)) return bad(s, "'required' must be an array of names");
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        uint32_t k = 0;
        const cJSON *p = props->child;
        for (; p && (!cJSON_IsString(r) || strcmp(p->string, r->valuestring)); p = p->next) k++;
        if (!p) return bad(s, "'required' names '%.40s', which is not a property",
                           cJSON_IsString(r) ? r->valuestring : "?");
        s->nodes[node].required |= 1ull << k;
    }
    return AKV_OK;
}

/* A branch's properties (an object schema's), or NULL. */
static const cJSON *branch_props(const cJSON *b) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type"),
                *p = cJSON_GetObjectItemCaseSensitive(b, "properties");
    if (!cJSON_IsObject(b) || (t && !(cJSON_IsString(t) && !strcmp(t->valuestring, "object"))) ||
        !cJSON_IsObject(p) || !p->child)
        return NULL;
    return p;
}

/* Whether branch b has exactly the properties (names, required) of `like`. */
static bool branch_alike(const cJSON *b, const cJSON *like) {
    const cJSON *p = branch_props(b), *q = branch_props(like);
    if (!p || cJSON_GetArraySize(p) != cJSON_GetArraySize(q)) return false;
    for (const cJSON *x = q->child; x; x = x->next)
        if (!cJSON_GetObjectItemCaseSensitive(p, x->string)) return false;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(b, "required"),
                *rl = cJSON_GetObjectItemCaseSensitive(like, "required");
    return (!r && !rl) || (r && rl && cJSON_Compare(r, rl, true));
}

/* A property's const (a "const", or an "enum" of one value), or NULL. */
static const cJSON *const_of(const cJSON *sch) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(sch, "const"), *e = cJSON_GetObjectItemCaseSensitive(sch, "enum");
    if (c) return c;
    return cJSON_IsArray(e) && cJSON_GetArraySize(e) == 1 ? e->child : NULL;
}

/* anyOf / oneOf of objects of the same properties that one property (the tag) tells apart by a
 * const of each: one object whose tag is the enum of the consts and whose other properties are
 * SWITCH nodes over the branches (akv/json_schema.h). AKV_EUNSUPPORTED: not such a union (the
 * caller says why). */
static akv_status compile_union(akv_srv_schema *s, const cJSON *a, uint32_t nest, uint32_t node) {
    const cJSON *first = a->child, *props = branch_props(first);
    const int n_br = cJSON_GetArraySize(a);
    if (!props || n_br > AKV_JS_MAX_PROPS) return AKV_EUNSUPPORTED;
    for (const cJSON *b = first->next; b; b = b->next)
        if (!branch_alike(b, first)) return AKV_EUNSUPPORTED;
    const cJSON *tag = NULL; /* the first property whose consts are distinct over the branches */
    for (const cJSON *p = props->child; p && !tag; p = p->next) {
        bool ok = true;
        for (const cJSON *b = first; b && ok; b = b->next) {
            const cJSON *v = const_of(cJSON_GetObjectItemCaseSensitive(branch_props(b), p->string));
            ok = v != NULL;
            for (const cJSON *o = first; ok && o != b; o = o->next)
                ok = !cJSON_Compare(v, const_of(cJSON_GetObjectItemCaseSensitive(branch_props(o), p->string)), true);
        }
        if (ok) tag = p;
    }
    if (!tag) return AKV_EUNSUPPORTED;
    /* the object: the first branch's properties, the tag an enum, the others switches */
    akv_status st = compile_object(s, first, nest, node);
    if (st) return st;
    const akv_js_node on = s->nodes[node];
    uint32_t k = 0;
    for (const cJSON *p = props->child; p; p = p->next, k++) {
        uint32_t pn;
        if ((st = new_node(s, &pn))) return st;
        if (p == tag) {
            const uint32_t t0 = s->n_texts;
            for (const cJSON *b = first; b; b = b->next) {
                uint32_t at;
                if ((st = enum_text(s, const_of(cJSON_GetObjectItemCaseSensitive(branch_props(b), p->string)), &at)))
                    return st;
            }
            s->nodes[pn].kind = AKV_JS_ENUM, s->nodes[pn].first = t0, s->nodes[pn].n = (uint32_t)n_br;
            s->nodes[node].items = k + 1;
        } else { /* case i: branch i's schema of the property */
            size_t cap = s->cap_props;
            if (akv__array_reserve((void **)&s->props, &cap, s->n_props + (uint32_t)n_br, sizeof *s->props))
                return AKV_ENOMEM;
            s->cap_props = (uint32_t)cap;
            const uint32_t c0 = s->n_props;
            s->n_props += (uint32_t)n_br;
            s->nodes[pn].kind = AKV_JS_SWITCH, s->nodes[pn].first = c0, s->nodes[pn].n = (uint32_t)n_br;
            uint32_t i = 0;
            for (const cJSON *b = first; b; b = b->next, i++) {
                uint32_t child;
                if ((st = compile(s, cJSON_GetObjectItemCaseSensitive(branch_props(b), p->string), nest + 1, &child)))
                    return st;
                s->props[c0 + i] = (akv_js_prop){.name = s->props[on.first + k].name, .node = child};
            }
        }
        s->props[on.first + k].node = pn;
    }
    return AKV_OK;
}

/* A bound keyword: absent (NULL), or a number (draft 4's boolean exclusiveMinimum/Maximum
 * taken where `flag` allows). */
static akv_status bound_of(akv_srv_schema *s, const cJSON *sch, const char *key, bool flag,
                           const cJSON **out) {
    *out = cJSON_GetObjectItemCaseSensitive(sch, key);
    if (*out && !cJSON_IsNumber(*out) && !(flag && cJSON_IsBool(*out)))
        return bad(s, "'%s' must be a number", key);
    if (*out && cJSON_IsNumber(*out) && !isfinite((*out)->valuedouble))
        return bad(s, "'%s' must be finite", key);
    return AKV_OK;
}

/* A number's or an integer's bounds into node: minimum, maximum, exclusiveMinimum,
 * exclusiveMaximum (numbers; draft 4's booleans beside minimum/maximum), the stricter of each
 * pair. Kept to what a short decimal writes, so the state machine never reaches a dead end
 * (akv/json_schema.h): at most 6 decimals and 15 digits in all with one more for an open end
 * (an integer's within 10^14, a number's with 6 decimals within 10^8); a bound at 10^15 or
 * beyond is no bound (no 15-digit value reaches it). */
static akv_status compile_bounds(akv_srv_schema *s, const cJSON *sch, uint32_t node, bool integer) {
    const cJSON *mn, *mx, *xmn, *xmx;
    akv_status st;
    if ((st = bound_of(s, sch, "minimum", false, &mn)) || (st = bound_of(s, sch, "maximum", false, &mx)) ||
        (st = bound_of(s, sch, "exclusiveMinimum", true, &xmn)) ||
        (st = bound_of(s, sch, "exclusiveMaximum", true, &xmx)))
        return st;
    if (!mn && !mx && !xmn && !xmx) return AKV_OK;
    double lo = -INFINITY, hi = INFINITY;
    bool lo_open = false, hi_open = false;
    if (mn) lo = mn->valuedouble, lo_open = cJSON_IsTrue(xmn);
    if (mx) hi = mx->valuedouble, hi_open = cJSON_IsTrue(xmx);
    if (xmn && cJSON_IsNumber(xmn) && xmn->valuedouble >= lo) lo = xmn->valuedouble, lo_open = true;
    if (xmx && cJSON_IsNumber(xmx) && xmx->valuedouble <= hi) hi = xmx->valuedouble, hi_open = true;
    if (lo <= -1e15) lo = -INFINITY, lo_open = false;
    if (hi >= 1e15) hi = INFINITY, hi_open = false;
    const double ends[2] = {lo, hi};
    for (int i = 0; i < 2; i++) {
        if (isinf(ends[i])) continue;
        /* its digits: the whole part's and the fewest decimals (at most 6) that write it; with
         * one more for an open end, at most 15 (what the machine writes) */
        int dec = 0;
        char t[64];
        for (; dec <= 6; dec++) {
            snprintf(t, sizeof t, "%.*f", dec, ends[i]);
            if (strtod(t, NULL) == ends[i]) break;
        }
        if (integer) dec = 0;
        else if (dec > 6)
            return bad(s, "a number's bound of more than 6 decimals (%.17g) is not enforced", ends[i]);
        int whole = 1;
        for (double w = floor(fabs(ends[i])); w >= 10; w /= 10) whole++;
        if (whole + dec + 1 > 15 || fabs(ends[i]) >= 1e14)
            return bad(s, "%s bound %.17g has more digits than are enforced (15 in all, one "
                          "more for an exclusive end)",
                       integer ? "an integer's" : "a number's", ends[i]);
    }
    if (integer) { /* the integers within, as closed ends */
        if (!isinf(lo)) lo = lo_open ? floor(lo) + 1 : ceil(lo);
        if (!isinf(hi)) hi = hi_open ? ceil(hi) - 1 : floor(hi);
        lo_open = hi_open = false;
    }
    if (lo > hi || (lo == hi && (lo_open || hi_open))) return bad(s, "no value lies within the bounds");
    akv_js_node *n = &s->nodes[node];
    n->bounded = true, n->lo = lo, n->hi = hi, n->lo_open = lo_open, n->hi_open = hi_open;
    return AKV_OK;
}

/* A string's minLength and maxLength (characters) into node. */
static akv_status compile_lengths(akv_srv_schema *s, const cJSON *sch, uint32_t node) {
    const cJSON *lo = cJSON_GetObjectItemCaseSensitive(sch, "minLength"),
                *hi = cJSON_GetObjectItemCaseSensitive(sch, "maxLength");
    if (!lo && !hi) return AKV_OK;
    if (lo && (!cJSON_IsNumber(lo) || lo->valuedouble < 0 || lo->valuedouble > 65535 ||
               lo->valuedouble != floor(lo->valuedouble)))
        return bad(s, "'minLength' must be an integer 0..65535");
    if (hi && (!cJSON_IsNumber(hi) || hi->valuedouble < 0 || hi->valuedouble > 65535 ||
               hi->valuedouble != floor(hi->valuedouble)))
        return bad(s, "'maxLength' must be an integer 0..65535");
    akv_js_node *n = &s->nodes[node];
    n->bounded = true, n->lo = lo ? lo->valuedouble : 0, n->hi = hi ? hi->valuedouble : 65535;
    if (n->lo > n->hi) return bad(s, "'minLength' above 'maxLength'");
    return AKV_OK;
}

static akv_status compile_typed(akv_srv_schema *s, const cJSON *sch, const char *type, uint32_t nest,
                                uint32_t node) {
    static const struct {
        const char *name;
        akv_js_kind kind;
    } simple[] = {{"string", AKV_JS_STRING}, {"number", AKV_JS_NUMBER}, {"integer", AKV_JS_INTEGER},
                  {"boolean", AKV_JS_BOOLEAN}, {"null", AKV_JS_NULL}};
    for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++)
        if (!strcmp(type, simple[i].name)) {
            s->nodes[node].kind = (uint8_t)simple[i].kind;
            if (simple[i].kind == AKV_JS_STRING) return compile_lengths(s, sch, node);
            if (simple[i].kind == AKV_JS_NUMBER || simple[i].kind == AKV_JS_INTEGER)
                return compile_bounds(s, sch, node, simple[i].kind == AKV_JS_INTEGER);
            return AKV_OK;
        }
    if (!strcmp(type, "object")) return compile_object(s, sch, nest, node);
    if (!strcmp(type, "array")) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(sch, "items");
        const cJSON *lo = cJSON_GetObjectItemCaseSensitive(sch, "minItems"),
                    *hi = cJSON_GetObjectItemCaseSensitive(sch, "maxItems");
        uint32_t child;
        akv_status st;
        if (items && !cJSON_IsObject(items)) return bad(s, "'items' must be a schema");
        if (items) {
            if ((st = compile(s, items, nest + 1, &child))) return st;
        } else {
            if ((st = new_node(s, &child))) return st; /* any value */
        }
        akv_js_node *n = &s->nodes[node];
        n->kind = AKV_JS_ARRAY, n->items = child;
        if (lo && (!cJSON_IsNumber(lo) || lo->valuedouble < 0 || lo->valuedouble > 65535))
            return bad(s, "'minItems' must be 0..65535");
        if (hi && (!cJSON_IsNumber(hi) || hi->valuedouble < 1 || hi->valuedouble > 65535))
            return bad(s, "'maxItems' must be 1..65535");
        n->min_items = lo ? (uint32_t)lo->valuedouble : 0;
        n->max_items = hi ? (uint32_t)hi->valuedouble : 0;
        if (n->max_items && n->min_items > n->max_items) return bad(s, "'minItems' above 'maxItems'");
        return AKV_OK;
    }
    return bad(s, "type '%.40s' is not a JSON Schema type", type);
}

/* The keywords that bound a typed value (a number's, a string's, an array's): refused beside
 * what compiles without reading them ($ref, enum, const, anyOf, oneOf, allOf), rather than
 * ignored. */
static akv_status no_bounds_beside(akv_srv_schema *s, const cJSON *sch, const char *beside) {
    static const char *const bounds[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                         "minLength", "maxLength", "minItems", "maxItems"};
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++)
        if (cJSON_GetObjectItemCaseSensitive(sch, bounds[i]))
            return bad(s, "'%s' beside '%s' is not supported (put it in the schema it bounds)",
                       bounds[i], beside);
    return AKV_OK;
}

static akv_status compile_into(akv_srv_schema *s, const cJSON *sch, uint32_t nest, uint32_t node) {
    if (nest > SCHEMA_MAX_NEST) return bad(s, "the schema nests deeper than %d", SCHEMA_MAX_NEST);
    if (cJSON_IsBool(sch) && cJSON_IsTrue(sch)) return AKV_OK; /* true: any value */
    if (!cJSON_IsObject(sch)) return bad(s, "a schema must be an object");
    /* What the state machine cannot hold a value to is refused by name rather than ignored
     * (the answer would not validate): these always; uniqueItems when true. `format` is an
     * annotation (JSON Schema's default: not an assertion), as are title, description,
     * default, examples and the like: taken, not checked. */
    static const char *const refused[] = {
        "not", "if", "then", "else", "patternProperties", "dependentSchemas", "dependentRequired",
        "dependencies", "unevaluatedProperties", "unevaluatedItems", "prefixItems", "additionalItems",
        "contains", "minContains", "maxContains", "propertyNames", "minProperties", "maxProperties",
        "pattern", "multipleOf", "contentSchema"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (cJSON_GetObjectItemCaseSensitive(sch, refused[i]))
            return bad(s, "'%s' is not supported", refused[i]);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sch, "uniqueItems")))
        return bad(s, "'uniqueItems' is not supported");
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(sch, "$ref");
    static const char *const whole[] = {"$ref", "enum", "const", "anyOf", "oneOf", "allOf"};
    for (size_t i = 0; i < sizeof whole / sizeof whole[0]; i++)
        if (cJSON_GetObjectItemCaseSensitive(sch, whole[i])) {
            akv_status st = no_bounds_beside(s, sch, whole[i]);
            if (st) return st;
        }
    if (ref) {
        const cJSON *to = cJSON_IsString(ref) ? resolve(s, ref->valuestring) : NULL;
        if (!to) return bad(s, "'$ref' must name #/$defs/... or #/definitions/... of the schema");
        /* a node that stands for the target's (compiled once, maybe still being compiled: a
         * recursive schema), so a wrapper (nullable, allOf) does not copy an unfinished one */
        uint32_t target = UINT32_MAX;
        for (uint32_t i = 0; i < s->n_refs; i++)
            if (s->ref_from[i] == to) target = s->ref_node[i];
        if (target == UINT32_MAX) {
            if (s->n_refs == SCHEMA_MAX_NODES) return bad(s, "too many $refs");
            akv_status st = new_node(s, &target);
            if (st) return st;
            s->ref_from[s->n_refs] = to, s->ref_node[s->n_refs++] = target;
            if ((st = compile_into(s, to, nest + 1, target))) return st;
        }
        s->nodes[node].kind = AKV_JS_REF, s->nodes[node].items = target;
        return AKV_OK;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(sch, "enum"),
                *co = cJSON_GetObjectItemCaseSensitive(sch, "const");
    if (en || co) {
        if (en && (!cJSON_IsArray(en) || !en->child)) return bad(s, "'enum' must be a non-empty array");
        uint32_t n = 0, first = s->n_texts;
        for (const cJSON *v = en ? en->child : co; v; v = en ? v->next : NULL) {
            if (++n > AKV_JS_MAX_PROPS) return bad(s, "an enum of more than %d values", AKV_JS_MAX_PROPS);
            uint32_t at;
            akv_status st = enum_text(s, v, &at);
            if (st) return st;
        }
        s->nodes[node].kind = AKV_JS_ENUM, s->nodes[node].first = first, s->nodes[node].n = n;
        return AKV_OK;
    }
    const char *alts[3] = {"anyOf", "oneOf", "allOf"};
    for (int i = 0; i < 3; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(sch, alts[i]);
        if (!a) continue;
        const int len = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
        if (i == 2 && len == 1) return compile_into(s, a->child, nest + 1, node);
        if (i < 2 && len >= 2) {
            const akv_status st = compile_union(s, a, nest, node);
            if (st != AKV_EUNSUPPORTED) return st;
        }
        if (i < 2 && len == 2 && (is_null_schema(a->child) || is_null_schema(a->child->next))) {
            const cJSON *x = is_null_schema(a->child) ? a->child->next : a->child;
            akv_status st = compile_into(s, x, nest + 1, node);
            if (st) return st;
            s->nodes[node].nullable = true;
            return AKV_OK;
        }
        return bad(s, "'%s' is supported only as [a schema, {\"type\": \"null\"}], or as objects "
                      "of the same properties told apart by one of them, a const%s", alts[i],
                   i == 2 ? " (allOf: one schema)" : "");
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(sch, "type");
    if (!t) { /* no type: any value (an object when it has properties) */
        if (cJSON_GetObjectItemCaseSensitive(sch, "properties")) return compile_object(s, sch, nest, node);
        /* a bound on the values of some type, which any value's machine would not hold */
        static const char *const typed[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                            "minLength", "maxLength", "minItems", "maxItems", "items"};
        for (size_t i = 0; i < sizeof typed / sizeof typed[0]; i++)
            if (cJSON_GetObjectItemCaseSensitive(sch, typed[i]))
                return bad(s, "'%s' needs a 'type' beside it", typed[i]);
        return AKV_OK;
    }
    if (cJSON_IsString(t)) return compile_typed(s, sch, t->valuestring, nest, node);
    if (cJSON_IsArray(t) && cJSON_GetArraySize(t) == 2 && cJSON_IsString(t->child) &&
        cJSON_IsString(t->child->next)) {
        const bool first_null = !strcmp(t->child->valuestring, "null");
        const char *other = first_null ? t->child->next->valuestring : t->child->valuestring;
        if (first_null || !strcmp(t->child->next->valuestring, "null")) {
            akv_status st = compile_typed(s, sch, other, nest, node);
            if (st) return st;
            s->nodes[node].nullable = true;
            return AKV_OK;
        }
    }
    if (cJSON_IsArray(t) && cJSON_GetArraySize(t) == 1 && cJSON_IsString(t->child))
        return compile_typed(s, sch, t->child->valuestring, nest, node);
    return bad(s, "'type' must be a name, or a name with \"null\"");
}

/* A new node for sch (a $ref's is a node that stands for its target: compile_into). */
static akv_status compile(akv_srv_schema *s, const cJSON *sch, uint32_t nest, uint32_t *out) {
    akv_status st = new_node(s, out);
    return st ? st : compile_into(s, sch, nest, *out);
}

void akv_srv_schema_free(akv_srv_schema *s) {
    if (!s) return;
    for (uint32_t i = 0; i < s->n_texts; i++) akv__free(s->texts[i]);
    akv__free(s->texts);
    akv__free(s->text_view);
    akv__free(s->nodes);
    akv__free(s->props);
    akv__free(s);
}

akv_status akv_srv_schema_compile(const cJSON *schema, akv_srv_schema **out, char *why, size_t cap) {
    *out = NULL;
    akv_srv_schema *s = akv__calloc(1, sizeof *s);
    if (!s) return AKV_ENOMEM;
    s->root = schema, s->why = why, s->why_cap = cap;
    uint32_t root;
    akv_status st = compile(s, schema, 0, &root);
    if (!st && !(s->text_view = akv__calloc(s->n_texts + 1, sizeof *s->text_view))) st = AKV_ENOMEM;
    if (st) {
        akv_srv_schema_free(s);
        return st;
    }
    for (uint32_t i = 0; i < s->n_texts; i++) s->text_view[i] = s->texts[i];
    s->view = (akv_json_schema){.nodes = s->nodes, .n_nodes = s->n_nodes, .props = s->props,
                                .texts = s->text_view};
    *out = s;
    return AKV_OK;
}

const akv_json_schema *akv_srv_schema_view(const akv_srv_schema *s) {
    return &s->view;
}
