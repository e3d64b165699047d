/* api.c — OpenAI request bodies in, checked requests out; answers and chunks out as JSON. */
#include "server/api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "server/schema.h"
#include "tok/utf8.h"

void akv_api_error_set(akv_api_error *err, int status, const char *type, const char *code,
                       const char *param, const char *fmt, ...) {
    err->status = status;
    err->type = type;
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

#define BAD(param, ...)                                                                          \
    (akv_api_error_set(err, 400, "invalid_request_error", NULL, (param), __VA_ARGS__), AKV_EINVAL)

void akv_api_request_free(akv_api_request *r) {
    if (!r) return;
    for (uint32_t i = 0; i < r->n_stop; i++) akv__free(r->stop[i]);
    akv__free(r->bias);
    for (size_t i = 0; i < r->n_msgs; i++) {
        akv__free((char *)r->msgs[i].role);
        akv__free((char *)r->msgs[i].content);
    }
    akv__free(r->msgs);
    akv__free(r->messages_json);
    akv__free(r->messages_json_text);
    akv__free(r->tools_json);
    akv__free(r->prompt);
    akv__free(r->prompt_ids);
    akv_srv_schema_free(r->schema);
    akv_srv_schema_free(r->call_schema);
    memset(r, 0, sizeof *r);
}

static char *dup_n(const char *s, size_t n) {
    char *d = akv__malloc(n + 1);
    if (d) memcpy(d, s, n), d[n] = '\0';
    return d;
}

/* A field that is absent or null. */
static bool absent(const cJSON *v) {
    return !v || cJSON_IsNull(v);
}

/* A number field in [lo, hi]: AKV_OK (absent leaves *out), else the error. */
static akv_status get_num(const cJSON *o, const char *name, double lo, double hi, double *out,
                          akv_api_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (absent(v)) return AKV_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return BAD(name, "'%s' must be a number", name);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return BAD(name, "'%s' is %g; it must be in [%g, %g]", name, v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return AKV_OK;
}

/* An integer field in [lo, hi] (a number with no fraction). */
static akv_status get_int(const cJSON *o, const char *name, double lo, double hi, double *out,
                          akv_api_error *err) {
    double x = NAN;
    akv_status st = get_num(o, name, lo, hi, &x, err);
    if (st || isnan(x)) return st;
    if (x != floor(x)) return BAD(name, "'%s' must be an integer (is %g)", name, x);
    *out = x;
    return AKV_OK;
}

static akv_status get_bool(const cJSON *o, const char *name, bool *out, akv_api_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (absent(v)) return AKV_OK;
    if (!cJSON_IsBool(v)) return BAD(name, "'%s' must be true or false", name);
    *out = cJSON_IsTrue(v);
    return AKV_OK;
}

/* A field this server does not implement: refused unless absent, null, false or empty. */
static akv_status refuse_if_set(const cJSON *o, const char *name, const char *why,
                                akv_api_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (absent(v) || cJSON_IsFalse(v)) return AKV_OK;
    if ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child) return AKV_OK;
    if (cJSON_IsNumber(v) && v->valuedouble == 0) return AKV_OK; /* top_logprobs: 0 */
    if (cJSON_IsString(v) && !strcmp(v->valuestring, "none")) return AKV_OK; /* tool_choice */
    return BAD(name, "'%s' is not supported by this server (%s)", name, why);
}

static akv_status parse_stop(const cJSON *o, akv_api_request *r, akv_api_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (absent(v)) return AKV_OK;
    const cJSON *one = cJSON_IsString(v) ? v : NULL;
    if (!one && !cJSON_IsArray(v)) return BAD("stop", "'stop' must be a string or an array of strings");
    int n = one ? 1 : cJSON_GetArraySize(v);
    if (n > AKV_API_MAX_STOP) return BAD("stop", "'stop' holds %d strings; at most %d", n, AKV_API_MAX_STOP);
    for (int i = 0; i < n; i++) {
        const cJSON *s = one ? one : cJSON_GetArrayItem(v, i);
        if (!cJSON_IsString(s)) return BAD("stop", "'stop' must hold strings only");
        if (!*s->valuestring) continue; /* an empty stop string stops nothing */
        if (!(r->stop[r->n_stop] = dup_n(s->valuestring, strlen(s->valuestring)))) return AKV_ENOMEM;
        r->n_stop++;
    }
    return AKV_OK;
}

/* A message's content: a string, or an array of parts of which only text is accepted. */
static akv_status parse_content(const cJSON *m, size_t i, char **out, akv_api_error *err) {
    char param[40];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (absent(c)) { /* an assistant turn may have none (the caller checks the role) */
        *out = dup_n("", 0);
        return *out ? AKV_OK : AKV_ENOMEM;
    }
    if (cJSON_IsString(c)) {
        *out = dup_n(c->valuestring, strlen(c->valuestring));
        return *out ? AKV_OK : AKV_ENOMEM;
    }
    if (!cJSON_IsArray(c)) return BAD(param, "'%s' must be a string or an array of parts", param);
    size_t len = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return BAD(param, "'%s': only parts of type \"text\" with a string \"text\" are "
                              "supported (this model reads text)", param);
        len += strlen(text->valuestring);
    }
    char *s = akv__malloc(len + 1), *p = s;
    if (!s) return AKV_ENOMEM;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(p, t, n), p += n;
    }
    *p = '\0';
    *out = s;
    return AKV_OK;
}

/* The messages as the model's template reads them (r->messages_json): role (developer as
 * system), content (parts joined; "" for an assistant's tool calls without content, as vLLM
 * passes it: templates that test the content as a string, Qwen 3's, fail on null),
 * tool_calls with each call's arguments as a JSON object where the client sent them as JSON
 * text (as vLLM passes them), tool_call_id and name. */
