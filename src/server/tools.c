/* tools.c — tool calls in a model's answer (server/tools.h). */
#include "server/tools.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/hash.h"

static const char *find(const char *h, size_t n, const char *needle) {
    const size_t m = strlen(needle);
    for (size_t i = 0; m <= n && i + m <= n; i++)
        if (!memcmp(h + i, needle, m)) return h + i;
    return NULL;
}

static bool ws(char c) {
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* Whether name is one of the tools offered. */
static bool offered(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = fn ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
        if (cJSON_IsString(nm) && !strcmp(nm->valuestring, name)) return true;
    }
    return false;
}

/* ---- a JSON text's spans, as far as they have come ---------------------------------------- */

/* From s[i], a value's first byte, to past its end: the index after it, *whole; or n and not
 * whole when the text ends inside it. Scalars end at a delimiter (a number at the text's end is
 * not whole: more digits may come). */
static size_t json_skip(const char *s, size_t i, size_t n, bool *whole) {
    int depth = 0;
    bool in_str = false, esc = false;
    *whole = false;
    for (; i < n; i++) {
        const char c = s[i];
        if (in_str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') {
                in_str = false;
                if (depth == 0) return *whole = true, i + 1;
            }
            continue;
        }
        if (c == '"') in_str = true;
        else if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') {
            if (depth == 0) return *whole = true, i; /* a scalar ended by its container */
            if (--depth == 0) return *whole = true, i + 1;
        } else if (depth == 0 && (c == ',' || ws(c))) {
            return *whole = true, i; /* a scalar's end */
        }
    }
    return n;
}

/* A string at s[i] == '"': its body s[i + 1, end) and past it; n when not whole. *escaped:
 * it holds an escape. */
static size_t json_string(const char *s, size_t i, size_t n, size_t *end, bool *escaped) {
    *escaped = false;
    for (size_t k = i + 1; k < n; k++) {
        if (s[k] == '\\') {
            *escaped = true, k++;
            continue;
        }
        if (s[k] == '"') return *end = k, k + 1;
    }
    return n;
}

/* A call object at s[i] == '{' as far as it has come into *p: returns the index past it and
 * *whole, or n. */
static size_t call_object(const char *s, size_t i, size_t n, akv_srv_call_part *p, bool *whole) {
    *whole = false;
    for (i++;;) {
        while (i < n && (ws(s[i]) || s[i] == ',')) i++;
        if (i >= n) return n;
        if (s[i] == '}') return *whole = true, i + 1;
        if (s[i] != '"') return n; /* not an object's key: nothing more to read */
        size_t key_end, e;
        bool esc;
        const size_t after = json_string(s, i, n, &key_end, &esc);
        if (after >= n) return n;
        const char *key = s + i + 1;
        const size_t key_n = key_end - (i + 1);
        i = after;
        while (i < n && ws(s[i])) i++;
        if (i >= n || s[i] != ':') return n;
        i++;
        while (i < n && ws(s[i])) i++;
        if (i >= n) return n;
        const bool is_name = key_n == 4 && !memcmp(key, "name", 4);
        const bool is_args = (key_n == 9 && !memcmp(key, "arguments", 9)) ||
                             (key_n == 10 && !memcmp(key, "parameters", 10));
        if (is_name && s[i] == '"') {
            const size_t next = json_string(s, i, n, &e, &esc);
            if (next >= n) return n;
            p->name = s + i + 1, p->name_n = e - (i + 1), p->named = !esc;
            i = next;
            continue;
        }
        bool w = false;
        const size_t next = json_skip(s, i, n, &w);
        if (is_args) p->has_args = true, p->args_at = i, p->args_n = next - i, p->args_whole = w;
        if (!w) return n;
        i = next;
    }
}

/* One call at held[i] == '{' into out[sc->first]: the scan moves past it when it is whole,
 * else stays at `from` (where the next scan reads it again). Whether it is whole. */
static bool scan_call(const char *held, size_t n, size_t from, size_t i, akv_srv_calls_scan *sc,
                      akv_srv_call_part *out, size_t *past) {
    bool whole;
    memset(&out[sc->first], 0, sizeof out[sc->first]);
    *past = call_object(held, i, n, &out[sc->first], &whole);
    if (!whole) {
        sc->at = from, sc->open = true;
        return false;
    }
    sc->at = *past, sc->first++;
    return true;
}

