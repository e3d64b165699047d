/* test_model_run.c — the default model (SmolLM2-135M-Instruct, Q4_1) on the host backend, with
 * its weights in their blocks (the default, 8-bit activations) and widened to f32: its
 * configuration as the file states it, the first layers and the logits against the float64
 * oracle (f32 storage: float rounding only; native: within what 8-bit activations allow, and
 * close to the f32 storage), greedy generation deterministic and sensible on both, the chat
 * template as the GGUF says, and `akv run` end to end. Skips (77) without models/
 * (scripts/fetch-model). */
#define _POSIX_C_SOURCE 200809L
#include "model_ref64.h"
#include "test.h"
#include "model_path.h"
#include "fwd_fixture.h" /* r1: a route of one sequence */


#include "akv/chat.h"
#include "akv/dev_pool.h"
#include "akv/engine.h"
#include "akv/json_prefix.h"
#include "akv/json_schema.h"
#include "akv/forward.h"
#include "akv/host_pool.h"
#include "akv/route.h"
#include "akv/sample.h"
#include "akv/tok.h"
#include "core/alloc.h"
#include "core/assert.h"
#include "route/route_check.h"

static char model_path[4096];

/* Host backend pools for the model with K/V pages of `dtype`, and one route. */
typedef struct session {
    akv_dev *dev;
    akv_host_pool *hp;
    akv_dev_pool *dp;
    r1 route;
    akv_forward *fwd;
} session;

static int session_open(session *s, const akv_model *m, akv_dtype dtype, uint32_t chunk,
                        uint32_t n_layers) {
    const akv_model_config *c = akv_model_get_config(m);
    memset(s, 0, sizeof *s);
    akv_geom g;
    akv_host_pool_params hpp = akv_host_pool_default_params();
    akv_dev_pool_params dpp = akv_dev_pool_default_params();
    hpp.limit_gib = 1, dpp.device_gib = 1;
    hpp.arena_bytes = 64u << 20;
    akv_route_params rp = {.max_history = 1024};
    akv_forward_params fp = {.max_step_tokens = chunk, .n_layers = n_layers};
    return CHECK(akv_dev_create(akv_dev_host_backend(), NULL, &s->dev) == AKV_OK &&
                 akv_geom_init(&g, c->n_layers, c->n_kv_heads, c->head_dim, dtype, 0) == AKV_OK &&
                 akv_host_pool_create(s->dev, &g, &hpp, &s->hp) == AKV_OK &&
                 akv_dev_pool_create(s->dev, &g, &dpp, &s->dp) == AKV_OK &&
                 r1_open(s->dev, s->hp, s->dp, &rp, &s->route) == AKV_OK &&
                 akv_forward_create(m, &fp, &s->fwd) == AKV_OK);
}

static void session_close(session *s) {
    akv_forward_destroy(s->fwd);
    CHECK_OK(r1_close(&s->route));
    CHECK_OK(akv_dev_pool_destroy(s->dp));
    CHECK_OK(akv_host_pool_destroy(s->hp));
    CHECK_OK(akv_dev_destroy(s->dev));
}

/* Runs n tokens at the end of the history in chunks of `chunk`; logits of the last. */
static akv_status session_feed(session *s, const int32_t *ids, size_t n, uint32_t chunk,
                               float *logits) {
    akv_kv_hooks kv = akv_route_hooks(s->route.r);
    for (size_t done = 0; done < n;) {
        uint32_t k = (uint32_t)(n - done < chunk ? n - done : chunk);
        uint64_t len = r1_len(&s->route);
        akv_status st = r1_step(&s->route, len + k);
        if (st == AKV_OK)
            st = akv_forward_run(s->fwd, ids + done, k, (uint32_t)len, &kv,
                                 done + k == n ? logits : NULL, false);
        if (st) return st;
        done += k;
    }
    return akv__route_check(s->route.r);
}

/* Greedy generation of up to n_gen tokens after the prompt; every step's logits appended to
 * all_logits ([n_gen][n_vocab]) when not NULL. Returns how many tokens were generated. */