static akv_status messages_json(const cJSON *v, akv_api_request *r, akv_api_error *err) {
    bool as_objects = false; /* a call's arguments were made an object */
    cJSON *arr = cJSON_CreateArray();
    akv_status st = arr ? AKV_OK : AKV_ENOMEM;
    for (size_t i = 0; !st && i < r->n_msgs; i++) {
        const cJSON *m = cJSON_GetArrayItem(v, (int)i);
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            st = AKV_ENOMEM;
            break;
        }
        cJSON_AddStringToObject(o, "role", r->msgs[i].role);
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        cJSON_AddStringToObject(o, "content", r->msgs[i].content);
        if (!absent(calls)) {
            cJSON *out = cJSON_AddArrayToObject(o, "tool_calls");
            const cJSON *c;
            int k = 0;
            cJSON_ArrayForEach(c, calls) {
                char param[64];
                snprintf(param, sizeof param, "messages[%zu].tool_calls[%d]", i, k++);
                const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
                const cJSON *name = fn ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
                const cJSON *args = fn ? cJSON_GetObjectItemCaseSensitive(fn, "arguments") : NULL;
                if (!cJSON_IsObject(c) || !cJSON_IsString(name)) {
                    st = BAD(param, "'%s' must be {\"type\": \"function\", \"function\": "
                                    "{\"name\": ..., \"arguments\": ...}}", param);
                    break;
                }
                cJSON *call = cJSON_CreateObject(), *f;
                cJSON_AddItemToArray(out, call);
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
                if (cJSON_IsString(id)) cJSON_AddStringToObject(call, "id", id->valuestring);
                cJSON_AddStringToObject(call, "type", "function");
                f = cJSON_AddObjectToObject(call, "function");
                cJSON_AddStringToObject(f, "name", name->valuestring);
                cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
                if (parsed && cJSON_IsObject(parsed)) as_objects = true, cJSON_AddItemToObject(f, "arguments", parsed);
                else if (cJSON_IsString(args)) cJSON_Delete(parsed), cJSON_AddStringToObject(f, "arguments", args->valuestring);
                else if (args) cJSON_Delete(parsed), cJSON_AddItemToObject(f, "arguments", cJSON_Duplicate(args, true));
                else cJSON_Delete(parsed), cJSON_AddObjectToObject(f, "arguments");
            }
        }
        static const char *const keep[] = {"tool_call_id", "name"};
        for (size_t k = 0; k < 2; k++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(m, keep[k]);
            if (cJSON_IsString(x)) cJSON_AddStringToObject(o, keep[k], x->valuestring);
        }
    }
    char *text = st ? NULL : cJSON_PrintUnformatted(arr);
    if (!st && !text) st = AKV_ENOMEM;
    if (!st && !(r->messages_json = dup_n(text, strlen(text)))) st = AKV_ENOMEM;
    cJSON_free(text);
    if (!st && as_objects) { /* the same with each call's arguments as JSON text */
        const cJSON *m, *c;
        cJSON_ArrayForEach(m, arr) {
            cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) {
                cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
                cJSON *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
                if (!cJSON_IsObject(a)) continue;
                char *t = cJSON_PrintUnformatted(a);
                cJSON *as_text = t ? cJSON_CreateString(t) : NULL;
                cJSON_free(t);
                if (!as_text) st = AKV_ENOMEM;
                else cJSON_ReplaceItemInObjectCaseSensitive(f, "arguments", as_text);
            }
        }
        text = st ? NULL : cJSON_PrintUnformatted(arr);
        if (!st && (!text || !(r->messages_json_text = dup_n(text, strlen(text))))) st = AKV_ENOMEM;
        cJSON_free(text);
    }
    cJSON_Delete(arr);
    return st;
}

/* A tool's function object of the name (NULL: none). */
static const cJSON *tool_named(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(nm) && !strcmp(nm->valuestring, name)) return fn;
    }
    return NULL;
}

/* A call's schema: {"name": name_schema (taken), args_key: params (any object when params is
 * not an object)}, both required. NULL: no memory. */
static cJSON *call_object_schema(cJSON *name_schema, const cJSON *params, const char *args_key) {
    cJSON *b = cJSON_CreateObject(), *props = b ? cJSON_AddObjectToObject(b, "properties") : NULL;
    if (!props || !name_schema) {
        cJSON_Delete(b), cJSON_Delete(name_schema);
        return NULL;
    }
    cJSON_AddStringToObject(b, "type", "object");
    cJSON_AddItemToObject(props, "name", name_schema);
    if (cJSON_IsObject(params)) cJSON_AddItemToObject(props, args_key, cJSON_Duplicate(params, true));
    else cJSON_AddStringToObject(cJSON_AddObjectToObject(props, args_key), "type", "object");
    cJSON *req = cJSON_AddArrayToObject(b, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString(args_key));
    return b;
}

/* A tool's name: its function's (the request's tools are checked to have one). */
static const char *tool_name(const cJSON *tool) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tool, "function"), "name")->valuestring;
}