size_t akv_srv_tool_calls_partial(const char *held, size_t n, akv_srv_calls_scan *sc,
                                  akv_srv_call_part *out, size_t cap) {
    static const char tc[] = "<tool_call>", mc[] = "[TOOL_CALLS]";
    size_t i = sc->at;
    sc->open = false;
    if (sc->form == SCAN_UNKNOWN) { /* decided by the first bytes: blocks, a list or one call */
        while (i < n && ws(held[i])) i++;
        if (n - i < sizeof mc - 1 && !memcmp(held + i, mc, n - i)) return sc->first; /* may be it */
        if (n - i >= sizeof tc - 1 && !memcmp(held + i, tc, sizeof tc - 1)) {
            sc->form = SCAN_BLOCKS, sc->at = i;
        } else {
            if (n - i >= sizeof mc - 1 && !memcmp(held + i, mc, sizeof mc - 1)) i += sizeof mc - 1;
            while (i < n && ws(held[i])) i++;
            if (i >= n || (held[i] != '[' && held[i] != '{')) return sc->first;
            sc->form = held[i] == '[' ? SCAN_LIST : SCAN_ONE;
            sc->at = i += held[i] == '[';
        }
    }
    for (size_t past; sc->first < cap;) {
        i = sc->at;
        if (sc->form == SCAN_BLOCKS) { /* <tool_call> {...} </tool_call>, again and again */
            const char *at = find(held + i, n - i, tc);
            if (!at) break;
            size_t j = (size_t)(at - held) + sizeof tc - 1;
            while (j < n && ws(held[j])) j++;
            if (j >= n || held[j] != '{' || !scan_call(held, n, i, j, sc, out, &past)) break;
            continue;
        }
        while (i < n && (ws(held[i]) || (sc->form == SCAN_LIST && held[i] == ','))) i++;
        if (i >= n || held[i] != '{' || !scan_call(held, n, sc->at, i, sc, out, &past) ||
            sc->form == SCAN_ONE)
            break;
    }
    return sc->first + sc->open;
}

/* A call's id: 9 letters and digits (Mistral's templates refuse any other), from the
 * request's tag and the call's index, so a request's calls differ and the same request gives
 * the same ids. */
void akv_srv_tool_call_id(unsigned long long tag, size_t i, char out[16]) {
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    uint64_t z = akv_hash64_mix((uint64_t)tag * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD1B54A32D192ED03ull + 1);
    for (int k = 0; k < 9; k++) out[k] = digits[z % 62], z /= 62;
    out[9] = 0;
}

typedef struct found {
    akv_srv_tool_calls *out;
    size_t cap;
    const cJSON *tools;
    unsigned long long tag;
    akv_status st;
} found;

/* One call: name and arguments (a string: its text; else the raw JSON text raw[raw_n] as the
 * model wrote it where known, the value printed otherwise). */
static bool add(found *f, const char *name, const cJSON *args, const char *raw, size_t raw_n) {
    if (!name || !offered(f->tools, name)) return false;
    akv_srv_tool_calls *o = f->out;
    if (o->n == f->cap) {
        const size_t cap = f->cap ? 2 * f->cap : 4;
        akv_api_tool_call *v = akv__realloc(o->v, cap * sizeof *v);
        if (!v) return f->st = AKV_ENOMEM, false;
        o->v = v, f->cap = cap;
    }
    char id[16];
    akv_srv_tool_call_id(f->tag, o->n, id);
    char *a;
    if (cJSON_IsString(args)) {
        a = akv__strndup(args->valuestring, strlen(args->valuestring));
    } else if (raw && args) {
        a = akv__strndup(raw, raw_n);
    } else {
        char *p = args ? cJSON_PrintUnformatted(args) : NULL;
        a = akv__strndup(p ? p : "{}", p ? strlen(p) : 2);
        cJSON_free(p);
    }
    akv_api_tool_call c = {akv__strndup(id, strlen(id)), akv__strndup(name, strlen(name)), a};
    if (!c.id || !c.name || !c.arguments) {
        akv__free((char *)c.id), akv__free((char *)c.name), akv__free((char *)c.arguments);
        return f->st = AKV_ENOMEM, false;
    }
    o->v[o->n++] = c;
    return true;
}

/* A call as a JSON object {"name": ..., "arguments" or "parameters": ...}, whose text begins at
 * text[0] (white space first; NULL: not known); *past (may be NULL): the bytes of text to the
 * object's end, where known. */
