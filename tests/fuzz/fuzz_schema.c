/*
 * fuzz_schema.c — libFuzzer target for structured output: the JSON Schema compiler
 * (server/schema.h) and the state machine that follows a compiled schema (akv/json_schema.h).
 * The input is a schema's JSON, then (after a NUL byte) bytes to feed. Checks: no crash or
 * sanitizer report; a refused schema says why; the machine, fed the bytes one at a time, never
 * stands at a dead end (a prefix that is not complete and that no byte continues: the first
 * 64 prefixes are tried with every byte); a prefix it calls complete parses as JSON (cJSON;
 * where no \u escape could trip cJSON's own surrogate rules); a piece fed whole and byte by
 * byte ends in the same state.
 *
 * Build and run (clang):
 *   CC=clang AKV_CMAKE_ARGS="-DAKV_FUZZ=ON -DAKV_CUDA=OFF" bash scripts/build build-fuzz
 *   build-fuzz/tests/fuzz/fuzz_schema -max_total_time=300 -max_len=8192
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "akv/json_schema.h"
#include "akv/log.h"
#include "server/schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    const uint8_t *nul = memchr(data, 0, size);
    const size_t n_s = nul ? (size_t)(nul - data) : size;
    cJSON *j = cJSON_ParseWithLength((const char *)data, n_s);
    if (!j) return 0;
    char why[256] = "";
    akv_srv_schema *sch = NULL;
    const akv_status st = akv_srv_schema_compile(j, &sch, why, sizeof why);
    cJSON_Delete(j);
    if (st != AKV_OK) {
        if (!why[0] && st != AKV_ENOMEM) abort(); /* a refusal names what */
        return 0;
    }
    const akv_json_schema *v = akv_srv_schema_view(sch);
    const uint8_t *text = nul ? nul + 1 : NULL;
    const size_t n = nul ? size - n_s - 1 : 0;
    akv_js_state s, whole;
    akv_js_init(&s, v);
    akv_js_init(&whole, v);
    size_t taken = 0;
    for (size_t i = 0; i < n; i++) {
        if (i < 64 && !akv_js_complete(&s)) { /* some byte goes on */
            bool any = false;
            for (int c = 0; c < 256 && !any; c++) {
                akv_js_state q = s;
                const uint8_t b = (uint8_t)c;
                any = akv_js_feed(&q, &b, 1);
            }
            if (!any) abort();
        }
        akv_js_state q = s;
        if (!akv_js_feed(&q, text + i, 1)) break;
        s = q, taken = i + 1;
        if (akv_js_complete(&s) && !memchr(text, '\\', taken)) {
            cJSON *p = cJSON_ParseWithLength((const char *)text, taken);
            if (!p) abort(); /* complete, yet not JSON */
            cJSON_Delete(p);
        }
    }
    if (!akv_js_feed(&whole, text, taken) || memcmp(&whole, &s, sizeof s) != 0) abort();
    akv_srv_schema_free(sch);
    return 0;
}