akv_status akv_api_call_schema(const char *tools_json, const char *name, bool list, bool parallel,
                               const char *args_key, struct akv_srv_schema **out, char *why,
                               size_t cap) {
    *out = NULL;
    cJSON *tools = cJSON_Parse(tools_json), *any = cJSON_CreateArray(), *sch = NULL;
    akv_status st = tools && any ? AKV_OK : AKV_ENOMEM;
    for (int fallback = 0; fallback < 2 && (st == AKV_OK || st == AKV_EINVAL); fallback++) {
        if (fallback) { /* a tool's parameters the machine cannot follow (or two tools of one
                           name): the name held to the tools', the arguments to any object */
            if (st != AKV_EINVAL || name || cJSON_GetArraySize(tools) < 2) break;
            cJSON *names = cJSON_CreateObject(), *en = names ? cJSON_AddArrayToObject(names, "enum") : NULL;
            const cJSON *t;
            cJSON_ArrayForEach(t, tools) cJSON_AddItemToArray(en, cJSON_CreateString(tool_name(t)));
            sch = en ? call_object_schema(names, NULL, args_key) : (cJSON_Delete(names), NULL);
        } else {
            const cJSON *t;
            cJSON_ArrayForEach(t, tools) {
                if (st || (name && strcmp(tool_name(t), name))) continue;
                cJSON *nm = cJSON_CreateObject();
                if (nm) cJSON_AddStringToObject(nm, "const", tool_name(t));
                cJSON *b = call_object_schema(nm, cJSON_GetObjectItemCaseSensitive(
                                                      cJSON_GetObjectItemCaseSensitive(t, "function"), "parameters"),
                                              args_key);
                if (!b) st = AKV_ENOMEM;
                else cJSON_AddItemToArray(any, b);
            }
            if (!st && cJSON_GetArraySize(any) == 1) { /* one tool: its call */
                sch = cJSON_DetachItemFromArray(any, 0);
            } else if (!st) { /* the call of one of them: a union told apart by the name */
                sch = cJSON_CreateObject();
                if (sch) cJSON_AddItemToObject(sch, "anyOf", any), any = NULL;
            }
        }
        if (sch && list) { /* a list of calls (Mistral's [TOOL_CALLS] [...]) */
            cJSON *arr = cJSON_CreateObject();
            if (arr) {
                cJSON_AddStringToObject(arr, "type", "array");
                cJSON_AddNumberToObject(arr, "minItems", 1);
                if (!parallel) cJSON_AddNumberToObject(arr, "maxItems", 1);
                cJSON_AddItemToObject(arr, "items", sch);
            } else {
                cJSON_Delete(sch);
            }
            sch = arr;
        }
        if (!st || fallback) st = sch ? akv_srv_schema_compile(sch, out, why, cap) : AKV_ENOMEM;
        cJSON_Delete(sch), sch = NULL;
    }
    cJSON_Delete(any), cJSON_Delete(tools);
    return st;
}

/* A call forced (tool_choice required, or a named function): the answer held to the call's
 * schema (akv_api_call_schema), so it is the call, which the server gives back as one. */
static akv_status force_call(const char *tools_json, const char *name, akv_api_request *r,
                             akv_api_error *err) {
    char why[256] = "";
    akv_status st = akv_api_call_schema(tools_json, name, false, false, "arguments", &r->schema, why, sizeof why);
    if (st == AKV_EINVAL)
        return BAD("tools", "'tool_choice' holds the answer to the tool's parameters, and this "
                            "schema cannot be followed: %s", why);
    r->tool_forced = st == AKV_OK;
    return st;
}

/* tools (an array of {"type": "function", "function": {"name": ...}}) into r->tools_json;
 * tool_choice: "auto" (the default), "none" (the tools are not shown to the model),
 * "required" or {"type": "function", "function": {"name": N}} (force_call); and
 * parallel_tool_calls. */
static akv_status parse_tools(const cJSON *o, akv_api_request *r, akv_api_error *err) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(o, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(o, "tool_choice");
    akv_status st = get_bool(o, "parallel_tool_calls", &r->parallel_tool_calls, err);
    if (st) return st;
    if (!absent(tools)) {
        if (!cJSON_IsArray(tools)) return BAD("tools", "'tools' must be an array");
        const cJSON *t;
        int k = 0;
        cJSON_ArrayForEach(t, tools) {
            char param[40];
            snprintf(param, sizeof param, "tools[%d]", k++);
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            const cJSON *name = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
            if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
                !cJSON_IsString(name) || !*name->valuestring)
                return BAD(param, "'%s' must be {\"type\": \"function\", \"function\": {\"name\": "
                                  "..., \"description\": ..., \"parameters\": ...}}", param);
        }
    }
    const bool any = !absent(tools) && tools->child;
    bool none = false;
    const char *named = NULL;
    if (!absent(choice)) {
        const cJSON *fn = cJSON_IsObject(choice) ? cJSON_GetObjectItemCaseSensitive(choice, "function") : NULL;
        const cJSON *nm = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
        if (cJSON_IsString(nm)) named = nm->valuestring;
        else if (!cJSON_IsString(choice) || (strcmp(choice->valuestring, "auto") && strcmp(choice->valuestring, "none") &&
                                             strcmp(choice->valuestring, "required")))
            return BAD("tool_choice", "'tool_choice' is \"auto\", \"none\", \"required\" or "
                                      "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        none = cJSON_IsString(choice) && !strcmp(choice->valuestring, "none");
        const bool forced = named || (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required"));
        if (forced && !any) return BAD("tool_choice", "'tool_choice' asks for a call, and no 'tools' are given");
        if (named && !tool_named(tools, named))
            return BAD("tool_choice", "'tool_choice' names '%.64s', which is not among the tools", named);
        r->tool_forced = forced;
    }
    if (none || !any) return AKV_OK;
    char *text = cJSON_PrintUnformatted(tools);
    if (!text) return AKV_ENOMEM;
    r->tools_json = dup_n(text, strlen(text));
    cJSON_free(text);
    if (!r->tools_json) return AKV_ENOMEM;
    return r->tool_forced ? force_call(r->tools_json, named, r, err) : AKV_OK;
}

static akv_status parse_messages(const cJSON *o, akv_api_request *r, akv_api_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (absent(v)) return BAD("messages", "'messages' is required");
    if (!cJSON_IsArray(v)) return BAD("messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(v);
    if (n == 0) return BAD("messages", "'messages' is empty");
    if (n > AKV_API_MAX_MESSAGES)
        return BAD("messages", "'messages' holds %d messages; at most %d", n, AKV_API_MAX_MESSAGES);
    if (!(r->msgs = akv__calloc((size_t)n, sizeof *r->msgs))) return AKV_ENOMEM;
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(v, i);
        char param[40];
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsObject(m)) return BAD(param, "'messages[%d]' must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role))
            return BAD(param, "'%s' must be a string", param);
        const char *rname = role->valuestring;
        if (!strcmp(rname, "developer")) rname = "system"; /* OpenAI's newer name for it */
        const bool assistant = !strcmp(rname, "assistant"), tool = !strcmp(rname, "tool");
        if (!assistant && !tool && strcmp(rname, "system") && strcmp(rname, "user"))
            return BAD(param, "'%s' is '%.32s'; this server takes system, developer, user, "
                              "assistant and tool", param, role->valuestring);
        if (!assistant && absent(cJSON_GetObjectItemCaseSensitive(m, "content"))) {
            snprintf(param, sizeof param, "messages[%d].content", i);
            return BAD(param, "'%s' is required for a %s message", param, rname);
        }
        char *content = NULL;
        akv_status st = parse_content(m, (size_t)i, &content, err);
        if (st) return st;
        char *rs = dup_n(rname, strlen(rname));
        r->msgs[i] = (akv_chat_msg){rs, content};
        r->n_msgs = (size_t)i + 1;
        if (!rs) return AKV_ENOMEM;
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!absent(calls)) {
            snprintf(param, sizeof param, "messages[%d].tool_calls", i);
            if (!assistant || !cJSON_IsArray(calls))
                return BAD(param, "'%s' must be an array, on an assistant message", param);
            r->has_tool_use = true;
        }
        r->has_tool_use |= tool;
    }
    return messages_json(v, r, err);
}