static bool add_json(found *f, const cJSON *obj, const char *text, size_t n, size_t *past) {
    if (!cJSON_IsObject(obj)) return false;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(obj, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(obj, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
    akv_srv_call_part p = {0};
    bool whole = false;
    size_t i = 0;
    while (text && i < n && ws(text[i])) i++;
    const size_t end = text && i < n && text[i] == '{' ? call_object(text, i, n, &p, &whole) : 0;
    if (past) *past = whole ? end : n;
    const bool raw = whole && p.args_whole;
    return cJSON_IsString(nm) && add(f, nm->valuestring, args, raw ? text + p.args_at : NULL, p.args_n);
}

/* The JSON value at the start of s[0..n) (leading white space skipped); *end past it. */
static cJSON *json_at(const char *s, size_t n, const char **end) {
    while (n && ws(*s)) s++, n--;
    char *copy = akv__strndup(s, n);
    if (!copy) return NULL;
    const char *stop = NULL;
    cJSON *v = cJSON_ParseWithOpts(copy, &stop, false);
    if (v && end) *end = s + (stop - copy);
    akv__free(copy);
    return v;
}

/* Text of the answer outside the calls: pieces [a, b) appended, then trimmed. */
static void keep(found *f, char **acc, size_t *n_acc, const char *a, const char *b) {
    if (b <= a || f->st) return;
    char *m = akv__realloc(*acc, *n_acc + (size_t)(b - a) + 1);
    if (!m) {
        f->st = AKV_ENOMEM;
        return;
    }
    memcpy(m + *n_acc, a, (size_t)(b - a));
    *n_acc += (size_t)(b - a);
    m[*n_acc] = 0;
    *acc = m;
}

/* <open>BODY<close>...: each body a call (parse(f, body, n, name)); the text between kept. */
static void blocks(found *f, const char *text, size_t n, const char *open, const char *close,
                   bool named, char **acc, size_t *n_acc) {
    const char *p = text, *end = text + n, *at;
    while ((at = find(p, (size_t)(end - p), open)) != NULL) {
        const char *body = at + strlen(open), *name = NULL;
        size_t name_n = 0;
        if (named) { /* <function=NAME> */
            const char *gt = find(body, (size_t)(end - body), ">");
            if (!gt) break;
            name = body, name_n = (size_t)(gt - body), body = gt + 1;
        }
        const char *stop = find(body, (size_t)(end - body), close);
        const char *body_end = stop ? stop : end;
        cJSON *v = json_at(body, (size_t)(body_end - body), NULL);
        bool ok;
        if (named) { /* its body the arguments, a JSON object (another form is not this one) */
            char *nm = cJSON_IsObject(v) ? akv__strndup(name, name_n) : NULL;
            const char *a = body, *e = body_end;
            while (a < e && ws(*a)) a++;
            while (e > a && ws(e[-1])) e--;
            ok = nm && add(f, nm, v, a, (size_t)(e - a));
            akv__free(nm);
        } else {
            ok = add_json(f, v, body, (size_t)(body_end - body), NULL);
        }
        cJSON_Delete(v);
        if (!ok) break;
        keep(f, acc, n_acc, p, at);
        p = stop ? stop + strlen(close) : end;
    }
    if (f->out->n) keep(f, acc, n_acc, p, end);
}

akv_status akv_srv_tool_calls_find(const char *text, size_t n, const char *tools_json,
                                   unsigned long long tag, akv_srv_tool_calls *out) {
    memset(out, 0, sizeof *out);
    cJSON *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    if (!tools) return tools_json ? AKV_ENOMEM : AKV_OK;
    found f = {.out = out, .tools = tools, .tag = tag};
    char *acc = NULL;
    size_t n_acc = 0;
    blocks(&f, text, n, "<tool_call>", "</tool_call>", false, &acc, &n_acc);
    if (!out->n && !f.st) blocks(&f, text, n, "<function=", "</function>", true, &acc, &n_acc);
    if (!out->n && !f.st) { /* a JSON array of calls, or one call, as the whole answer */
        const char *s = text, *end = text + n;
        while (s < end && ws(*s)) s++;
        static const char *const marks[] = {"[TOOL_CALLS]", "<|python_tag|>"};
        for (size_t i = 0; i < 2; i++)
            if ((size_t)(end - s) >= strlen(marks[i]) && !memcmp(s, marks[i], strlen(marks[i])))
                s += strlen(marks[i]);
        const char *after = NULL;
        cJSON *v = json_at(s, (size_t)(end - s), &after);
        bool whole = v && after;
        for (const char *q = after; whole && q < end; q++) whole = ws(*q);
        if (whole && cJSON_IsArray(v)) {
            const cJSON *c;
            bool all = cJSON_GetArraySize(v) > 0;
            cJSON_ArrayForEach(c, v) all = all && cJSON_IsObject(c) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(c, "name")) && offered(tools, cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring);
            /* each element's text: after '[', objects separated by ',' */
            const char *q = s;
            while (q < end && *q != '[') q++;
            q++;
            cJSON_ArrayForEach(c, v) {
                size_t past;
                if (!all || !add_json(&f, c, q, (size_t)(end - q), &past)) break;
                q += past;
                while (q < end && (ws(*q) || *q == ',')) q++;
            }
        } else if (whole) {
            add_json(&f, v, s, (size_t)(end - s), NULL);
        }
        cJSON_Delete(v);
    }
    cJSON_Delete(tools);
    if (!f.st && out->n && acc) { /* the content besides the calls, trimmed */
        size_t a = 0, b = n_acc;
        while (a < b && ws(acc[a])) a++;
        while (b > a && ws(acc[b - 1])) b--;
        if (b > a && !(out->content = akv__strndup(acc + a, b - a))) f.st = AKV_ENOMEM;
    }
    akv__free(acc);
    if (f.st) akv_srv_tool_calls_free(out);
    return f.st;
}

void akv_srv_tool_calls_free(akv_srv_tool_calls *c) {
    for (size_t i = 0; i < c->n; i++) {
        akv__free((char *)c->v[i].id);
        akv__free((char *)c->v[i].name);
        akv__free((char *)c->v[i].arguments);
    }
    akv__free(c->v);
    akv__free(c->content);
    memset(c, 0, sizeof *c);
}

/* ---- the streamed answer ------------------------------------------------------------------ */

/* The openers; from index 2 on they open a call only at the answer's start (as
 * akv_srv_tool_calls_find reads them), after nothing but white space. */
static const char *const stream_openers[] = {"<tool_call>", "<function=", "[TOOL_CALLS]",
                                             "<|python_tag|>"};
enum { STREAM_ANYWHERE = 2 };

/* Whether h[0..n) is white space only. */
static bool all_ws(const char *h, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!ws(h[i])) return false;
    return true;
}

