/*
 * fuzz_api.c — libFuzzer target for the server's request parser (src/server/api.c): byte 0
 * picks the endpoint and the limits, the rest is the body. Checks: no crash or sanitizer
 * report; a refusal is a 400 with a message, and its error JSON parses back; an accepted
 * request keeps every limit (max_tokens within [1, limit], at most 4 non-empty stop strings,
 * prompt ids below n_vocab, at least one message of a known role) and its sampling params are
 * ones the sampler takes; the answer and chunk JSON built from its text parse back and carry
 * the text unchanged.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "akv/sample.h"
#include "core/alloc.h"
#include "server/api.h"

#define CHECK(c)                                                                      \
    do {                                                                              \
        if (!(c)) {                                                                   \
            fprintf(stderr, "fuzz_api: check failed: %s (line %d)\n", #c, __LINE__); \
            abort();                                                                  \
        }                                                                             \
    } while (0)

/* json parses, and its string at key1.key2... (when given) equals want[n]. */
static void check_json(char *json, const char *want, size_t n, const char *path[]) {
    CHECK(json);
    cJSON *o = cJSON_Parse(json);
    CHECK(o);
    const cJSON *v = o;
    for (int i = 0; path && path[i]; i++) {
        if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, atoi(path[i]));
        else v = cJSON_GetObjectItemCaseSensitive(v, path[i]);
        CHECK(v);
    }
    if (want) {
        CHECK(cJSON_IsString(v));
        /* text with a NUL byte comes back cut at it, as cJSON's strings are C strings */
        size_t k = strlen(v->valuestring);
        CHECK(k <= n && !memcmp(v->valuestring, want, k));
        CHECK(k == n || want[k] == '\0');
    }
    cJSON_Delete(o);
    akv__free(json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const akv_api_kind kind = data[0] & 1 ? AKV_API_COMPLETION : AKV_API_CHAT;
    akv_api_limits lim = {.max_tokens_default = 16,
                          .max_tokens_limit = data[0] & 2 ? 4096 : 1,
                          .n_vocab = data[0] & 4 ? 49152 : 2,
                          .sample = akv_sample_default_params()};
    akv_api_request r;
    akv_api_error err;
    memset(&err, 0, sizeof err);
    akv_status st = akv_api_parse(kind, (const char *)data + 1, size - 1, &lim, &r, &err);
    CHECK(st == AKV_OK || st == AKV_EINVAL || st == AKV_ENOMEM);
    if (st == AKV_EINVAL) {
        CHECK(err.status == 400 && err.type && err.message[0]);
        const char *msg[] = {"error", "message", NULL};
        check_json(akv_api_error_json(&err), err.message, strlen(err.message), msg);
    }
    if (st == AKV_OK) {
        CHECK(r.kind == kind);
        CHECK(r.max_tokens >= 1 && r.max_tokens <= (r.max_tokens_asked ? lim.max_tokens_limit
                                                                         : lim.max_tokens_default));
        CHECK(r.n_stop <= AKV_API_MAX_STOP);
        for (uint32_t i = 0; i < r.n_stop; i++) CHECK(r.stop[i] && r.stop[i][0]);
        akv_sampler *sm = NULL;
        CHECK(akv_sampler_create(&r.sample, lim.n_vocab, &sm) == AKV_OK);
        akv_sampler_destroy(sm);
        const char *text = "";
        size_t n_text = 0;
        if (kind == AKV_API_CHAT) {
            CHECK(r.n_msgs >= 1 && r.msgs && !r.prompt && !r.prompt_ids);
            for (size_t i = 0; i < r.n_msgs; i++) {
                const char *role = r.msgs[i].role;
                CHECK(role && r.msgs[i].content);
                CHECK(!strcmp(role, "system") || !strcmp(role, "user") ||
                      !strcmp(role, "assistant") || !strcmp(role, "tool"));
            }
            /* the messages (and tools) for the template: JSON arrays, one object a message */
            cJSON *mj = r.messages_json ? cJSON_Parse(r.messages_json) : NULL;
            CHECK(cJSON_IsArray(mj) && (size_t)cJSON_GetArraySize(mj) == r.n_msgs);
            cJSON_Delete(mj);
            cJSON *tj = r.tools_json ? cJSON_Parse(r.tools_json) : NULL;
            CHECK(!r.tools_json || (cJSON_IsArray(tj) && cJSON_GetArraySize(tj) > 0));
            cJSON_Delete(tj);
            CHECK(!r.tool_forced || r.schema); /* a forced call is held by a schema */
            text = r.msgs[r.n_msgs - 1].content, n_text = strlen(text);
        } else {
            CHECK(!r.msgs && (r.prompt != NULL) != (r.prompt_ids != NULL));
            for (uint32_t i = 0; i < r.n_prompt_ids; i++)
                CHECK(r.prompt_ids[i] >= 0 && r.prompt_ids[i] < lim.n_vocab);
            if (r.prompt) text = r.prompt, n_text = r.prompt_len;
        }
        /* the text back out, as an answer and as a chunk */
        akv_api_usage u = {1, 2, 0};
        const char *chat_path[] = {"choices", "0", "message", "content", NULL};
        const char *cmpl_path[] = {"choices", "0", "text", NULL};
        const char *delta_path[] = {"choices", "0", "delta", "content", NULL};
        const akv_api_choice one = {text, n_text, "stop", NULL, NULL, 0};
        check_json(akv_api_answer_json(kind, "id-1", 1, "m\"odel", &one, 1, &u), text, n_text,
                   kind == AKV_API_CHAT ? chat_path : cmpl_path);
        check_json(akv_api_chunk_json(kind, "id-1", 1, "model", 0, false, text, n_text, NULL, NULL, NULL),
                   text, n_text, kind == AKV_API_CHAT ? delta_path : cmpl_path);
        check_json(akv_api_chunk_json(kind, "id-1", 1, "model", 0, false, NULL, 0, NULL, &u, NULL), NULL,
                   0, NULL);
        /* the text's bytes as token pieces (any bytes: split characters, NULs) in logprobs */
        akv_api_logprob items[3];
        memset(items, 0, sizeof items);
        for (size_t i = 0; i < 3; i++) {
            const size_t at = n_text * i / 3, end = n_text * (i + 1) / 3;
            items[i].tok = (akv_api_lp_token){(const uint8_t *)text + at, end - at, -(float)i};
            items[i].n_top = (uint32_t)(i + 1);
            for (uint32_t j = 0; j <= i; j++) items[i].top[j] = items[j].tok;
        }
        items[2].tok.logprob = -INFINITY;
        const akv_api_logprobs lp = {items, text ? 3 : 0, 5};
        const akv_api_choice with_lp = {text, n_text, "stop", &lp, NULL, 0};
        check_json(akv_api_answer_json(kind, "id-1", 1, "m", &with_lp, 1, &u), text, n_text,
                   kind == AKV_API_CHAT ? chat_path : cmpl_path);
    }
    akv_api_request_free(&r);
    return 0;
}