/* [int, ...] into r->prompt_ids. */
static akv_status parse_ids(const cJSON *a, const akv_api_limits *lim, akv_api_request *r,
                            akv_api_error *err) {
    int n = cJSON_GetArraySize(a);
    if (n == 0) return BAD("prompt", "'prompt' is empty");
    if (!(r->prompt_ids = akv__calloc((size_t)n, sizeof *r->prompt_ids))) return AKV_ENOMEM;
    const cJSON *t;
    cJSON_ArrayForEach(t, a) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble >= lim->n_vocab)
            return BAD("prompt", "'prompt' token ids must be integers in [0, %d)", lim->n_vocab);
        r->prompt_ids[r->n_prompt_ids++] = (int32_t)t->valuedouble;
    }
    return AKV_OK;
}

static akv_status parse_prompt(const cJSON *o, const akv_api_limits *lim, akv_api_request *r,
                               akv_api_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (absent(v)) return BAD("prompt", "'prompt' is required");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 &&
        (cJSON_IsString(v->child) || cJSON_IsArray(v->child)))
        v = v->child; /* [string] or [[ids]]: one prompt */
    if (cJSON_IsString(v)) {
        r->prompt_len = strlen(v->valuestring);
        r->prompt = dup_n(v->valuestring, r->prompt_len);
        return r->prompt ? AKV_OK : AKV_ENOMEM;
    }
    if (cJSON_IsArray(v) && (!v->child || cJSON_IsNumber(v->child))) return parse_ids(v, lim, r, err);
    if (cJSON_IsArray(v))
        return BAD("prompt", "'prompt' holds %d prompts; this server takes one per request",
                   cJSON_GetArraySize(v));
    return BAD("prompt", "'prompt' must be a string, an array of one string, or token ids");
}

static akv_status parse_sampling(const cJSON *o, const akv_api_limits *lim, akv_api_request *r,
                                 akv_api_error *err) {
    akv_sample_params *sp = &r->sample;
    double x;
    akv_status st;
#define NUM(name, lo, hi, field)                                                                 \
    x = NAN;                                                                                     \
    if ((st = get_num(o, name, lo, hi, &x, err))) return st;                                     \
    if (!isnan(x)) field = (float)x;
    NUM("temperature", 0, 2, sp->temp);
    NUM("top_p", 0, 1, sp->top_p);
    if (sp->top_p == 0) sp->top_p = 1e-9f; /* keep only the most likely, as top_p -> 0 does */
    NUM("min_p", 0, 0.999999, sp->min_p);
    NUM("presence_penalty", -2, 2, sp->presence_penalty);
    NUM("frequency_penalty", -2, 2, sp->frequency_penalty);
    NUM("repeat_penalty", 1e-6, 1e6, sp->repeat_penalty);
#undef NUM
    x = NAN;
    if ((st = get_int(o, "top_k", 0, INT32_MAX, &x, err))) return st;
    if (!isnan(x)) sp->top_k = (int32_t)x;
    x = NAN;
    if ((st = get_int(o, "seed", -9007199254740992.0, 9007199254740992.0, &x, err))) return st;
    if (!isnan(x)) sp->seed = (uint64_t)(int64_t)x;
    r->seed_asked = !isnan(x);
    (void)lim;
    return AKV_OK;
}

/* The escapes cJSON would read differently than other parsers, found in the raw text: a
 * \u0000 (a C string ends there, so the text would be cut silently) and a surrogate escape
 * that is not half of a pair (cJSON refuses it without saying why). */
static akv_status scan_escapes(const char *b, size_t n, akv_api_error *err) {
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        if (!in_string) {
            in_string = b[i] == '"';
            continue;
        }
        if (b[i] == '"') {
            in_string = false;
            continue;
        }
        if (b[i] != '\\' || i + 1 >= n) continue;
        i++;
        if (b[i] != 'u' || i + 4 >= n) continue;
        unsigned cp = 0;
        int k = 1;
        for (; k <= 4; k++) {
            const char c = b[i + k];
            const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (v < 0) break;
            cp = cp * 16 + (unsigned)v;
        }
        if (k <= 4) continue; /* not an escape cJSON takes: its own error */
        const size_t at = i - 1;
        i += 4;
        if (cp == 0)
            return BAD(NULL, "a string holds \\u0000 (at byte %zu): NUL characters are not "
                             "accepted in text", at);
        if (cp >= 0xDC00 && cp <= 0xDFFF)
            return BAD(NULL, "a string holds a lone low surrogate \\u%04x (at byte %zu): a "
                             "character outside the BMP is written as a high and a low "
                             "surrogate escape", cp, at);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            unsigned lo = 0;
            bool pair = i + 6 < n && b[i + 1] == '\\' && b[i + 2] == 'u';
            for (int j = 3; pair && j <= 6; j++) {
                const char c = b[i + j];
                const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
                pair = v >= 0;
                lo = lo * 16 + (unsigned)(v < 0 ? 0 : v);
            }
            if (!pair || lo < 0xDC00 || lo > 0xDFFF)
                return BAD(NULL, "a string holds a lone high surrogate \\u%04x (at byte %zu): "
                                 "it must be followed by a low surrogate escape", cp, at);
            i += 6;
        }
    }
    return AKV_OK;
}

