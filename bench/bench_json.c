/* bench_json.c (bench) — the cost of a JSON answer's mask (response_format json_object and
 * json_schema) over the default model's vocabulary, in three places (inside a string, after a
 * string, inside an array of numbers), 50 masks each: with the JSON object machine
 * (akv/json_prefix.h) and with a schema's (akv/json_schema.h, a schema of the three, compiled
 * as the server compiles it); the time of a mask and how many tokens it allows, by the
 * reference (every piece fed to a copy of the state) and by the trie walk over the pieces in
 * byte order (src/engine/mask.h). Then a whole answer under the schema, token by token as the
 * engine makes it: each step's mask through the request's cache of recent states, against
 * the reference at every step. Host only; skips without the default model. Baseline, the same
 * run: the loop over the pieces alone (each looked up and its bytes summed), 50 times; each
 * mask's time is also given as a ratio to it. Appends markdown to $AKV_BENCH_OUT. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/gguf.h"
#include "akv/json_prefix.h"
#include "akv/json_schema.h"
#include "akv/tok.h"
#include "core/clock.h"
#include "engine/mask.h"
#include "model_path.h"
#include "server/schema.h"

static const uint8_t *bench_piece(const void *tok, int32_t id, size_t *n) {
    return akv_tok_token_piece(tok, id, n);
}
static bool feed_object(void *state, const uint8_t *bytes, size_t n) {
    return akv_json_prefix_feed(state, bytes, n);
}
static bool feed_schema(void *state, const uint8_t *bytes, size_t n) {
    return akv_js_feed(state, bytes, n);
}

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
    akv__vocab vocab = {.piece = bench_piece, .user = tok, .n_vocab = (uint32_t)V};
    uint64_t *bits = malloc((V + 63) / 64 * sizeof *bits);
    if (!bits || akv__vocab_order(&vocab)) return 1;
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
             "pieces alone, %.3f ms (checksum %zu).\n\n| machine | state | allowed | ms a mask, "
             "reference | / baseline | ms a mask, trie | / baseline |\n"
             "|---|---|---|---|---|---|---|\n", V, base_ms, sum % 1000);
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
            const akv__mask_machine mm = m ? (akv__mask_machine){sizeof js, feed_schema}
                                           : (akv__mask_machine){sizeof p, feed_object};
            const void *state = m ? (const void *)&js : &p;
            const double t1 = akv_clock_s();
            uint32_t trie_allowed = 0;
            for (int r = 0; r < reps; r++) trie_allowed = akv__mask_fill(&mm, state, &vocab, bits);
            const double trie_ms = (akv_clock_s() - t1) * 1e3 / reps;
            if (trie_allowed != allowed / reps) {
                fprintf(stderr, "bench_json: the trie allows %u, the reference %zu\n", trie_allowed, allowed / reps);
                return 1;
            }
            snprintf(line, sizeof line, "| %s | %s | %zu | %.2f | %.1f | %.3f | %.2f |\n", m ? "schema" : "object",
                     states[k][0], allowed / reps, ms, ms / base_ms, trie_ms, trie_ms / base_ms);
            fputs(line, stdout);
            if (out) fputs(line, out);
        }
    /* a whole answer under the schema, token by token through the cache */
    {
        const char *answer = "{\"name\": \"Felix the cat, who lives in a small house by the river "
                             "and likes long naps in the sun\", \"a\": [1, 2.5, -3, 42, 7e3, 0.125]}";
        akv_tok_ids ids = {0};
        if (akv_tok_encode(tok, answer, strlen(answer), 0, &ids)) return 1;
        akv__mask_cache cache;
        if (akv__mask_cache_init(&cache, (uint32_t)V, sizeof(akv_js_state))) return 1;
        const akv__mask_machine mm = {sizeof(akv_js_state), feed_schema};
        akv_js_state js;
        akv_js_init(&js, akv_srv_schema_view(sch));
        double cached_s = 0, ref_s = 0;
        for (size_t t = 0; t < ids.n_ids; t++) {
            double t0 = akv_clock_s();
            const uint64_t *got = akv__mask_get(&cache, &mm, &js, &vocab);
            cached_s += akv_clock_s() - t0;
            t0 = akv_clock_s();
            akv__mask_ref(&mm, &js, &vocab, bits);
            ref_s += akv_clock_s() - t0;
            if (memcmp(got, bits, (V + 63) / 64 * sizeof *bits)) {
                fprintf(stderr, "bench_json: the cached mask differs from the reference at token %zu\n", t);
                return 1;
            }
            size_t n = 0;
            const uint8_t *piece = akv_tok_token_piece(tok, ids.ids[t], &n);
            if (!(got[ids.ids[t] / 64] >> (ids.ids[t] % 64) & 1) || !akv_js_feed(&js, piece, n)) {
                fprintf(stderr, "bench_json: the answer's token %zu is not allowed\n", t);
                return 1;
            }
        }
        snprintf(line, sizeof line,
                 "\nA whole answer under the schema (%zu tokens, %zu bytes), each step's mask through "
                 "the request's cache of %d recent states: %.3f ms a token (%llu hits, %llu misses), "
                 "against %.3f ms a token by the reference; the same bits at every step.\n",
                 ids.n_ids, strlen(answer), AKV__MASK_CACHE, cached_s * 1e3 / ids.n_ids,
                 (unsigned long long)cache.hits, (unsigned long long)cache.misses, ref_s * 1e3 / ids.n_ids);
        fputs(line, stdout);
        if (out) fputs(line, out);
        akv__mask_cache_free(&cache);
        akv_tok_ids_free(&ids);
    }
    akv_srv_schema_free(sch);
    akv__vocab_free(&vocab);
    free(bits);
    if (out) fclose(out);
    akv_tok_destroy(tok);
    akv_gguf_close(g);
    return 0;
}