static size_t greedy(const akv_model *m, akv_dtype dtype, uint32_t chunk, const akv_tok_ids *prompt,
                     size_t n_gen, int32_t stop, int32_t *out, float *all_logits) {
    const akv_model_config *c = akv_model_get_config(m);
    session s;
    akv_sampler *sm = NULL;
    akv_sample_params sp = akv_sample_default_params();
    sp.temp = 0;
    float *logits = akv__malloc(c->n_vocab * sizeof(float));
    size_t n = 0;
    if (session_open(&s, m, dtype, chunk, 0) &&
        CHECK(akv_sampler_create(&sp, (int32_t)c->n_vocab, &sm) == AKV_OK) &&
        CHECK(session_feed(&s, prompt->ids, prompt->n_ids, chunk, logits) == AKV_OK)) {
        while (n < n_gen) {
            if (all_logits) memcpy(all_logits + n * c->n_vocab, logits, c->n_vocab * 4);
            if (!CHECK(akv_sampler_sample(sm, logits, &out[n]) == AKV_OK) || out[n] == stop) break;
            if (!CHECK(session_feed(&s, &out[n], 1, chunk, logits) == AKV_OK)) break;
            n++;
        }
    }
    akv_sampler_destroy(sm);
    akv__free(logits);
    session_close(&s);
    return n;
}

/* Output of a shell command (stdout), at most cap-1 bytes; -1 if it does not exit 0. */
static int run_cmd(const char *cmd, char *buf, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(buf, 1, cap - 1, p);
    buf[n] = 0;
    return pclose(p) == 0 ? (int)n : -1;
}