static int key_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Refuses an object that names a key twice, anywhere in the document: parsers disagree on
 * which one counts (cJSON the first, Python and most others the last), so a proxy that
 * validates the body could read another request than this server would. */
static akv_status check_duplicates(const cJSON *v, char *path, size_t n_path, akv_api_error *err) {
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) return AKV_OK;
    const cJSON *c;
    if (cJSON_IsObject(v)) {
        size_t n = 0, i = 0;
        cJSON_ArrayForEach(c, v) n++;
        if (n > 1) {
            const char **keys = akv__calloc(n, sizeof *keys);
            if (!keys) return AKV_ENOMEM;
            cJSON_ArrayForEach(c, v) keys[i++] = c->string ? c->string : "";
            qsort(keys, n, sizeof *keys, key_cmp);
            for (i = 1; i < n && strcmp(keys[i - 1], keys[i]); i++) {
            }
            if (i < n) {
                char param[64];
                snprintf(param, sizeof param, "%s%s%.40s", path, *path ? "." : "", keys[i]);
                akv__free(keys);
                return BAD(param, "the key '%s' appears twice%s%s: each key may appear once",
                           param, *path ? " in " : "", path);
            }
            akv__free(keys);
        }
    }
    size_t i = 0;
    cJSON_ArrayForEach(c, v) {
        const size_t len = strlen(path);
        if (cJSON_IsArray(v)) snprintf(path + len, n_path - len, "[%zu]", i);
        else snprintf(path + len, n_path - len, "%s%.40s", len ? "." : "", c->string ? c->string : "");
        akv_status st = check_duplicates(c, path, n_path, err);
        path[len] = '\0';
        if (st) return st;
        i++;
    }
    return AKV_OK;
}

/* logit_bias (OpenAI's): {"token id": bias in [-100, 100], ...}, at most AKV_MAX_LOGIT_BIAS;
 * the ids are checked against the vocabulary by the engine. */
static akv_status parse_logit_bias(const cJSON *o, akv_api_request *r, akv_api_error *err) {
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(o, "logit_bias");
    if (absent(lb)) return AKV_OK;
    if (!cJSON_IsObject(lb))
        return BAD("logit_bias", "'logit_bias' must be an object of token ids to biases");
    const int n = cJSON_GetArraySize(lb);
    if (n > AKV_MAX_LOGIT_BIAS)
        return BAD("logit_bias", "'logit_bias' holds %d tokens; at most %d", n, AKV_MAX_LOGIT_BIAS);
    if (n == 0) return AKV_OK;
    if (!(r->bias = akv__calloc((size_t)n, sizeof *r->bias))) return AKV_ENOMEM;
    const cJSON *e;
    cJSON_ArrayForEach(e, lb) {
        char *end = NULL;
        const long id = strtol(e->string ? e->string : "", &end, 10);
        if (!e->string || !*e->string || *end || id < 0 || id > INT32_MAX)
            return BAD("logit_bias", "'logit_bias' key '%.40s' is not a token id", e->string ? e->string : "");
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= -100 && e->valuedouble <= 100))
            return BAD("logit_bias", "'logit_bias' of token %ld must be a number in [-100, 100]", id);
        r->bias[r->n_bias++] = (akv_logit_bias){(int32_t)id, (float)e->valuedouble};
    }
    return AKV_OK;
}

static akv_status parse_logprobs(akv_api_kind kind, const cJSON *o, akv_api_request *r,
                                 akv_api_error *err);