akv_status akv_srv_tool_stream_feed(akv_srv_tool_stream *ts, const char *piece, size_t n,
                                    const char **out, size_t *n_out) {
    *out = NULL, *n_out = 0;
    if (ts->n_held + n + 1 > ts->cap) {
        const size_t cap = 2 * (ts->n_held + n) + 64;
        char *h = akv__realloc(ts->held, cap);
        if (!h) return AKV_ENOMEM;
        ts->held = h, ts->cap = cap;
    }
    if (n) memcpy(ts->held + ts->n_held, piece, n);
    ts->n_held += n;
    ts->held[ts->n_held] = 0;
    if (ts->call) return AKV_OK;
    const char *h = ts->held;
    size_t send = ts->n_held;
    if (!ts->started) { /* the bare JSON forms: an answer that begins with '{' or '[' */
        size_t i = 0;
        while (i < ts->n_held && ws(h[i])) i++;
        if (i == ts->n_held) return AKV_OK; /* white space only so far */
        ts->started = true;
        if (h[i] == '{' || h[i] == '[') return ts->call = true, AKV_OK;
    }
    /* a whole opener: the text before it goes, the rest is held to the end */
    const char *first = NULL;
    for (size_t k = 0; k < sizeof stream_openers / sizeof *stream_openers; k++) {
        const char *at = find(h, ts->n_held, stream_openers[k]);
        if (at && k >= STREAM_ANYWHERE && (ts->sent_any || !all_ws(h, (size_t)(at - h))))
            at = NULL; /* not at the answer's start: text */
        if (at && (!first || at < first)) first = at;
    }
    if (first) {
        ts->call = true;
        send = (size_t)(first - h);
    } else { /* the longest tail that may begin an opener waits for the next piece */
        for (size_t k = 0; k < sizeof stream_openers / sizeof *stream_openers; k++) {
            const size_t m = strlen(stream_openers[k]);
            for (size_t t = m - 1; t > 0; t--)
                if (t <= ts->n_held && ts->n_held - t < send &&
                    !memcmp(h + ts->n_held - t, stream_openers[k], t) &&
                    (k < STREAM_ANYWHERE || (!ts->sent_any && all_ws(h, ts->n_held - t)))) {
                    send = ts->n_held - t;
                    break;
                }
        }
    }
    while (send && ws(h[send - 1])) send--; /* trailing white space waits */
    if (!send) return AKV_OK;
    /* the first send bytes go out (a copy in the stream's out buffer), the rest stays held */
    if (send + 1 > ts->out_cap) {
        char *m = akv__realloc(ts->out, send + 64);
        if (!m) return AKV_ENOMEM;
        ts->out = m, ts->out_cap = send + 64;
    }
    memcpy(ts->out, h, send);
    ts->out[send] = 0;
    memmove(ts->held, ts->held + send, ts->n_held - send);
    ts->n_held -= send;
    ts->held[ts->n_held] = 0;
    *out = ts->out, *n_out = send;
    ts->sent_any = true;
    return AKV_OK;
}

const char *akv_srv_tool_stream_held(const akv_srv_tool_stream *ts, size_t *n) {
    *n = ts->n_held;
    return ts->held ? ts->held : "";
}

void akv_srv_tool_stream_free(akv_srv_tool_stream *ts) {
    akv__free(ts->held), akv__free(ts->out);
    memset(ts, 0, sizeof *ts);
}