static long file_bytes(const char *path, void *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    long n = (long)fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* An engine on the host backend over model m (256 tokens of context). */
static akv_engine *host_engine(const akv_model *m) {
    akv_engine_params ep = akv_engine_default_params();
    if (!CHECK(akv_dev_create(akv_dev_host_backend(), NULL, &ep.dev) == AKV_OK)) return NULL;
    ep.model = m, ep.max_context = 256, ep.host_gib = 1, ep.device_gib = 1;
    akv_engine *e = NULL;
    return CHECK(akv_engine_create(&ep, &e) == AKV_OK) ? e : NULL;
}

/* A request's tokens and text, from its events. */
typedef struct run_seen {
    int32_t tok[128];
    uint32_t n, n_trigger;
    char text[2048];
    size_t n_text;
} run_seen;

static void run_on_token(void *user, akv_request *rq, const akv_token_event *ev) {
    (void)rq;
    run_seen *s = user;
    if (ev->token >= 0 && !ev->eog && s->n < 128) s->tok[s->n++] = ev->token;
    if (ev->text && ev->n_text && s->n_text + ev->n_text < sizeof s->text) {
        memcpy(s->text + s->n_text, ev->text, ev->n_text);
        s->n_text += ev->n_text;
        s->text[s->n_text] = 0;
    }
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    if (!test_model_path(model_path, sizeof model_path, 0))
        test_skip("no default model in models/ (scripts/fetch-model)");
    akv_model *m = NULL, *mf = NULL; /* native storage (the default); f32 */
    akv_tok *tok = NULL;
    const akv_model_load_params f32 = {.weights = AKV_WEIGHTS_F32};
    if (!CHECK(akv_model_load(model_path, NULL, &m) == AKV_OK) ||
        !CHECK(akv_model_load(model_path, &f32, &mf) == AKV_OK) ||
        !CHECK(akv_tok_create_from_gguf(akv_model_gguf(m), NULL, &tok) == AKV_OK))
        return test_finish();
    const akv_model_config *c = akv_model_get_config(m);
    const akv_gguf *g = akv_model_gguf(m);
    const char *prompt = "The capital of France is";
    akv_tok_ids ids = {0};
    CHECK_OK(akv_tok_encode(tok, prompt, strlen(prompt), AKV_TOK_ADD_SPECIAL, &ids));
    float *logits = akv__malloc(c->n_vocab * sizeof(float));
    double *want = akv__malloc(c->n_vocab * sizeof(double));

    TEST_CASE(config_as_the_file_states) {
        const struct {
            const char *key;
            uint32_t got;
        } keys[] = {{"llama.block_count", c->n_layers},
                    {"llama.embedding_length", c->n_embd},
                    {"llama.feed_forward_length", c->n_ff},
                    {"llama.attention.head_count", c->n_heads},
                    {"llama.attention.head_count_kv", c->n_kv_heads},
                    {"llama.rope.dimension_count", c->n_rot},
                    {"llama.vocab_size", c->n_vocab},
                    {"llama.context_length", c->n_ctx_train}};
        for (size_t i = 0; i < AKV_ARRAY_LEN(keys); i++) {
            uint32_t v = 0;
            CHECK_OK(akv_gguf_get_u32(g, keys[i].key, &v));
            if (v != keys[i].got) printf("  key %s\n", keys[i].key);
            CHECK_EQ_INT(keys[i].got, v);
        }
        double base = 0;
        CHECK_OK(akv_gguf_get_f64(g, "llama.rope.freq_base", &base));
        CHECK_NEAR(c->rope_base, base, 0);
        CHECK_EQ_INT(c->head_dim, c->n_embd / c->n_heads);
        const akv_gguf_tensor *t;
        CHECK_EQ_INT(c->tied_output, akv_gguf_find_tensor(g, "output.weight", &t) != AKV_OK);
        CHECK(!c->has_qkv_bias && c->rope_mode == AKV_ROPE_NORMAL);
    }

    TEST_CASE(first_layers_match_f64) {
        /* two layers of a 12-token prompt in chunks of 5, f32 pages: the residual stream. f32
         * storage: float rounding only. Native: the relative RMS error 8-bit activations
         * leave (measured 0.0095 here; the bound holds twice it, and a product that lost a
         * block's scale or minimum is off by far more) */
        const char *text = "Paris is the capital of France, and Rome is the capital of";
        akv_tok_ids p = {0};
        CHECK_OK(akv_tok_encode(tok, text, strlen(text), 0, &p));
        const size_t n_last = p.n_ids % 5 ? p.n_ids % 5 : 5, E = c->n_embd;
        double *hid = akv__malloc(p.n_ids * E * sizeof(double));
        float *want_f = akv__malloc(n_last * E * sizeof(float));
        ref64_forward(mf, p.ids, p.n_ids, 2, hid, NULL); /* the same weight values as m's */
        for (size_t i = 0; i < n_last * E; i++)
            want_f[i] = (float)hid[(p.n_ids - n_last) * E + i];
        for (int native = 0; native < 2; native++) {
            session s;
            if (!session_open(&s, native ? m : mf, AKV_DTYPE_F32, 5, 2)) break;
            CHECK_OK(session_feed(&s, p.ids, p.n_ids, 5, NULL));
            /* the stream of the last chunk's rows is what the pass keeps */
            const float *got = akv_forward_hidden(s.fwd);
            if (!native) CHECK_CLOSE_F32(got, want_f, n_last * E, 1e-4, 1e-4);
            double num = 0, den = 0;
            for (size_t i = 0; i < n_last * E; i++)
                num += (got[i] - want_f[i]) * (double)(got[i] - want_f[i]), den += (double)want_f[i] * want_f[i];
            printf("  %s storage: relative RMS error of the stream after 2 layers %.3g\n",
                   native ? "native" : "f32", sqrt(num / den));
            if (native) TEST_CHECK_(sqrt(num / den) < 0.02, "native: %g", sqrt(num / den));
            session_close(&s);
        }
        akv__free(hid), akv__free(want_f);
        akv_tok_ids_free(&p);
    }

    TEST_CASE(logits_match_f64_and_continue_with_paris) {
        ref64_forward(mf, ids.ids, ids.n_ids, c->n_layers, NULL, want);
        int32_t paris = akv_tok_find(tok, "\xc4\xa0Paris", 7); /* byte-level " Paris" */
        CHECK(paris >= 0);
        for (int cell = 0; cell < 3; cell++) {
            /* f32 storage, f32 pages: float32 rounding only; bf16 pages: the K/V rounding too;
             * native storage, bf16 pages: the 8-bit activations too, which move every logit
             * by about the same amount (a shift the softmax ignores: -0.50 measured) plus a
             * spread (relative RMS of the centred logits 0.045, worst logit 1.25 off; the
             * bounds hold twice those) */
            const bool native = cell == 2;
            const akv_dtype dtype = cell ? AKV_DTYPE_BF16 : AKV_DTYPE_F32;
            session s;
            if (!session_open(&s, native ? m : mf, dtype, 3, 0)) break;
            CHECK_OK(session_feed(&s, ids.ids, ids.n_ids, 3, logits));
            session_close(&s);
            size_t best = 0, best_ref = 0;
            double worst = 0, num = 0, den = 0, shift = 0, mw = 0;
            for (size_t i = 0; i < c->n_vocab; i++) shift += logits[i] - want[i], mw += want[i];
            shift /= c->n_vocab, mw /= c->n_vocab;
            for (size_t i = 0; i < c->n_vocab; i++) {
                if (logits[i] > logits[best]) best = i;
                if (want[i] > want[best_ref]) best_ref = i;
                worst = fmax(worst, fabs(logits[i] - want[i]));
                const double dd = logits[i] - want[i] - shift;
                num += dd * dd, den += (want[i] - mw) * (want[i] - mw);
            }
            const double tol = cell == 0 ? 1e-3 : cell == 1 ? 0.5 : 2.5;
            printf("  %s storage, %s pages: worst logit off by %.3g, shift %.3g, relative RMS "
                   "of the centred logits %.3g\n",
                   native ? "native" : "f32", akv_dtype_name(dtype), worst, shift, sqrt(num / den));
            TEST_CHECK_(worst <= tol, "%s storage, %s pages: logits off by %g (tolerance %g)",
                        native ? "native" : "f32", akv_dtype_name(dtype), worst, tol);
            if (native) TEST_CHECK_(sqrt(num / den) < 0.09, "native: relative RMS %g", sqrt(num / den));
            CHECK_EQ_INT(best, best_ref);
            CHECK_EQ_INT(best, paris);
        }
    }

    TEST_CASE(greedy_is_deterministic_and_chunking_keeps_the_tokens) {
        enum { N = 16 };
        int32_t a[N], b[N], d[N];
        float *la = akv__malloc((size_t)N * c->n_vocab * 4),
              *lb = akv__malloc((size_t)N * c->n_vocab * 4);
        int32_t e[N];
        size_t na = greedy(m, AKV_DTYPE_BF16, 256, &ids, N, -1, a, la);
        size_t nb = greedy(m, AKV_DTYPE_BF16, 256, &ids, N, -1, b, lb);
        size_t nd = greedy(m, AKV_DTYPE_BF16, 2, &ids, N, -1, d, NULL);
        size_t ne = greedy(mf, AKV_DTYPE_BF16, 256, &ids, N, -1, e, NULL);
        CHECK_EQ_INT(na, N);
        CHECK_EQ_INT(nb, N);
        CHECK_EQ_INT(nd, N);
        CHECK_EQ_INT(ne, N);
        CHECK_BYTES(a, b, sizeof a);
        CHECK_BYTES(la, lb, (size_t)N * c->n_vocab * 4); /* every step's logits, bit for bit */
        CHECK_BYTES(a, d, sizeof a);
        /* native against f32 storage: the same first 5 tokens (" Paris.", two newlines,
         * "The"); greedy text may part later, where two candidates are close */
        CHECK_BYTES(a, e, 5 * sizeof *a);
        for (int st = 0; st < 2; st++) {
            akv_tok_text t = {0};
            CHECK_OK(akv_tok_decode(tok, st ? e : a, N, 0, &t));
            printf("  greedy, %s storage: \"%s%s\"\n", st ? "f32" : "native", prompt,
                   t.bytes ? t.bytes : "");
            akv_tok_text_free(&t);
        }
        akv__free(la), akv__free(lb);
    }

    TEST_CASE(a_json_value_after_a_string) {
        /* format_after: the answer is free until the string, then one JSON object, then free
         * again. The string is the first tokens of the free answer: the held answer is the free
         * one up to it (the same tokens), then a whole JSON object (akv/json_prefix.h); a
         * string the answer never holds leaves it free (the free answer's tokens). */
        akv_engine *e = host_engine(m);
        if (!e) break;
        const char *q = "Here is a JSON object describing a cat:";
        akv_tok_ids qi = {0};
        CHECK_OK(akv_tok_encode(tok, q, strlen(q), AKV_TOK_ADD_SPECIAL, &qi));
        static run_seen free_run, held, never;
        const char *after = NULL;
        char trigger[64] = "";
        for (int k = 0; k < 3; k++) {
            run_seen *rs = k == 0 ? &free_run : k == 1 ? &held : &never;
            memset(rs, 0, sizeof *rs);
            akv_request_params rp = {.prompt = qi.ids, .n_prompt = (uint32_t)qi.n_ids, .max_tokens = 48,
                                     .sample = akv_sample_default_params(), .on_token = run_on_token,
                                     .user = rs};
            rp.sample.temp = 0;
            if (k) rp.format = AKV_FORMAT_JSON_OBJECT, rp.format_after = after;
            akv_request *rq;
            CHECK_OK(akv_engine_submit(e, &rp, &rq, NULL));
            while (akv_engine_busy(e)) CHECK_OK(akv_engine_step(e, NULL));
            akv_engine_release(e, rq);
            if (k == 0) { /* the trigger: the free answer's first tokens, 4 bytes at least */
                size_t n = 0;
                for (uint32_t i = 0; i < rs->n && n < 4; i++) {
                    size_t pn = 0;
                    const uint8_t *pc = akv_tok_token_piece(tok, rs->tok[i], &pn);
                    if (n + pn >= sizeof trigger) break;
                    memcpy(trigger + n, pc, pn), n += pn;
                    rs->n_trigger = i + 1;
                }
                trigger[n] = 0;
                after = trigger;
                printf("  free: \"%s\"; the string: \"%s\"\n", rs->text, trigger);
            }
            if (k == 1) after = "a string the answer never holds";
        }
        printf("  held: \"%s\"\n", held.text);
        CHECK(strlen(trigger) >= 4);
        CHECK(held.n >= free_run.n_trigger &&
              !memcmp(held.tok, free_run.tok, free_run.n_trigger * sizeof *held.tok));
        /* after the string: white space, then a JSON object that the prefix machine takes whole
         * (or, cut by max_tokens, as far as it goes) */
        const char *v = strstr(held.text, trigger);
        CHECK(v == held.text || (v && v > held.text));
        akv_json_prefix jp;
        akv_json_prefix_init(&jp, true);
        size_t at = v ? (size_t)(v - held.text) + strlen(trigger) : 0;
        bool took = v != NULL;
        while (took && held.text[at] && !akv_json_prefix_complete(&jp))
            took = akv_json_prefix_feed(&jp, (const uint8_t *)held.text + at++, 1);
        CHECK(took);
        CHECK(akv_json_prefix_complete(&jp) || held.n == 48);
        CHECK(strcmp(held.text, free_run.text) != 0); /* the free answer is not an object there */
        CHECK_EQ_INT(never.n, free_run.n);
        CHECK_BYTES(never.tok, free_run.tok, free_run.n * sizeof *never.tok);
        akv_tok_ids_free(&qi);
        akv_engine_destroy(e);
    }

    TEST_CASE(a_json_value_at_the_start) {
        /* format_at_start, a schema of one object {"age": integer} (every key required, no
         * other): an answer that begins with '{' (the free one writes a cat with a name) is held
         * to it, then free; an answer that begins otherwise is free: the free run's tokens */
        akv_engine *e = host_engine(m);
        if (!e) break;
        static const akv_js_node nodes[2] = {
            {.kind = AKV_JS_OBJECT, .first = 0, .n = 1, .required = 1},
            {.kind = AKV_JS_INTEGER}};
        static const akv_js_prop props[1] = {{"age", 1}};
        static const char *const no_texts[1] = {NULL};
        const akv_json_schema sch = {.nodes = nodes, .n_nodes = 2, .props = props, .texts = no_texts};
        const char *qs[2] = {"A cat as JSON, one object with its name and age:\n```json\n",
                             "The capital of France is"};
        for (int qi = 0; qi < 2; qi++) {
            akv_tok_ids ids2 = {0};
            CHECK_OK(akv_tok_encode(tok, qs[qi], strlen(qs[qi]), AKV_TOK_ADD_SPECIAL, &ids2));
            static run_seen free_run, held;
            for (int k = 0; k < 2; k++) {
                run_seen *rs = k ? &held : &free_run;
                memset(rs, 0, sizeof *rs);
                akv_request_params rp = {.prompt = ids2.ids, .n_prompt = (uint32_t)ids2.n_ids,
                                         .max_tokens = 40, .sample = akv_sample_default_params(),
                                         .on_token = run_on_token, .user = rs};
                rp.sample.temp = 0;
                if (k) rp.format = AKV_FORMAT_JSON_SCHEMA, rp.schema = &sch, rp.format_at_start = true;
                akv_request *rq;
                CHECK_OK(akv_engine_submit(e, &rp, &rq, NULL));
                while (akv_engine_busy(e)) CHECK_OK(akv_engine_step(e, NULL));
                akv_engine_release(e, rq);
            }
            printf("  \"%s\": free \"%.60s\", held \"%.60s\"\n", qs[qi], free_run.text, held.text);
            size_t at = 0;
            while (free_run.text[at] == ' ' || free_run.text[at] == '\n') at++;
            if (qi == 0) { /* the free answer begins with '{' and is not the schema's object */
                CHECK(free_run.text[at] == '{' && strstr(free_run.text, "\"name\"") != NULL);
                akv_js_state js;
                akv_js_init(&js, &sch);
                size_t i = 0;
                bool took = true;
                while (took && held.text[i] && !akv_js_complete(&js))
                    took = akv_js_feed(&js, (const uint8_t *)held.text + i++, 1);
                CHECK(took && akv_js_complete(&js)); /* held: the schema's whole object first */
            } else {
                CHECK(free_run.text[at] != '{');
                CHECK_EQ_INT(held.n, free_run.n);
                CHECK_BYTES(held.tok, free_run.tok, free_run.n * sizeof *held.tok);
            }
            akv_tok_ids_free(&ids2);
        }
        akv_engine_destroy(e);
    }

    TEST_CASE(chat_template_as_the_gguf_says) {
        akv_chat *chat = NULL;
        CHECK_OK(akv_chat_create_from_gguf(g, NULL, &chat));
        if (!chat) break;
        CHECK_EQ_INT(akv_chat_get_kind(chat), AKV_CHAT_JINJA); /* the file's template, run */
        /* the default system message, read from the file's template by its family, is in
         * what the template run writes */
        akv_chat *family = NULL;
        CHECK_OK(akv_chat_create_from_gguf(g, "chatml", &family));
        akv_gguf_str tmpl = {0};
        CHECK_OK(akv_gguf_get_str(g, "tokenizer.chat_template", &tmpl));
        const char *sys = family ? akv_chat_default_system(family) : NULL;
        if (!CHECK(sys && strlen(sys) > 10)) {
            akv_chat_destroy(family), akv_chat_destroy(chat);
            break;
        }
        int in_template = 0;
        for (size_t i = 0; i + strlen(sys) <= tmpl.len && !in_template; i++)
            in_template = !memcmp(tmpl.ptr + i, sys, strlen(sys));
        CHECK(in_template);
        akv_chat_msg msg = {"user", "What is the capital of France?"};
        akv_tok_text r = {0}, rf = {0};
        CHECK_OK(akv_chat_render(chat, &msg, 1, true, &r, NULL));
        CHECK(r.bytes && strstr(r.bytes, sys) && strstr(r.bytes, msg.content));
        CHECK_OK(akv_chat_render(family, &msg, 1, true, &rf, NULL));
        CHECK(r.bytes && rf.bytes && !strcmp(r.bytes, rf.bytes)); /* the family's C: the same */
        akv_tok_text_free(&rf);
        akv_chat_destroy(family);
        akv_tok_ids cids = {0};
        CHECK_OK(akv_tok_encode(tok, r.bytes, r.n_bytes, AKV_TOK_PARSE_SPECIAL, &cids));
        int32_t im_start = akv_tok_find(tok, "<|im_start|>", 12);
        int32_t im_end = akv_tok_find(tok, "<|im_end|>", 10);
        CHECK(cids.n_ids > 20 && cids.ids[0] == im_start);
        size_t n_start = 0;
        for (size_t i = 0; i < cids.n_ids; i++)
            n_start += cids.ids[i] == im_start;
        CHECK_EQ_INT(n_start, 3); /* system, user, and the generation prompt */
        /* the reply is English that ends with <|im_end|> (the model's eos). On f32 storage:
         * this model's first reply token is a near tie ("The" 0.12 above "L", whose reply
         * goes on in French), which the native storage's 8-bit activations tip the other
         * way */
        int32_t out[48];
        size_t n = greedy(mf, AKV_DTYPE_BF16, 256, &cids, 48, im_end, out, NULL);
        CHECK(n > 0 && n < 48);
        CHECK_EQ_INT(akv_tok_get_specials(tok).eos_id, im_end);
        akv_tok_text reply = {0};
        CHECK_OK(akv_tok_decode(tok, out, n, 0, &reply));
        printf("  chat reply: \"%s\"\n", reply.bytes ? reply.bytes : "");
        CHECK(reply.bytes && strstr(reply.bytes, "Paris"));
        akv_tok_text_free(&reply);
        akv_tok_ids_free(&cids);
        akv_tok_text_free(&r);
        akv_chat_destroy(chat);
    }

    TEST_CASE(akv_run_end_to_end) {
        const char *bdir = getenv("AKV_BUILD_DIR");
        if (!bdir) {
            printf("  (AKV_BUILD_DIR not set: skipped)\n");
            break;
        }
        char cmd[20000], out1[16384], out2[16384];
        const char *dumps[2] = {"/tmp/akv_test_run_1.f32", "/tmp/akv_test_run_2.f32"};
        char *outs[2] = {out1, out2};
        size_t cap = 16 * (size_t)c->n_vocab * 4;
        char *d1 = akv__malloc(cap), *d2 = akv__malloc(cap);
        /* the same text and logits bit for bit run to run and at 1, 2 and 4 threads (the
         * products' columns and the attention's query heads split differently: 9 heads in
         * groups of 3 cut at 4, or at 2, 4 and 6) */
        static const int threads[4] = {1, 1, 2, 4};
        for (int i = 0; i < 4; i++) {
            snprintf(cmd, sizeof cmd,
                     "%s/tools/akv run -q -m '%s' -p 'The capital of France is' -n 12 --temp 0 "
                     "--threads %d --dump-logits %s",
                     bdir, model_path, threads[i], dumps[i > 0]);
            CHECK(run_cmd(cmd, outs[i > 0], sizeof out1) > 0);
            if (i == 0) continue;
            CHECK_STR(out1, out2);
            long n1 = file_bytes(dumps[0], d1, cap), n2 = file_bytes(dumps[1], d2, cap);
            CHECK(n1 > 0 && n1 == n2 && n1 % ((long)c->n_vocab * 4) == 0);
            if (n1 > 0 && n1 == n2) CHECK_BYTES(d1, d2, (size_t)n1);
        }
        CHECK(strncmp(out1, "The capital of France is Paris", 30) == 0);
        akv__free(d1), akv__free(d2);
        unlink(dumps[0]), unlink(dumps[1]);
        /* the chat mode and clear refusals */
        snprintf(cmd, sizeof cmd,
                 "%s/tools/akv run -q -m '%s' --chat -p 'Say hello.' -n 24 "
                 "--temp 0",
                 bdir, model_path);
        CHECK(run_cmd(cmd, out1, sizeof out1) > 0 && strlen(out1) > 2);
        /* the staged route: a prompt of three pages with a window of two, so pages are
         * staged every step; logits byte-identical to the resident route's */
        char long_prompt[4096] = "";
        while (strlen(long_prompt) + 64 < sizeof long_prompt)
            strcat(long_prompt, "The quick brown fox jumps over the lazy dog near the river. ");
        const char *routes[2] = {"resident", "staged"};
        for (int i = 0; i < 2; i++) {
            snprintf(cmd, sizeof cmd,
                     "%s/tools/akv run -q -m '%s' -p '%s' -n 4 --temp 0 --max-context 1100 "
                     "--route %s --window-pages 2 --dump-logits %s",
                     bdir, model_path, long_prompt, routes[i], dumps[i]);
            CHECK(run_cmd(cmd, outs[i], sizeof out1) > 0);
        }
        CHECK_STR(out1, out2);
        cap = 4 * (size_t)c->n_vocab * 4;
        d1 = akv__malloc(cap), d2 = akv__malloc(cap);
        long n1 = file_bytes(dumps[0], d1, cap), n2 = file_bytes(dumps[1], d2, cap);
        CHECK(n1 > 0 && n1 == n2);
        if (n1 > 0 && n1 == n2) CHECK_BYTES(d1, d2, (size_t)n1);
        akv__free(d1), akv__free(d2);
        unlink(dumps[0]), unlink(dumps[1]);
        snprintf(cmd, sizeof cmd, "%s/tools/akv run -q -m '%s' -p x --route staged --window-pages 1 2>&1",
                 bdir, model_path);
        CHECK(run_cmd(cmd, out1, sizeof out1) < 0 && strstr(out1, "window"));
        snprintf(cmd, sizeof cmd, "%s/tools/akv run -q -m /nonexistent.gguf -p x 2>&1", bdir);
        CHECK(run_cmd(cmd, out1, sizeof out1) < 0 && strstr(out1, "nonexistent"));
    }

    akv_tok_ids_free(&ids);
    akv__free(logits), akv__free(want);
    akv_tok_destroy(tok);
    akv_model_destroy(m), akv_model_destroy(mf);
    return test_finish();
}