akv_status akv_api_parse(akv_api_kind kind, const char *body, size_t n, const akv_api_limits *lim,
                         akv_api_request *r, akv_api_error *err) {
    memset(r, 0, sizeof *r);
    r->parallel_tool_calls = true; /* OpenAI's default */
    r->kind = kind;
    r->sample = lim->sample;
    r->max_tokens = lim->max_tokens_default;
    if (!akv__utf8_valid((const uint8_t *)body, n))
        return BAD(NULL, "the body is not valid UTF-8 (JSON text must be)");
    akv_status st = scan_escapes(body, n, err);
    if (st) return st;
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, n, &end, false);
    if (!o) {
        const size_t at = end && end >= body && end <= body + n ? (size_t)(end - body) : n;
        return BAD(NULL, "the body is not valid JSON (at byte %zu of %zu)", at, n);
    }
    for (const char *p = end; p < body + n; p++) {
        if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') continue;
        st = BAD(NULL, "bytes after the JSON value (from byte %zu): the body must be one JSON "
                       "object", (size_t)(p - body));
        goto done;
    }
    if (!cJSON_IsObject(o)) {
        st = BAD(NULL, "the body must be a JSON object");
        goto done;
    }
    char path[256] = "";
    if ((st = check_duplicates(o, path, sizeof path, err))) goto done;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (!absent(model) && !cJSON_IsString(model)) {
        st = BAD("model", "'model' must be a string");
        goto done;
    }
    if ((st = get_bool(o, "stream", &r->stream, err)) ||
        (st = get_bool(o, "ignore_eos", &r->ignore_eos, err)))
        goto done;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    if (!absent(so)) {
        if (!cJSON_IsObject(so)) {
            st = BAD("stream_options", "'stream_options' must be an object");
            goto done;
        }
        if (!r->stream) {
            st = BAD("stream_options", "'stream_options' is only allowed when 'stream' is true");
            goto done;
        }
        if ((st = get_bool(so, "include_usage", &r->include_usage, err))) goto done;
    }
    double x = NAN, y = NAN;
    if ((st = get_int(o, "max_tokens", 1, (double)lim->max_tokens_limit, &x, err)) ||
        (st = get_int(o, "max_completion_tokens", 1, (double)lim->max_tokens_limit, &y, err)))
        goto done;
    if (!isnan(y)) r->max_tokens = (uint32_t)y;
    else if (!isnan(x)) r->max_tokens = (uint32_t)x;
    r->max_tokens_asked = !isnan(x) || !isnan(y);
    x = NAN;
    if ((st = get_int(o, "n", 1, 1e300, &x, err))) goto done;
    if (!isnan(x) && x > AKV_API_MAX_N) {
        st = BAD("n", "'n' is %g; this server answers with at most %d choices", x, AKV_API_MAX_N);
        goto done;
    }
    r->n = isnan(x) ? 1 : (uint32_t)x;
    x = NAN;
    if ((st = get_int(o, "best_of", 1, 1e300, &x, err))) goto done;
    if (!isnan(x) && x != 1) {
        st = BAD("best_of", "'best_of' must be 1");
        goto done;
    }
    if ((st = parse_logprobs(kind, o, r, err)) ||
        (st = parse_logit_bias(o, r, err)) ||
        (kind == AKV_API_CHAT && (st = parse_tools(o, r, err))) ||
        (kind == AKV_API_COMPLETION && (st = refuse_if_set(o, "tools", "tools are a chat's", err))) ||
        (kind == AKV_API_COMPLETION && (st = refuse_if_set(o, "tool_choice", "tools are a chat's", err))) ||
        (st = refuse_if_set(o, "functions", "no function calls", err)) ||
        (st = refuse_if_set(o, "function_call", "no function calls", err)) ||
        (kind == AKV_API_CHAT && (st = refuse_if_set(o, "echo", "a chat is not echoed", err))) ||
        (kind == AKV_API_COMPLETION && (st = get_bool(o, "echo", &r->echo, err))) ||
        (st = refuse_if_set(o, "suffix", "no insertion", err)))
        goto done;
    /* kv_tier (ours): "exact" keeps the history exact; the server's tier (--kv-tier) or
     * "auto" is what every request gets */
    const cJSON *kt = cJSON_GetObjectItemCaseSensitive(o, "kv_tier");
    if (!absent(kt)) {
        const char *tier = akv_repr_name(lim->kv_tier);
        if (!cJSON_IsString(kt) || (strcmp(kt->valuestring, "exact") && strcmp(kt->valuestring, "auto") &&
                                    strcmp(kt->valuestring, tier))) {
            st = lim->kv_tier == AKV_REPR_EXACT
                     ? BAD("kv_tier", "'kv_tier' may be \"exact\" or \"auto\": this server keeps "
                                      "every history exact (--kv-tier)")
                     : BAD("kv_tier", "'kv_tier' may be \"exact\", \"%s\" or \"auto\": this server "
                                      "keeps older history in %s (--kv-tier)", tier, tier);
            goto done;
        }
        r->kv_exact = !strcmp(kt->valuestring, "exact");
        r->kv_compact = lim->kv_tier != AKV_REPR_EXACT && !strcmp(kt->valuestring, tier);
    }
    /* cache_salt (vLLM's): requests share cached prompt K/V only with their own salt */
    const cJSON *salt = cJSON_GetObjectItemCaseSensitive(o, "cache_salt");
    if (!absent(salt)) {
        if (!cJSON_IsString(salt) || !*salt->valuestring || strlen(salt->valuestring) > 1024) {
            st = BAD("cache_salt", "'cache_salt' must be a non-empty string of at most 1024 bytes");
            goto done;
        }
        const size_t len = strlen(salt->valuestring);
        const uint64_t h = akv_hash64_final(akv_hash64_add(akv_hash64_init(), salt->valuestring, len), len);
        r->cache_salt = h ? h : 1; /* 0 is the unsalted default */
    }
    /* kv_retention (ours): how long the conversation's K/V is kept once it is idle */
    const cJSON *kr = cJSON_GetObjectItemCaseSensitive(o, "kv_retention");
    if (!absent(kr)) {
        static const char *const names[] = {"low", "normal", "high"};
        int k = 0;
        while (k < 3 && !(cJSON_IsString(kr) && !strcmp(kr->valuestring, names[k]))) k++;
        if (k == 3) {
            st = BAD("kv_retention", "'kv_retention' is \"low\", \"normal\" or \"high\"");
            goto done;
        }
        r->retention = (int8_t)(k - 1);
    }
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(o, "response_format");
    if (!absent(rf) && r->tool_forced) {
        const cJSON *t = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text")) {
            st = BAD("response_format", "'response_format' with a required or named "
                                        "'tool_choice': the answer is the call");
            goto done;
        }
    } else if (!absent(rf)) {
        const cJSON *t = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
        r->json_object = cJSON_IsString(t) && !strcmp(t->valuestring, "json_object");
        const bool schema = cJSON_IsString(t) && !strcmp(t->valuestring, "json_schema");
        if (!r->json_object && !schema && (!cJSON_IsString(t) || strcmp(t->valuestring, "text"))) {
            st = BAD("response_format", "'response_format': {\"type\": \"text\"}, "
                                        "{\"type\": \"json_object\"} or {\"type\": \"json_schema\", ...}");
            goto done;
        }
        const cJSON *js = schema ? cJSON_GetObjectItemCaseSensitive(rf, "json_schema") : NULL;
        const cJSON *sch = cJSON_IsObject(js) ? cJSON_GetObjectItemCaseSensitive(js, "schema") : NULL;
        if (schema && !cJSON_IsObject(sch)) {
            st = BAD("response_format", "'response_format': json_schema needs {\"json_schema\": "
                                        "{\"name\": ..., \"schema\": {...}}}");
            goto done;
        }
        char why[256] = "";
        if (schema && (st = akv_srv_schema_compile(sch, &r->schema, why, sizeof why))) {
            if (st == AKV_EINVAL) st = BAD("response_format", "'response_format.json_schema.schema': %s", why);
            goto done;
        }
    }
    if (r->echo && r->stream) {
        st = BAD("echo", "'echo' is answered whole: set 'stream' false");
        goto done;
    }
    if ((st = parse_sampling(o, lim, r, err)) || (st = parse_stop(o, r, err))) goto done;
    st = kind == AKV_API_CHAT ? parse_messages(o, r, err) : parse_prompt(o, lim, r, err);
