/* bench_json.c (bench) — the cost of a JSON answer's mask (response_format json_object and
 * json_schema): every token's piece of the default model's vocabulary tried against the prefix
 * state, as each constrained step does, in three places (inside a string, after a string,
 * inside an array of numbers), 50 masks each: with the JSON object machine (akv/json_prefix.h)
 * and with a schema's (akv/json_schema.h, a schema of the three, compiled as the server
 * compiles it); the time of a mask and how many tokens it allows. Host only; skips without the
 * default model. Baseline, the same run: the loop over the pieces alone (each looked up and
 * its bytes summed), 50 times; each mask's time is also given as a ratio to it. Appends
 * markdown to $AKV_BENCH_OUT. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/gguf.h"
#include "akv/json_prefix.h"
#include "akv/json_schema.h"
#include "akv/tok.h"
#include "core/clock.h"
#include "model_path.h"
#include "server/schema.h"

int main(void) {
    char path[4096];
    if (!test_model_path(path, sizeof path, 1)) {
        printf("skip: no default model (%s)\n", path);
        return 77;
    }
    akv_gguf *g = NULL;
    akv_tok *tok = NULL;
    if (akv_gguf_open(path, &g) || akv_tok_create_from_gguf(g, NULL, &tok)) {
        fprintf(stderr, "bench_json: %s does not load\n", path);
        return 1;
    }
    const size_t V = akv_tok_n_tokens(tok);
    const char *out_path = getenv("AKV_BENCH_OUT");
    FILE *out = out_path && *out_path ? fopen(out_path, "a") : NULL;
    const int reps = 50;
    size_t sum = 0;
    const double b0 = akv_clock_s();
    for (int r = 0; r < reps; r++)
        for (size_t id = 0; id < V; id++) {
            size_t n = 0;
            const uint8_t *piece = akv_tok_token_piece(tok, (int32_t)id, &n);
            for (size_t i = 0; piece && i < n; i++) sum += piece[i];
        }
    const double base_ms = (akv_clock_s() - b0) * 1e3 / reps;
    char line[512];
    snprintf(line, sizeof line,
             "\n### JSON answers: the mask over %zu pieces (one thread)\n\nBaseline: a pass over the "
             "pieces alone, %.3f ms (checksum %zu).\n\n| machine | state | allowed | ms a mask | / baseline |\n"
             "|---|---|---|---|---|\n", V, base_ms, sum % 1000);
    fputs(line, stdout);
    if (out) fputs(line, out);
    const char *states[3][2] = {{"inside a string", "{\"name\": \"Fel"},
                                {"after a string", "{\"name\": \"Felix\""},
                                {"inside an array of numbers", "{\"a\": [1, 2"}};
    cJSON *sj = cJSON_Parse("{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, "
                            "\"a\": {\"type\": \"array\", \"items\": {\"type\": \"number\"}}}}");
    akv_srv_schema *sch = NULL;
    char why[256];
    if (!sj || akv_srv_schema_compile(sj, &sch, why, sizeof why)) return 1;
    cJSON_Delete(sj);
    for (int m = 0; m < 2; m++)
        for (int k = 0; k < 3; k++) {
            akv_json_prefix p;
            akv_js_state js;
            akv_json_prefix_init(&p, true);
            akv_js_init(&js, akv_srv_schema_view(sch));
            const uint8_t *at = (const uint8_t *)states[k][1];
            if (m ? !akv_js_feed(&js, at, strlen(states[k][1])) : !akv_json_prefix_feed(&p, at, strlen(states[k][1])))
                return 1;
            size_t allowed = 0;
            const double t0 = akv_clock_s();
            for (int r = 0; r < reps; r++)
                for (size_t id = 0; id < V; id++) {
                    size_t n = 0;
                    const uint8_t *piece = akv_tok_token_piece(tok, (int32_t)id, &n);
                    if (!piece || !n) continue;
                    if (m) {
                        akv_js_state q = js;
                        allowed += akv_js_feed(&q, piece, n);
                    } else {
                        akv_json_prefix q = p;
                        allowed += akv_json_prefix_feed(&q, piece, n);
                    }
                }
            const double ms = (akv_clock_s() - t0) * 1e3 / reps;
            snprintf(line, sizeof line, "| %s | %s | %zu | %.2f | %.1f |\n", m ? "schema" : "object",
                     states[k][0], allowed / reps, ms, ms / base_ms);
            fputs(line, stdout);
            if (out) fputs(line, out);
        }
    akv_srv_schema_free(sch);
    if (out) fclose(out);
    akv_tok_destroy(tok);
    akv_gguf_close(g);
    return 0;
}