done:
    cJSON_Delete(o);
    return st;
}

/* ---- log-probabilities ---------------------------------------------------------------------- */

/* Chat: logprobs (true/false) and top_logprobs (0..20, only with logprobs). Completion:
 * logprobs, a number 0..20 of alternatives (null: none). */
static akv_status parse_logprobs(akv_api_kind kind, const cJSON *o, akv_api_request *r,
                                 akv_api_error *err) {
    double x = NAN;
    akv_status st;
    if (kind == AKV_API_CHAT) {
        if ((st = get_bool(o, "logprobs", &r->logprobs, err)) ||
            (st = get_int(o, "top_logprobs", 0, AKV_API_MAX_TOP_LOGPROBS, &x, err)))
            return st;
        if (!isnan(x) && x > 0 && !r->logprobs)
            return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
        r->top_logprobs = isnan(x) ? 0 : (uint32_t)x;
        return AKV_OK;
    }
    if ((st = get_int(o, "logprobs", 0, AKV_API_MAX_TOP_LOGPROBS, &x, err))) return st;
    r->logprobs = !isnan(x);
    r->top_logprobs = isnan(x) ? 0 : (uint32_t)x;
    return AKV_OK;
}

void akv_api_token_logprobs(const float *logits, uint32_t n_vocab, int32_t token, uint32_t k,
                            float *lp, int32_t *top_id, float *top_lp) {
    double m = -INFINITY, sum = 0;
    for (uint32_t i = 0; i < n_vocab; i++) m = logits[i] > m ? logits[i] : m;
    for (uint32_t i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - m);
    const double lse = m + log(sum);
    *lp = (float)((double)logits[token] - lse);
    if (k > AKV_API_MAX_TOP_LOGPROBS) k = AKV_API_MAX_TOP_LOGPROBS;
    if (k > n_vocab) k = n_vocab;
    /* the k best so far, best first; a token goes in where it beats one (ids rise in the
     * scan, so an equal one stays behind: the lower id first) */
    uint32_t have = 0;
    for (uint32_t i = 0; i < n_vocab && k; i++) {
        if (have == k && !(logits[i] > logits[top_id[k - 1]])) continue;
        uint32_t at = have < k ? have++ : k - 1;
        while (at > 0 && logits[i] > logits[top_id[at - 1]]) {
            top_id[at] = top_id[at - 1];
            at--;
        }
        top_id[at] = (int32_t)i;
    }
    for (uint32_t j = 0; j < k; j++) top_lp[j] = (float)((double)logits[top_id[j]] - lse);
}

/* A log-probability as JSON takes it: -inf (a token the logits rule out) as -9999, as vLLM
 * writes it. */
static double lp_num(float x) {
    return isfinite(x) ? (double)x : -9999.0;
}

/* A piece as a string: invalid UTF-8 (a piece that splits a character) replaced by U+FFFD. */
static cJSON *piece_str(const akv_api_lp_token *t) {
    uint8_t *buf = akv__malloc(3 * t->n + 1);
    if (!buf) return NULL;
    const size_t n = akv__utf8_sanitize(t->piece, t->n, buf);
    buf[n] = 0;
    cJSON *j = cJSON_CreateString((const char *)buf);
    akv__free(buf);
    return j;
}

/* {"token", "logprob", "bytes"} of a chat answer's logprobs. */
static cJSON *chat_lp_token(const akv_api_lp_token *t) {
    cJSON *o = cJSON_CreateObject(), *b = cJSON_CreateArray();
    cJSON_AddItemToObject(o, "token", piece_str(t));
    cJSON_AddNumberToObject(o, "logprob", lp_num(t->logprob));
    for (size_t i = 0; i < t->n; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber(t->piece[i]));
    cJSON_AddItemToObject(o, "bytes", b);
    return o;
}

/* The choice's "logprobs": chat {"content": [...]}, completion {"tokens", "token_logprobs",
 * "top_logprobs" (the alternatives and the token itself, as OpenAI's legacy API answers),
 * "text_offset"}. */
static cJSON *logprobs_json(bool chat, const akv_api_logprobs *lp) {
    cJSON *o = cJSON_CreateObject();
    if (chat) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (size_t i = 0; i < lp->n; i++) {
            const akv_api_logprob *x = &lp->items[i];
            cJSON *t = chat_lp_token(&x->tok), *top = cJSON_CreateArray();
            for (uint32_t j = 0; j < x->n_top; j++) cJSON_AddItemToArray(top, chat_lp_token(&x->top[j]));
            cJSON_AddItemToObject(t, "top_logprobs", top);
            cJSON_AddItemToArray(content, t);
        }
        return o;
    }
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs"),
          *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    size_t off = lp->text_offset;
    for (size_t i = 0; i < lp->n; i++) {
        const akv_api_logprob *x = &lp->items[i];
        cJSON_AddItemToArray(toks, piece_str(&x->tok));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += x->no_text ? 0 : x->tok.n;
        if (x->none) {
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp_num(x->tok.logprob)));
        cJSON *alt = cJSON_CreateObject();
        for (uint32_t j = 0; j <= x->n_top; j++) {
            const akv_api_lp_token *t = j < x->n_top ? &x->top[j] : &x->tok;
            cJSON *key = piece_str(t);
            if (key && !cJSON_GetObjectItemCaseSensitive(alt, key->valuestring))
                cJSON_AddNumberToObject(alt, key->valuestring, lp_num(t->logprob));
            cJSON_Delete(key);
        }
        cJSON_AddItemToArray(tops, alt);
    }
    return o;
}

/* ---- responses ------------------------------------------------------------------------------ */

/* cJSON strings are NUL-terminated: a text with a NUL byte is cut there (tokenizers never
 * produce one from a prompt that had none). */
static cJSON *str_n(const char *s, size_t n) {
    char *t = dup_n(s ? s : "", s ? n : 0);
    if (!t) return NULL;
    cJSON *j = cJSON_CreateString(t);
    akv__free(t);
    return j;
}

char *akv_api_json_text(cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    char *d = s ? akv__strdup(s) : NULL;
    cJSON_free(s);
    return d;
}

char *akv_api_error_json(const akv_api_error *err) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    if (!e) return akv_api_json_text(o);
    cJSON_AddStringToObject(e, "message", err->message);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : "invalid_request_error");
    if (err->param[0]) cJSON_AddStringToObject(e, "param", err->param);
    else cJSON_AddNullToObject(e, "param");
    if (err->code) cJSON_AddStringToObject(e, "code", err->code);
    else cJSON_AddNullToObject(e, "code");
    return akv_api_json_text(o);
}

static void add_usage(cJSON *o, const akv_api_usage *u) {
    cJSON *j = cJSON_AddObjectToObject(o, "usage");
    if (!j) return;
    cJSON_AddNumberToObject(j, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(j, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(j, "total_tokens", (double)u->prompt_tokens + u->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(j, "prompt_tokens_details");
    if (d) cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
}

static cJSON *envelope(const char *object, const char *id, long long created, const char *model) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    return o;
}

/* tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}] (a streamed
 * delta's pieces: akv_api_tool_delta_json). */
static cJSON *tool_calls_json(const akv_api_tool_call *calls, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(a, c);
        cJSON_AddStringToObject(c, "id", calls[i].id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", calls[i].name);
        cJSON_AddStringToObject(f, "arguments", calls[i].arguments);
    }
    return a;
}

char *akv_api_answer_json(akv_api_kind kind, const char *id, long long created,
                          const char *model, const akv_api_choice *ch, uint32_t n_choices,
                          const akv_api_usage *usage) {
    const bool chat = kind == AKV_API_CHAT;
    cJSON *o = envelope(chat ? "chat.completion" : "text_completion", id, created, model);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (uint32_t i = 0; i < n_choices; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, c);
        cJSON_AddNumberToObject(c, "index", i);
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            if (ch[i].text) cJSON_AddItemToObject(m, "content", str_n(ch[i].text, ch[i].n_text));
            else cJSON_AddNullToObject(m, "content");
            if (ch[i].n_calls) cJSON_AddItemToObject(m, "tool_calls", tool_calls_json(ch[i].calls, ch[i].n_calls));
        } else {
            cJSON_AddItemToObject(c, "text", str_n(ch[i].text, ch[i].n_text));
        }
        if (ch[i].lp) cJSON_AddItemToObject(c, "logprobs", logprobs_json(chat, ch[i].lp));
        else cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddStringToObject(c, "finish_reason", ch[i].finish);
    }
    add_usage(o, usage);
    return akv_api_json_text(o);
}

char *akv_api_chunk_json(akv_api_kind kind, const char *id, long long created, const char *model,
                         uint32_t index, bool first, const char *text, size_t n_text,
                         const char *finish, const akv_api_usage *usage,
                         const akv_api_logprobs *lp) {
    const bool chat = kind == AKV_API_CHAT;
    cJSON *o = envelope(chat ? "chat.completion.chunk" : "text_completion", id, created, model);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    if (text || finish) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, c);
        cJSON_AddNumberToObject(c, "index", index);
        if (chat) {
            cJSON *d = cJSON_AddObjectToObject(c, "delta");
            if (first) cJSON_AddStringToObject(d, "role", "assistant");
            if (text) cJSON_AddItemToObject(d, "content", str_n(text, n_text));
        } else {
            cJSON_AddItemToObject(c, "text", str_n(text ? text : "", text ? n_text : 0));
        }
        if (lp) cJSON_AddItemToObject(c, "logprobs", logprobs_json(chat, lp));
        else cJSON_AddNullToObject(c, "logprobs");
        if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
        else cJSON_AddNullToObject(c, "finish_reason");
    }
    if (usage) add_usage(o, usage);
    return akv_api_json_text(o);
}

char *akv_api_tool_delta_json(const char *id, long long created, const char *model,
                              uint32_t index, uint32_t call, const char *call_id, const char *name,
                              size_t name_n, const char *args, size_t args_n) {
    cJSON *o = envelope("chat.completion.chunk", id, created, model);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", index);
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    cJSON *calls = cJSON_AddArrayToObject(d, "tool_calls"), *tc = cJSON_CreateObject();
    cJSON_AddItemToArray(calls, tc);
    cJSON_AddNumberToObject(tc, "index", call);
    cJSON *nm = call_id ? str_n(name, name_n) : NULL, *a = str_n(args, args_n);
    if (call_id) {
        cJSON_AddStringToObject(tc, "id", call_id);
        cJSON_AddStringToObject(tc, "type", "function");
    }
    cJSON *f = cJSON_AddObjectToObject(tc, "function");
    const bool whole = (!call_id || nm) && a;
    if (nm) cJSON_AddItemToObject(f, "name", nm);
    if (a) cJSON_AddItemToObject(f, "arguments", a);
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    return whole ? akv_api_json_text(o) : (cJSON_Delete(o), NULL);
}

char *akv_api_models_json(const char *model, long long created, uint64_t max_context) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
    cJSON_AddItemToArray(data, m);
    cJSON_AddStringToObject(m, "id", model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "activekv");
    cJSON_AddNumberToObject(m, "max_model_len", (double)max_context);
    return akv_api_json_text(o);
}
