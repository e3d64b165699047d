/* test_engine.c — the engine (akv/engine.h) on the host backend with a tiny synthetic model:
 * batch invariance of the host pass (requests run together give each one its bits alone),
 * join and leave at step boundaries, the token budget (a long prompt never stalls a running
 * decode), refusal and queueing by the plan, cancellation mid-prefill and mid-decode with the
 * pages freed only after their fences (device faults injected), idle contexts reused by prefix
 * and reclaimed in the device pool's order, and a randomized run of 10^5 operations with the
 * memory-layer walkers after every step. */
#define _POSIX_C_SOURCE 200809L /* mkstemp, fdopen */
#include "model_build.h"
#include "akv/trace.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <unistd.h>

#include "alloc_settled.h"
#include "akv/testing/dev_faults.h"
#include "fwd_fixture.h"

#include "akv/dev_pool.h"
#include "akv/engine.h"
#include "akv/log.h"
#include "core/alloc.h"

enum { P = 16, NV = 37 };

static const tm_shape shape = {.arch = "llama",
                               .n_layers = 2,
                               .n_embd = 32,
                               .n_ff = 48,
                               .n_heads = 4,
                               .n_kv_heads = 2,
                               .n_vocab = NV};

/* What a request's events said. */
typedef struct seen {
    int32_t tok[512];
    float logits[64][NV];
    uint32_t n, n_logits;
    akv_finish finish;
    uint32_t n_final; /* events with a finish (must end up 1) */
    uint32_t after_final; /* events after the final one (must stay 0) */
} seen;

static void on_token(void *user, akv_request *rq, const akv_token_event *ev) {
    (void)rq;
    seen *s = user;
    if (s->n_final) s->after_final++;
    if (ev->token >= 0 && s->n < 512) s->tok[s->n++] = ev->token;
    if (ev->logits && s->n_logits < 64) memcpy(s->logits[s->n_logits++], ev->logits, sizeof s->logits[0]);
    if (ev->finish != AKV_FINISH_NONE) s->finish = ev->finish, s->n_final++;
}

/* What a request's events said, and the prompt's logits (on_prompt_logits) from `next` on. */
typedef struct pseen {
    seen s; /* first: on_token takes the same user */
    float rows[200][NV];
    uint32_t next, max_n;
    bool in_order;
} pseen;

static void on_prompt_rows(void *user, akv_request *rq, uint32_t pos, uint32_t n, const float *logits) {
    (void)rq;
    pseen *p = user;
    p->in_order &= pos == p->next && pos + n <= 200;
    if (!p->in_order) return;
    memcpy(p->rows[pos], logits, (size_t)n * sizeof p->rows[0]);
    p->next = pos + n;
    p->max_n = n > p->max_n ? n : p->max_n;
}

/* An engine over the model on a fresh host-backend device. */
/* The route kind of a name (the engine's tests choose routes as the tools do). */
static akv_route_kind route_kind(const char *name) {
    akv_route_kind k = 0;
    akv_status st = akv_route_kind_from_name(name, &k);
    AKV_ASSERT(st == AKV_OK);
    return k;
}

static akv_engine *engine_open(const akv_model *m, akv_engine_params *over) {
    akv_engine_params p = over ? *over : akv_engine_default_params();
    if (!CHECK(akv_dev_create(akv_dev_host_backend(), NULL, &p.dev) == AKV_OK)) return NULL;
    p.model = m;
    if (!p.page_tokens) p.page_tokens = P;
    if (!p.max_context) p.max_context = 256;
    if (p.chunk == akv_engine_default_params().chunk) p.chunk = 16; /* prompts span chunks */
    akv_engine *e = NULL;
    if (!CHECK(akv_engine_create(&p, &e) == AKV_OK)) return NULL;
    return e;
}

/* A conversation's next turn into dst: tok[0, n) (its first prompt), then n_reply tokens of
 * its reply, then tok[at, at + n_more) (the new turn); returns the length. */
static uint32_t next_turn(int32_t *dst, const int32_t *tok, uint32_t n, const seen *reply,
                          uint32_t n_reply, uint32_t at, uint32_t n_more) {
    memcpy(dst, tok, n * sizeof *dst);
    memcpy(dst + n, reply->tok, n_reply * sizeof *dst);
    memcpy(dst + n + n_reply, tok + at, n_more * sizeof *dst);
    return n + n_reply + n_more;
}

/* An empty file made from the template (its XXXXXX replaced): whether it could be. */
static bool temp_file(char *tmpl) {
    const int fd = mkstemp(tmpl);
    if (fd >= 0) close(fd);
    return fd >= 0;
}

/* Greedy request params over tokens[n]. */
static akv_request_params greedy(const int32_t *tokens, uint32_t n, uint32_t max_tokens, seen *s) {
    akv_request_params rp = {.prompt = tokens, .n_prompt = n, .max_tokens = max_tokens,
                             .sample = akv_sample_default_params(), .on_token = on_token,
                             .user = s, .want_logits = true};
    rp.sample.temp = 0;
    return rp;
}

/* fn(path) (NULL: none) for every file of dir; returns how many there are. */
static int dir_each(const char *dir, void (*fn)(const char *path)) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d)) != NULL;) {
        if (de->d_name[0] == '.') continue;
        char path[700];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (fn) fn(path);
        n++;
    }
    if (d) closedir(d);
    return n;
}

static void file_remove(const char *path) {
    remove(path);
}

/* A byte near the end of a file flipped (inside a session file's K/V). */
static void file_damage(const char *path) {
    FILE *f = fopen(path, "r+b");
    if (!CHECK(f != NULL)) return;
    fseek(f, -20, SEEK_END);
    int ch = fgetc(f);
    fseek(f, -20, SEEK_END);
    fputc(ch ^ 0x40, f);
    fclose(f);
}

/* Steps until nothing runs (at most `limit` steps); checks the engine after every step. */
/* Events of a Chrome trace of ph and name on track tid; with token >= 0 only those whose
 * args.token is at least 0 (an emit with a token). */
static int trace_count(const cJSON *events, const char *ph, const char *name, int tid, int token) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const cJSON *p = cJSON_GetObjectItem(e, "ph"), *nm = cJSON_GetObjectItem(e, "name"),
                    *t = cJSON_GetObjectItem(e, "tid"), *a = cJSON_GetObjectItem(e, "args");
        if (!cJSON_IsString(p) || strcmp(p->valuestring, ph) || !cJSON_IsString(nm) ||
            strcmp(nm->valuestring, name) || !cJSON_IsNumber(t) || t->valueint != tid)
            continue;
        const cJSON *tk = a ? cJSON_GetObjectItem(a, "token") : NULL;
        if (token >= 0 && !(cJSON_IsNumber(tk) && tk->valuedouble >= 0)) continue;
        n++;
    }
    return n;
}

/* The last value of counter `name` in a Chrome trace (-1: none). */
static double trace_last(const cJSON *events, const char *name) {
    double v = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const cJSON *p = cJSON_GetObjectItem(e, "ph"), *nm = cJSON_GetObjectItem(e, "name");
        if (cJSON_IsString(p) && !strcmp(p->valuestring, "C") && cJSON_IsString(nm) &&
            !strcmp(nm->valuestring, name))
            v = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "value")->valuedouble;
    }
    return v;
}

static int run_all(akv_engine *e, int limit) {
    int steps = 0;
    for (int idle = 0; akv_engine_busy(e) && steps < limit; idle++) { /* a stuck engine: bounded */
        if (!TEST_CHECK_(idle < 4 * limit + 100, "the engine is busy and does no work")) return -1;
        bool did;
        if (!CHECK(akv_engine_step(e, &did) == AKV_OK)) return -1;
        steps += did;
        if (!CHECK(akv__engine_check(e) == AKV_OK)) return -1;
    }
    return steps;
}

/* An engine on a new session directory (dir, a mkdtemp template; at most 2 running, 1 idle)
 * that served conversation A (a1 = tokens[0..40), 6 generated into *ta; retention ret) and then
 * B (b1 = tokens[200..230), 4 into *tb), so that A's context went to the directory; its params
 * in *ep, the requests in r[0..1]. NULL (checked) when the directory or engine is not made. */
static akv_engine *a_then_b(const akv_model *model, const int32_t *tokens, char *dir, int8_t ret,
                            akv_engine_params *ep, int32_t *a1, int32_t *b1, seen *ta, seen *tb,
                            akv_request **r) {
    if (!CHECK(mkdtemp(dir) != NULL)) return NULL;
    memcpy(a1, tokens, 40 * sizeof *a1);
    memcpy(b1, tokens + 200, 30 * sizeof *b1);
    memset(ta, 0, sizeof *ta), memset(tb, 0, sizeof *tb);
    *ep = akv_engine_default_params();
    ep->max_seqs = 2, ep->max_idle = 1, ep->session_dir = dir;
    akv_engine *a = engine_open(model, ep);
    if (!a) return NULL;
    akv_request_params pa = greedy(a1, 40, 6, ta), pb = greedy(b1, 30, 4, tb);
    pa.retention = ret;
    CHECK_OK(akv_engine_submit(a, &pa, &r[0], NULL));
    CHECK(run_all(a, 100) > 0);
    CHECK_OK(akv_engine_submit(a, &pb, &r[1], NULL)); /* A's context goes to the directory */
    CHECK(run_all(a, 100) > 0);
    return a;
}

/* A conversation's two turns with it kept in memory, on an engine of its own: a1 (40 tokens,
 * 6 generated), then a2 (its next prompt of 58 tokens, 45 of them cached, 5 generated) into
 * *tref; `got`, the second turn served another way, must give the same tokens and logits bit
 * for bit. */
static void same_as_kept_in_memory(const akv_model *model, const int32_t *a1, const int32_t *a2,
                                   seen *tref, const seen *got) {
    akv_engine_params rp = akv_engine_default_params();
    rp.max_seqs = 2, rp.max_idle = 2;
    akv_engine *ref = engine_open(model, &rp);
    if (!ref) return;
    static seen t0;
    memset(&t0, 0, sizeof t0);
    akv_request *r[2];
    akv_request_params p0 = greedy(a1, 40, 6, &t0), pr = greedy(a2, 58, 5, tref);
    CHECK_OK(akv_engine_submit(ref, &p0, &r[0], NULL));
    CHECK(run_all(ref, 100) > 0);
    CHECK_OK(akv_engine_submit(ref, &pr, &r[1], NULL));
    CHECK(run_all(ref, 100) > 0);
    akv_request_info info;
    akv_request_get_info(r[1], &info);
    CHECK_EQ_U64(info.n_cached, 45);
    CHECK(tref->n == 5 && got->n == 5 && memcmp(tref->tok, got->tok, 5 * sizeof tref->tok[0]) == 0);
    for (uint32_t k = 0; k < 5 && k < tref->n_logits; k++)
        TEST_CHECK_(memcmp(tref->logits[k], got->logits[k], sizeof tref->logits[0]) == 0,
                    "restored logits at token %u", k);
    akv_engine_release(ref, r[0]), akv_engine_release(ref, r[1]);
    akv_engine_destroy(ref);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    uint64_t rng = test_seed(23);
    akv_model *model = tm_load(&shape, rng);
    if (!CHECK(model != NULL)) return test_finish();
    int32_t tokens[1024];
    for (int i = 0; i < 1024; i++) tokens[i] = (int32_t)test_rand_below(&rng, NV);
    akv_log_set(NULL, NULL, getenv("AKV_TEST_VERBOSE") ? AKV_LOG_INFO : AKV_LOG_OFF); /* refusals and faults are expected */

    TEST_CASE(batch_invariance_host_pass) {
        /* four prompts of different lengths run together (max_seqs 4): each one's tokens and
         * every step's logits byte-identical to the same prompt run alone */
        const uint32_t len[4] = {1, 17, 40, 75}, start[4] = {0, 100, 200, 300};
        static seen alone[4], together[4];
        memset(alone, 0, sizeof alone), memset(together, 0, sizeof together);
        for (int i = 0; i < 4; i++) {
            akv_engine *e = engine_open(model, NULL);
            if (!e) break;
            akv_request_params rp = greedy(tokens + start[i], len[i], 24, &alone[i]);
            akv_request *rq = NULL;
            CHECK_OK(akv_engine_submit(e, &rp, &rq, NULL));
            CHECK(run_all(e, 1000) > 0);
            akv_engine_release(e, rq);
            akv_engine_destroy(e);
        }
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 4;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        akv_request *rq[4];
        for (int i = 0; i < 4; i++) {
            akv_request_params rp = greedy(tokens + start[i], len[i], 24, &together[i]);
            CHECK_OK(akv_engine_submit(e, &rp, &rq[i], NULL));
        }
        int steps = run_all(e, 1000);
        for (int i = 0; i < 4; i++) {
            CHECK_EQ_U64(together[i].n, alone[i].n);
            CHECK_EQ_U64(together[i].n_logits, alone[i].n_logits);
            CHECK_BYTES(together[i].tok, alone[i].tok, alone[i].n * sizeof(int32_t));
            CHECK_BYTES(together[i].logits, alone[i].logits, alone[i].n_logits * sizeof alone[i].logits[0]);
            CHECK(together[i].finish == AKV_FINISH_LENGTH && together[i].n_final == 1);
            akv_engine_release(e, rq[i]);
        }
        akv_engine_stats st;
        akv_engine_get_stats(e, &st);
        printf("  4 requests together in %d steps; alone they took %u decode steps each\n", steps, 23);
        CHECK(steps < 4 * 24); /* they shared steps */
        CHECK_EQ_U64(st.n_preemptions, 0);
        akv_engine_destroy(e);
    }

    TEST_CASE(join_leave_and_the_token_budget) {
        /* A decodes; B arrives with a prompt of 5 chunks: every step while B prefills also
         * advances A by one token (B's prompt holds A up for one chunk a step, never more);
         * C joins late; they leave as they finish */
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 3;
        ep.step_tokens = 3 - 1 + 16;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        static seen a, b, c;
        memset(&a, 0, sizeof a), memset(&b, 0, sizeof b), memset(&c, 0, sizeof c);
        akv_request *ra, *rb, *rc;
        akv_request_params pa = greedy(tokens, 3, 40, &a);
        CHECK_OK(akv_engine_submit(e, &pa, &ra, NULL));
        for (int i = 0; i < 3; i++) CHECK_OK(akv_engine_step(e, NULL));
        uint32_t a0 = a.n;
        akv_request_params pb = greedy(tokens + 10, 5 * 16, 8, &b);
        CHECK_OK(akv_engine_submit(e, &pb, &rb, NULL));
        akv_request_info ib;
        int prefill_steps = 0;
        for (;;) {
            CHECK_OK(akv_engine_step(e, NULL));
            CHECK_OK(akv__engine_check(e));
            akv_request_get_info(rb, &ib);
            prefill_steps++;
            if (ib.state != AKV_REQUEST_PREFILL || prefill_steps > 10) break;
        }
        CHECK_EQ_INT(prefill_steps, 5);
        CHECK_EQ_U64(a.n - a0, 5); /* one token of A per step of B's prefill */
        akv_request_params pc = greedy(tokens + 200, 20, 5, &c);
        CHECK_OK(akv_engine_submit(e, &pc, &rc, NULL));
        CHECK(run_all(e, 200) > 0);
        CHECK(a.finish == AKV_FINISH_LENGTH && b.finish == AKV_FINISH_LENGTH &&
              c.finish == AKV_FINISH_LENGTH);
        CHECK(a.n == 40 && b.n == 8 && c.n == 5);
        CHECK(!a.after_final && !b.after_final && !c.after_final);
        akv_engine_release(e, ra), akv_engine_release(e, rb), akv_engine_release(e, rc);
        akv_engine_destroy(e);
    }

    TEST_CASE(a_prompt_alone_takes_whole_chunks_of_the_budget) {
        /* nothing decodes: a prompt of 100 takes 48 (3 chunks of 16 in a budget of 50), 48,
         * then 4; the same text as the same prompt beside a decoding request, which takes one
         * chunk a step (join_leave_and_the_token_budget) */
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 2, ep.step_tokens = 50, ep.no_reuse = true; /* c computes its prompt */
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        static seen a, b, c;
        memset(&a, 0, sizeof a), memset(&b, 0, sizeof b), memset(&c, 0, sizeof c);
        akv_request *ra, *rb, *rc;
        akv_request_params pa = greedy(tokens, 100, 6, &a);
        CHECK_OK(akv_engine_submit(e, &pa, &ra, NULL));
        akv_request_info ia;
        int steps = 0;
        do {
            CHECK_OK(akv_engine_step(e, NULL));
            akv_request_get_info(ra, &ia);
        } while (ia.state == AKV_REQUEST_PREFILL && ++steps < 10);
        CHECK_EQ_INT(steps, 2); /* two steps still in prefill, the third ends it */
        CHECK(run_all(e, 50) > 0);
        /* b decodes while c prefills: c takes one chunk a step */
        akv_request_params pb = greedy(tokens + 300, 3, 30, &b), pc = greedy(tokens, 100, 6, &c);
        CHECK_OK(akv_engine_submit(e, &pb, &rb, NULL));
        CHECK_OK(akv_engine_step(e, NULL));
        CHECK_OK(akv_engine_submit(e, &pc, &rc, NULL));
        akv_request_info ic;
        steps = 0;
        do {
            CHECK_OK(akv_engine_step(e, NULL));
            akv_request_get_info(rc, &ic);
        } while (ic.state == AKV_REQUEST_PREFILL && ++steps < 20);
        CHECK_EQ_INT(ic.n_cached, 0);
        CHECK_EQ_INT(steps, 6); /* 16 x 6 in prefill, the seventh (4 tokens) ends it */
        CHECK(run_all(e, 60) > 0);
        CHECK(a.n == 6 && c.n == 6);
        {
            /* two prompts at once: the first prefills alone in whole budgets and decodes
             * before the second's prompt is done */
            static seen x[2];
            memset(x, 0, sizeof x);
            akv_request *rx[2];
            for (int i = 0; i < 2; i++) {
                akv_request_params px = greedy(tokens + 40 * i, 100, 4, &x[i]);
                CHECK_OK(akv_engine_submit(e, &px, &rx[i], NULL));
            }
            int first_at[2] = {-1, -1};
            for (int st = 0; st < 40 && first_at[1] < 0; st++) {
                CHECK_OK(akv_engine_step(e, NULL));
                for (int i = 0; i < 2; i++)
                    if (first_at[i] < 0 && x[i].n > 0) first_at[i] = st;
            }
            /* the first: 48, 48, 4 (first token at step 2); the second waits, then takes what
             * step 2 leaves in whole chunks (32), one chunk a step beside the first's decode
             * (steps 3-5), and once that has ended its last 20 at once (step 6) */
            TEST_CHECK_(first_at[0] == 2 && first_at[1] == 6, "first tokens at steps %d, %d",
                        first_at[0], first_at[1]);
            CHECK(run_all(e, 60) > 0);
            for (int i = 0; i < 2; i++)
                akv_engine_release(e, rx[i]);
        }
        CHECK(memcmp(a.tok, c.tok, sizeof a.tok[0] * 6) == 0);
        akv_engine_release(e, ra), akv_engine_release(e, rb), akv_engine_release(e, rc);
        akv_engine_destroy(e);
    }

    TEST_CASE(prompts_fill_the_room_beside_decodes_first_come_first_served) {
        /* prefill_beside 64 (4 chunks of 16) beside a decoding request: prompts of 20, 20 and
         * 40 arrive together. Step 1 (a's decode, room 64): x0 takes its 20, x1 its 20, x2
         * one chunk (16: two would not fit the 24 left). Step 2: x2's last 24. Every step also
         * advances a by one token (a decode waits one step at most). */
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 4, ep.chunk = 16, ep.prefill_beside = 64, ep.no_reuse = true;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        CHECK_EQ_INT(akv_engine_get_plan(e)->prefill_beside, 64);
        static seen a, x[3];
        memset(&a, 0, sizeof a), memset(x, 0, sizeof x);
        akv_request *ra, *rx[3];
        akv_request_params pa = greedy(tokens, 3, 30, &a);
        CHECK_OK(akv_engine_submit(e, &pa, &ra, NULL));
        for (int i = 0; i < 2; i++) CHECK_OK(akv_engine_step(e, NULL));
        const uint32_t lens[3] = {20, 20, 40};
        for (int i = 0; i < 3; i++) {
            akv_request_params px = greedy(tokens + 50 * i, lens[i], 3, &x[i]);
            CHECK_OK(akv_engine_submit(e, &px, &rx[i], NULL));
        }
        uint32_t a0 = a.n;
        akv_request_info in[3];
        CHECK_OK(akv_engine_step(e, NULL));
        CHECK_EQ_U64(a.n - a0, 1);
        for (int i = 0; i < 3; i++) akv_request_get_info(rx[i], &in[i]);
        /* the first two prompts whole (their first tokens sampled), the third one chunk */
        CHECK(x[0].n == 1 && x[1].n == 1 && x[2].n == 0);
        CHECK_EQ_INT(in[2].state, AKV_REQUEST_PREFILL);
        CHECK_OK(akv_engine_step(e, NULL));
        /* the third's last 24 beside three decodes; a advanced once more */
        CHECK_EQ_U64(a.n - a0, 2);
        CHECK(x[0].n == 2 && x[1].n == 2 && x[2].n == 1);
        CHECK(run_all(e, 100) > 0);
        /* the same text as each alone: a prompt's chunks fall at the same places */
        static seen alone;
        memset(&alone, 0, sizeof alone);
        akv_request *r_alone;
        akv_request_params p_alone = greedy(tokens + 100, 40, 3, &alone);
        CHECK_OK(akv_engine_submit(e, &p_alone, &r_alone, NULL));
        CHECK(run_all(e, 100) > 0);
        CHECK(memcmp(alone.tok, x[2].tok, sizeof alone.tok[0] * 3) == 0);
        akv_engine_release(e, ra), akv_engine_release(e, r_alone);
        for (int i = 0; i < 3; i++) akv_engine_release(e, rx[i]);
        akv_engine_destroy(e);
        /* a room below one chunk is refused, naming the setting */
        ep.prefill_beside = 8, ep.model = model, ep.page_tokens = P, ep.max_context = 256;
        akv_engine *bad = NULL;
        if (CHECK(akv_dev_create(akv_dev_host_backend(), NULL, &ep.dev) == AKV_OK)) {
            akv_log_set(NULL, NULL, AKV_LOG_OFF);
            CHECK_STATUS(akv_engine_create(&ep, &bad), AKV_EINVAL); /* the device goes with it */
            akv_log_set(NULL, NULL, AKV_LOG_WARN);
        }
    }

    TEST_CASE(requests_of_one_prompt_share_its_prefill) {
        /* A lead and two more requests of the same 70-token prompt (chunks of 16), as n choices
         * arrive: the two wait while the lead computes the prompt, then start from a copy of
         * its context (akv_route_seq_fork) and compute only the last prompt token; greedy,
         * all three give the lead's tokens, and the first logits are the lead's bit for bit.
         * A prompt that shares less than a chunk computes its own. */
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 4;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        static seen x[3], other;
        memset(x, 0, sizeof x), memset(&other, 0, sizeof other);
        akv_request *rx[3], *ro;
        for (int i = 0; i < 3; i++) {
            akv_request_params px = greedy(tokens, 70, 5, &x[i]);
            CHECK_OK(akv_engine_submit(e, &px, &rx[i], NULL));
        }
        int32_t op[70];
        memcpy(op, tokens, 10 * sizeof *op); /* 10 tokens in common: below a chunk */
        memcpy(op + 10, tokens + 300, 60 * sizeof *op);
        akv_request_params po = greedy(op, 70, 5, &other);
        CHECK_OK(akv_engine_submit(e, &po, &ro, NULL));
        CHECK_OK(akv_engine_step(e, NULL));
        akv_request_info in[3], io;
        for (int i = 0; i < 3; i++) akv_request_get_info(rx[i], &in[i]);
        akv_request_get_info(ro, &io);
        /* step 1: the lead's whole prompt (and the other's); the two wait, computing nothing */
        CHECK(x[0].n == 1 && x[1].n == 0 && x[2].n == 0 && other.n == 1);
        CHECK(in[1].n_cached == 0 && in[2].n_cached == 0);
        CHECK_OK(akv_engine_step(e, NULL));
        TEST_CHECK_(x[1].n == 1 && x[2].n == 1, "after step 2: %u, %u", x[1].n, x[2].n); /* step 2: from the copy, the last prompt token */
        CHECK(run_all(e, 200) > 0);
        for (int i = 0; i < 3; i++) akv_request_get_info(rx[i], &in[i]);
        akv_request_get_info(ro, &io);
        CHECK_EQ_U64(in[0].n_cached, 0);
        CHECK_EQ_U64(in[1].n_cached, 69);
        CHECK_EQ_U64(in[2].n_cached, 69);
        CHECK_EQ_U64(io.n_cached, 0);
        akv_engine_stats st;
        akv_engine_get_stats(e, &st);
        CHECK_EQ_U64(st.n_forked, 2);
        for (int i = 1; i < 3; i++) {
            CHECK(x[i].n == 5 && memcmp(x[i].tok, x[0].tok, 5 * sizeof x[0].tok[0]) == 0);
            CHECK(memcmp(x[i].logits[0], x[0].logits[0], sizeof x[0].logits[0]) == 0);
        }
        CHECK_OK(akv__engine_check(e));
        for (int i = 0; i < 3; i++) akv_engine_release(e, rx[i]);
        akv_engine_release(e, ro);
        /* a salted request shares only with its own salt: the lead's idle context (salt 0) is
         * not reused by salt 9; a second request of salt 9 reuses the first's */
        static seen sa, sb;
        memset(&sa, 0, sizeof sa), memset(&sb, 0, sizeof sb);
        akv_request *rs1, *rs2;
        akv_request_params ps = greedy(tokens, 70, 3, &sa);
        ps.cache_salt = 9;
        CHECK_OK(akv_engine_submit(e, &ps, &rs1, NULL));
        CHECK(run_all(e, 200) > 0);
        ps = greedy(tokens, 70, 3, &sb);
        ps.cache_salt = 9;
        CHECK_OK(akv_engine_submit(e, &ps, &rs2, NULL));
        CHECK(run_all(e, 200) > 0);
        akv_request_info is1, is2;
        akv_request_get_info(rs1, &is1), akv_request_get_info(rs2, &is2);
        CHECK_EQ_U64(is1.n_cached, 0);
        CHECK_EQ_U64(is2.n_cached, 69);
        CHECK(memcmp(sa.tok, x[0].tok, 3 * sizeof sa.tok[0]) == 0);
        akv_engine_release(e, rs1), akv_engine_release(e, rs2);
        akv_engine_destroy(e);
    }

    TEST_CASE(a_fork_where_idle_contexts_fill_the_pool_goes_on) {
        /* A host pool filled with idle contexts (pages of 4096 tokens: a pool of few pages),
         * then A computes a prompt and B, of the same prompt, starts from a copy of A's
         * context: the idle ones make room for the copy (or B computes its prompt); every step
         * goes on, both finish */
        const tm_shape big = {.arch = "llama", .n_layers = 2, .n_embd = 64, .n_ff = 48, .n_heads = 4,
                              .n_kv_heads = 4, .head_dim = 128, .n_vocab = 1000};
        akv_model *mb = tm_load(&big, rng);
        akv_engine_params ep = akv_engine_default_params();
        ep.page_tokens = 4096, ep.max_context = 4096, ep.max_seqs = 4, ep.chunk = 16;
        ep.max_idle = UINT32_MAX, ep.host_gib = 1, ep.max_queue = 8;
        akv_engine *e = mb ? engine_open(mb, &ep) : NULL;
        if (!e) {
            akv_model_destroy(mb);
            break;
        }
        const uint64_t host_pages = akv_engine_get_plan(e)->host_pages;
        static seen fill, sa, sb;
        for (uint64_t i = 0; i < host_pages / 2 + 2; i++) {
            int32_t t[2] = {(int32_t)(100 + i), 5}; /* distinct first tokens: none reused */
            akv_request *r;
            memset(&fill, 0, sizeof fill);
            akv_request_params rp = greedy(t, 2, 1, &fill);
            CHECK_OK(akv_engine_submit(e, &rp, &r, NULL));
            CHECK(run_all(e, 20) > 0);
            akv_engine_release(e, r);
        }
        memset(&sa, 0, sizeof sa), memset(&sb, 0, sizeof sb);
        akv_request *ra, *rb;
        akv_request_params pa = greedy(tokens, 40, 12, &sa), pb = greedy(tokens, 40, 5, &sb);
        CHECK_OK(akv_engine_submit(e, &pa, &ra, NULL));
        CHECK_OK(akv_engine_step(e, NULL));
        CHECK_OK(akv_engine_submit(e, &pb, &rb, NULL));
        for (int k = 0; k < 40 && (sa.n < 12 || sb.n < 5); k++) CHECK_OK(akv_engine_step(e, NULL));
        CHECK(sa.n == 12 && sb.n == 5);
        CHECK(memcmp(sa.tok, sb.tok, 5 * sizeof sa.tok[0]) == 0);
        akv_engine_stats es;
        akv_engine_get_stats(e, &es);
        akv_request_info ib;
        akv_request_get_info(rb, &ib);
        printf("  host pages %llu, idle %u (%llu closed), forked %llu, B reused %u\n",
               (unsigned long long)host_pages, es.n_idle, (unsigned long long)es.n_idle_closed,
               (unsigned long long)es.n_forked, ib.n_cached);
        CHECK_OK(akv__engine_check(e));
        akv_engine_release(e, ra), akv_engine_release(e, rb);
        akv_engine_destroy(e);
        akv_model_destroy(mb);
    }

    TEST_CASE(sessions_saved_and_restored) {
        /* A conversation saved after its first turn, restored into another engine: its next
         * turn reuses the restored context and gives the uninterrupted run's logits bit for
         * bit. Damaged, cut, lengthened and foreign files load nothing; a save that cannot be
         * written keeps the conversation and any earlier file. */
        char path[] = "/tmp/akv_sess_XXXXXX";
        if (!CHECK(temp_file(path))) break;
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 2;
        akv_engine *a = engine_open(model, &ep);
        if (!a) break;
        static seen t1, t2, t2b;
        memset(&t1, 0, sizeof t1), memset(&t2, 0, sizeof t2), memset(&t2b, 0, sizeof t2b);
        akv_request *ra, *rb;
        akv_request_params p1 = greedy(tokens, 40, 6, &t1);
        CHECK_OK(akv_engine_submit(a, &p1, &ra, NULL));
        CHECK(run_all(a, 100) > 0);
        int32_t conv[80];
        next_turn(conv, tokens, 40, &t1, 6, 400, 12); /* the next turn */
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        CHECK_STATUS(akv_engine_session_save(a, conv, 46, "/nonexistent/dir/s.akv"), AKV_EIO);
        CHECK_STATUS(akv_engine_session_save(a, tokens + 300, 5, path), AKV_ENOTFOUND);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK_OK(akv_engine_session_save(a, conv, 46, path)); /* the context is still there */
        akv_request_params p2 = greedy(conv, 58, 5, &t2);
        CHECK_OK(akv_engine_submit(a, &p2, &rb, NULL));
        CHECK(run_all(a, 100) > 0);
        akv_engine_release(a, ra), akv_engine_release(a, rb);
        akv_engine_destroy(a);

        akv_engine *b = engine_open(model, &ep);
        if (!b) break;
        uint32_t n = 0;
        CHECK_OK(akv_engine_session_load(b, path, &n));
        CHECK_EQ_INT(n, 45); /* the prompt and the 5 tokens fed: the 6th was sampled, not fed */
        akv_request_params p2b = greedy(conv, 58, 5, &t2b);
        CHECK_OK(akv_engine_submit(b, &p2b, &rb, NULL));
        CHECK(run_all(b, 100) > 0);
        akv_request_info info;
        akv_request_get_info(rb, &info);
        CHECK_EQ_U64(info.n_cached, 45);
        CHECK(t2b.n == 5 && memcmp(t2b.tok, t2.tok, 5 * sizeof t2.tok[0]) == 0);
        CHECK(memcmp(t2b.logits[0], t2.logits[0], sizeof t2.logits[0]) == 0);
        akv_engine_release(b, rb);

        /* the file damaged: one bit flipped (in the K/V, in the tokens), cut, lengthened */
        FILE *f = fopen(path, "rb");
        static uint8_t buf[1 << 20];
        const size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f) fclose(f);
        CHECK(len > 64 && len < sizeof buf);
        akv_engine_stats s0, s1;
        akv_engine_get_stats(b, &s0);
        const size_t at[] = {len / 2, 64 + 4, 20, len - 3};
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        for (int k = 0; k < 7; k++) {
            char bad[] = "/tmp/akv_sess_bad_XXXXXX";
            int bfd = mkstemp(bad);
            if (!CHECK(bfd >= 0)) break;
            FILE *w = fdopen(bfd, "wb");
            if (k < 4) buf[at[k]] ^= 0x10;
            const size_t wlen = k == 4 ? len - 1 : k == 5 ? len / 3 : len;
            fwrite(buf, 1, wlen, w);
            if (k == 6) fputc(0, w);
            fclose(w);
            if (k < 4) buf[at[k]] ^= 0x10;
            TEST_CHECK_(akv_engine_session_load(b, bad, &n) == AKV_EFORMAT, "damage %d", k);
            remove(bad);
        }
        CHECK_STATUS(akv_engine_session_load(b, "/tmp/akv_no_such_session", &n), AKV_ENOTFOUND);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        akv_engine_get_stats(b, &s1);
        CHECK_EQ_INT(s1.n_idle, s0.n_idle); /* nothing loaded */
        akv_engine_destroy(b);
        /* a model of the same shape and vocabulary with other weights (a fine-tune), and one of
         * another shape, refuse the file */
        const tm_shape d32 = {.arch = "llama", .n_layers = 2, .n_embd = 64, .n_ff = 48,
                              .n_heads = 2, .n_kv_heads = 1, .n_vocab = NV};
        for (int other = 0; other < 2; other++) {
            akv_model *m2 = tm_load(other ? &d32 : &shape, rng + 1);
            akv_engine *e2 = m2 ? engine_open(m2, &ep) : NULL;
            if (e2) {
                akv_log_set(NULL, NULL, AKV_LOG_OFF);
                TEST_CHECK_(akv_engine_session_load(e2, path, &n) == AKV_EFORMAT, "model %d", other);
                akv_log_set(NULL, NULL, AKV_LOG_WARN);
                akv_engine_destroy(e2);
            }
            akv_model_destroy(m2);
        }
        remove(path);
    }

    TEST_CASE(slots_listed_saved_restored_erased) {
        /* llama-server's slots: A runs in slot 0 and B goes idle in slot 1; slot 0 saved,
         * erased (gone from the list, nothing left to save), restored into slot 5 (A's next
         * turn reuses all of it) and into slot 1 in B's place; a file that cannot be loaded
         * leaves a slot as it was; a running request's slot is neither erased nor replaced */
        char path[] = "/tmp/akv_slot_XXXXXX";
        if (!CHECK(temp_file(path))) break;
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 2, ep.max_idle = 8;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        static seen sa, sb, sc, sd;
        memset(&sa, 0, sizeof sa), memset(&sb, 0, sizeof sb), memset(&sc, 0, sizeof sc);
        memset(&sd, 0, sizeof sd);
        akv_request *ra, *rb, *rc, *rd;
        akv_engine_slot sl[4];
        akv_request_params pa = greedy(tokens, 40, 4, &sa);
        pa.id = 77;
        CHECK_OK(akv_engine_submit(e, &pa, &ra, NULL));
        CHECK_OK(akv_engine_step(e, NULL));
        CHECK_EQ_INT(akv_engine_slots(e, sl, 4), 1);
        CHECK(sl[0].id == 0 && sl[0].running && sl[0].request_id == 77);
        CHECK(run_all(e, 100) > 0);
        akv_request_params pb = greedy(tokens + 500, 30, 2, &sb);
        CHECK_OK(akv_engine_submit(e, &pb, &rb, NULL));
        CHECK(run_all(e, 100) > 0);
        CHECK_EQ_INT(akv_engine_slots(e, sl, 4), 2);
        CHECK(sl[0].id == 0 && !sl[0].running && sl[0].n_tokens == 43);
        CHECK(sl[1].id == 1 && !sl[1].running && sl[1].n_tokens == 31);
        uint32_t n = 0;
        CHECK_OK(akv_engine_slot_save(e, 0, path, &n));
        CHECK_EQ_INT(n, 43);
        CHECK_OK(akv_engine_slot_erase(e, 0, &n));
        CHECK_EQ_INT(n, 43);
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        CHECK_STATUS(akv_engine_slot_save(e, 0, path, &n), AKV_ENOTFOUND);
        CHECK_STATUS(akv_engine_slot_erase(e, 7, &n), AKV_ENOTFOUND);
        CHECK_STATUS(akv_engine_slot_restore(e, 1, "/nonexistent/slot.bin", &n), AKV_ENOTFOUND);
        CHECK_STATUS(akv_engine_slot_restore(e, AKV_ENGINE_MAX_SLOT, path, &n), AKV_EINVAL);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK_EQ_INT(akv_engine_slots(e, sl, 4), 1);
        CHECK(sl[0].id == 1 && sl[0].n_tokens == 31); /* B's, as it was */
        CHECK_OK(akv_engine_slot_restore(e, 5, path, &n));
        CHECK_EQ_INT(n, 43);
        CHECK_EQ_INT(akv_engine_slots(e, sl, 4), 2);
        CHECK(sl[0].id == 1 && sl[1].id == 5 && sl[1].n_tokens == 43);
        int32_t next[64];
        akv_request_params pc = greedy(next, next_turn(next, tokens, 40, &sa, 4, 700, 6), 2, &sc);
        CHECK_OK(akv_engine_submit(e, &pc, &rc, NULL));
        CHECK(run_all(e, 100) > 0);
        akv_request_info ic;
        akv_request_get_info(rc, &ic);
        CHECK_EQ_U64(ic.n_cached, 43); /* slot 5's conversation, going on */
        CHECK_OK(akv_engine_slot_restore(e, 1, path, &n)); /* in B's place */
        CHECK_EQ_INT(akv_engine_slots(e, sl, 4), 2);
        CHECK(sl[0].id == 1 && sl[0].n_tokens == 43 && sl[1].id == 5);
        akv_request_params pd = greedy(tokens + 800, 30, 20, &sd);
        CHECK_OK(akv_engine_submit(e, &pd, &rd, NULL));
        CHECK_OK(akv_engine_step(e, NULL));
        CHECK_EQ_INT(akv_engine_slots(e, sl, 4), 3);
        CHECK(sl[0].id == 0 && sl[0].running); /* the lowest free number */
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        CHECK_STATUS(akv_engine_slot_erase(e, 0, &n), AKV_EBUSY);
        CHECK_STATUS(akv_engine_slot_restore(e, 0, path, &n), AKV_EBUSY);
        CHECK_STATUS(akv_engine_slot_save(e, 0, path, &n), AKV_EBUSY);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK(run_all(e, 100) > 0);
        CHECK_OK(akv__engine_check(e));
        akv_engine_destroy(e);
        unlink(path);
    }

    TEST_CASE(session_directory_keeps_closed_conversations) {
        /* With a session directory, an idle conversation closed for room is written there and
         * comes back when its next turn arrives: the same tokens and logits as a run that kept
         * it in memory, its history counted as cached. The files outlive the engine (another
         * engine on the directory finds them); a damaged file is removed and the prompt
         * computed; another salt does not read it; a directory that is not one is refused. */
        char dir[] = "/tmp/akv_sdir_XXXXXX";
        int32_t a1[40], b1[30], a2[58];
        static seen ta, tb, tref, ta2, tb2, tbad, tsalt;
        memset(&tref, 0, sizeof tref), memset(&ta2, 0, sizeof ta2), memset(&tb2, 0, sizeof tb2);
        memset(&tbad, 0, sizeof tbad), memset(&tsalt, 0, sizeof tsalt);
        akv_engine_params ep;
        akv_request *r[4];
        /* A low: read back beside B's idle context, A is still the one kept */
        akv_engine *a = a_then_b(model, tokens, dir, -1, &ep, a1, b1, &ta, &tb, r);
        if (!a) break;
        akv_engine_stats st;
        akv_engine_get_stats(a, &st);
        CHECK_EQ_INT(st.n_idle, 1);
        /* A's next turn at once: its file may still be on its way to the disk (then the
         * request waits for it) */
        memcpy(a2, a1, sizeof a1);
        memcpy(a2 + 40, ta.tok, 6 * sizeof *a2);
        memcpy(a2 + 46, tokens + 400, 12 * sizeof *a2); /* A's next turn */
        akv_request_params pa2 = greedy(a2, 58, 5, &ta2);
        pa2.retention = -1;
        CHECK_OK(akv_engine_submit(a, &pa2, &r[2], NULL));
        CHECK(run_all(a, 100) > 0);
        akv_request_info info;
        akv_request_get_info(r[2], &info);
        CHECK_EQ_U64(info.n_cached, 45); /* its prompt and the 5 tokens fed */
        akv__engine_flush_sessions(a);
        akv_engine_get_stats(a, &st);
        CHECK_EQ_U64(st.n_restored, 1);
        CHECK_EQ_U64(st.n_spilled, 2); /* B's, to make room for A back */
        CHECK_EQ_U64(st.n_spill_files, 1); /* A's file removed, B's written */
        for (int i = 0; i < 3; i++) akv_engine_release(a, r[i]);
        akv_engine_destroy(a); /* the idle A goes to the directory too */

        same_as_kept_in_memory(model, a1, a2, &tref, &ta2);

        /* another engine on the directory: B's file and A's (its second turn) are found; B's
         * next turn reads B back */
        akv_engine *c = engine_open(model, &ep);
        if (!c) break;
        akv_engine_get_stats(c, &st);
        CHECK_EQ_U64(st.n_spill_files, 2);
        int32_t b2[50];
        memcpy(b2, b1, sizeof b1);
        memcpy(b2 + 30, tb.tok, 4 * sizeof *b2);
        memcpy(b2 + 34, tokens + 500, 16 * sizeof *b2);
        akv_request_params pb2 = greedy(b2, 50, 3, &tb2);
        CHECK_OK(akv_engine_submit(c, &pb2, &r[0], NULL));
        CHECK(run_all(c, 100) > 0);
        akv_request_get_info(r[0], &info);
        CHECK_EQ_U64(info.n_cached, 33);
        /* another tenant's prompt with A's history does not read A's file */
        akv_request_params ps = greedy(a2, 58, 2, &tsalt);
        ps.cache_salt = 7;
        CHECK_OK(akv_engine_submit(c, &ps, &r[1], NULL));
        CHECK(run_all(c, 100) > 0);
        akv_request_get_info(r[1], &info);
        CHECK_EQ_U64(info.n_cached, 0);
        akv_engine_get_stats(c, &st);
        CHECK_EQ_U64(st.n_restored, 1);
        CHECK(st.restore_s > 0 && st.restore_disk_s >= 0 && st.restore_disk_s <= st.restore_s);
        /* B's file is gone once read back (its removal queued behind the writes): A's is left,
         * with whatever the engine wrote since */
        akv__engine_flush_sessions(c);
        akv_engine_get_stats(c, &st); /* the writes the flush waited for are counted now */
        CHECK_EQ_INT(dir_each(dir, NULL), (int)(1 + st.n_spilled));
        akv_engine_release(c, r[0]), akv_engine_release(c, r[1]);
        akv_engine_destroy(c);

        /* every file damaged in its K/V: removed, the prompt computed, the same answer */
        const int n_files = dir_each(dir, file_damage);
        CHECK(n_files >= 2);
        ep.max_idle = 4;
        akv_engine *g = engine_open(model, &ep);
        if (!g) break;
        akv_request_params pbad = greedy(a2, 58, 5, &tbad);
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        CHECK_OK(akv_engine_submit(g, &pbad, &r[0], NULL));
        CHECK(run_all(g, 100) > 0);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        akv_request_get_info(r[0], &info);
        CHECK_EQ_U64(info.n_cached, 0);
        CHECK(tbad.n == 5 && memcmp(tbad.tok, tref.tok, 5 * sizeof tref.tok[0]) == 0);
        akv_engine_get_stats(g, &st);
        CHECK_EQ_U64(st.n_restored, 0);
        CHECK_EQ_U64(st.n_spill_files, (uint64_t)n_files - 1);
        akv_engine_release(g, r[0]);
        akv_engine_destroy(g);

        /* not a directory */
        ep.session_dir = "/nonexistent/akv/dir";
        akv_engine_params bad = ep;
        CHECK_OK(akv_dev_create(akv_dev_host_backend(), NULL, &bad.dev));
        bad.model = model, bad.page_tokens = P, bad.max_context = 256, bad.chunk = 16;
        akv_engine *none = NULL;
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        CHECK_STATUS(akv_engine_create(&bad, &none), AKV_EINVAL);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        dir_each(dir, file_remove);
        rmdir(dir);
    }

    TEST_CASE(a_conversation_read_back_off_the_engine_thread) {
        /* A returning conversation's file is read off the engine's thread: while its read is
         * held (akv__engine_hold_restores) the request waits, not started, and another request
         * prefills and decodes to its end beside it; released, the conversation comes back
         * with the same tokens and logits as one kept in memory. A turn cancelled while its
         * read is held leaves the read to end and be adopted at a later step (the engine busy
         * until then); an engine destroyed while a read is held drops it and leaves its file;
         * a read with no room beside the turn's own reservation is not begun: the turn
         * computes its prompt and the walkers hold at every step. */
        char dir[] = "/tmp/akv_sdir_XXXXXX";
        int32_t a1[40], b1[30], a2[58];
        static seen ta, tb, ta2, tc, tref;
        memset(&ta2, 0, sizeof ta2), memset(&tc, 0, sizeof tc), memset(&tref, 0, sizeof tref);
        akv_engine_params ep;
        akv_request *r[4];
        akv_engine *a = a_then_b(model, tokens, dir, 0, &ep, a1, b1, &ta, &tb, r);
        if (!a) break;
        akv__engine_flush_sessions(a);
        memcpy(a2, a1, sizeof a1);
        memcpy(a2 + 40, ta.tok, 6 * sizeof *a2);
        memcpy(a2 + 46, tokens + 400, 12 * sizeof *a2); /* A's next turn */
        akv_request_params pa2 = greedy(a2, 58, 5, &ta2), pc = greedy(tokens + 600, 20, 8, &tc);
        akv__engine_hold_restores(a, true);
        CHECK_OK(akv_engine_submit(a, &pa2, &r[2], NULL));
        CHECK_OK(akv_engine_submit(a, &pc, &r[3], NULL));
        akv_request_info ia, ic;
        for (int i = 0; i < 40; i++) {
            bool did;
            if (!REQUIRE_OK(akv_engine_step(a, &did)) || !REQUIRE_OK(akv__engine_check(a))) break;
        }
        akv_request_get_info(r[2], &ia);
        akv_request_get_info(r[3], &ic);
        CHECK_EQ_INT(ic.state, AKV_REQUEST_DONE); /* C ran to its end meanwhile */
        CHECK_EQ_INT(tc.n, 8);
        CHECK_EQ_INT(ia.state, AKV_REQUEST_PREFILL); /* A waits for its file, not started */
        CHECK_EQ_INT(ta2.n, 0);
        akv_engine_stats st;
        akv_engine_get_stats(a, &st);
        CHECK_EQ_U64(st.n_restored, 0);
        akv__engine_hold_restores(a, false);
        CHECK(run_all(a, 100) > 0);
        akv_request_get_info(r[2], &ia);
        CHECK_EQ_U64(ia.n_cached, 45);
        akv_engine_get_stats(a, &st);
        CHECK_EQ_U64(st.n_restored, 1);
        for (int i = 0; i < 4; i++) akv_engine_release(a, r[i]);

        /* B's next turn, cancelled while its read is held: released, the read ends at a later
         * step and B is adopted as an idle conversation; the engine is busy until then */
        int32_t b2[40];
        memcpy(b2, b1, sizeof b1);
        memcpy(b2 + 30, tb.tok, 4 * sizeof *b2);
        memcpy(b2 + 34, tokens + 500, 6 * sizeof *b2);
        static seen tb2;
        memset(&tb2, 0, sizeof tb2);
        akv_request_params pb2 = greedy(b2, 40, 2, &tb2);
        akv__engine_flush_sessions(a);
        akv__engine_hold_restores(a, true);
        CHECK_OK(akv_engine_submit(a, &pb2, &r[0], NULL));
        for (int i = 0; i < 3; i++) {
            bool did;
            CHECK_OK(akv_engine_step(a, &did));
        }
        akv_engine_cancel(a, r[0]);
        akv_engine_release(a, r[0]);
        CHECK(akv_engine_busy(a));
        akv__engine_hold_restores(a, false);
        CHECK(run_all(a, 100) == 0); /* nothing to step: the read adopted on the way */
        CHECK(!akv_engine_busy(a));
        akv_engine_get_stats(a, &st);
        CHECK_EQ_U64(st.n_restored, 2);
        CHECK_EQ_INT(tb2.n, 0);

        /* held again at destroy: A's next turn waits for its file, the engine goes, the file
         * stays */
        akv_engine_destroy(a); /* A and B written out */
        a = engine_open(model, &ep);
        if (!a) break;
        const int files = dir_each(dir, NULL);
        static seen ta3;
        memset(&ta3, 0, sizeof ta3);
        akv_request_params pa3 = greedy(a2, 58, 2, &ta3);
        akv__engine_hold_restores(a, true);
        CHECK_OK(akv_engine_submit(a, &pa3, &r[0], NULL));
        for (int i = 0; i < 3; i++) {
            bool did;
            CHECK_OK(akv_engine_step(a, &did));
        }
        CHECK_EQ_INT(ta3.n, 0);
        akv_engine_destroy(a);
        CHECK_EQ_INT(dir_each(dir, NULL), files);
        dir_each(dir, file_remove);

        /* no room for the read beside what the returning turn reserves (a host pool of 40
         * pages, a 14-page file, a turn that may grow to 40): it computes its prompt, the
         * walkers hold at every step, the file stays for later */
        ep.host_pages_max = 40, ep.max_context = 512;
        a = engine_open(model, &ep);
        if (!a) break;
        static seen tl, tz, tl2;
        memset(&tl, 0, sizeof tl), memset(&tz, 0, sizeof tz), memset(&tl2, 0, sizeof tl2);
        akv_request_params pl = greedy(tokens, 100, 4, &tl), pz = greedy(tokens + 900, 10, 2, &tz);
        CHECK_OK(akv_engine_submit(a, &pl, &r[0], NULL));
        CHECK(run_all(a, 200) > 0);
        CHECK_OK(akv_engine_submit(a, &pz, &r[1], NULL)); /* the long one to the directory */
        CHECK(run_all(a, 200) > 0);
        akv__engine_flush_sessions(a);
        static int32_t l2[120];
        const uint32_t n2 = next_turn(l2, tokens, 100, &tl, 4, 500, 4);
        akv_request_params pl2 = greedy(l2, n2, 200, &tl2);
        CHECK_OK(akv_engine_submit(a, &pl2, &r[2], NULL));
        CHECK(run_all(a, 400) > 0);
        akv_request_get_info(r[2], &ia);
        CHECK_EQ_INT(ia.state, AKV_REQUEST_DONE);
        CHECK_EQ_U64(ia.n_cached, 0);
        akv_engine_get_stats(a, &st);
        CHECK_EQ_U64(st.n_restored, 0);
        CHECK_EQ_U64(st.n_spill_files, 2); /* the long one's, and the short one's since */
        for (int i = 0; i < 3; i++) akv_engine_release(a, r[i]);
        akv_engine_destroy(a);

        same_as_kept_in_memory(model, a1, a2, &tref, &ta2);
        dir_each(dir, file_remove);
        rmdir(dir);
    }

    TEST_CASE(greedy_choices_by_the_pass_are_the_samplers) {
        /* Requests that sample greedily without penalties or logits take the pass's own choice
         * (AKV_FORWARD_LOGITS_ARGMAX: no row for the sampler); the same requests asking for
         * their logits take the sampler's: the same tokens, alone and batched with others that
         * sample at a temperature (mixed modes in one step). */
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 4;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        static seen by_pass[3], by_sampler[3], hot;
        akv_request *r[4];
        for (int round = 0; round < 2; round++) {
            memset(&hot, 0, sizeof hot);
            for (int i = 0; i < 3; i++) {
                seen *sn = round ? &by_sampler[i] : &by_pass[i];
                memset(sn, 0, sizeof *sn);
                akv_request_params rp = greedy(tokens + 50 * i, 20 + 7 * (uint32_t)i, 12, sn);
                rp.want_logits = round == 1;
                CHECK_OK(akv_engine_submit(e, &rp, &r[i], NULL));
            }
            akv_request_params hp = greedy(tokens + 300, 9, 12, &hot);
            hp.sample.temp = 0.9f, hp.sample.seed = 5;
            CHECK_OK(akv_engine_submit(e, &hp, &r[3], NULL));
            CHECK(run_all(e, 200) > 0);
            for (int i = 0; i < 4; i++) akv_engine_release(e, r[i]);
        }
        for (int i = 0; i < 3; i++) {
            CHECK_EQ_INT(by_pass[i].n, 12);
            CHECK_EQ_INT(by_pass[i].n_logits, 0); /* no row came back */
            CHECK_EQ_INT(by_sampler[i].n_logits, 12);
            CHECK_BYTES(by_pass[i].tok, by_sampler[i].tok, 12 * sizeof by_pass[i].tok[0]);
        }
        akv_engine_destroy(e);
    }

    TEST_CASE(draws_where_the_logits_are) {
        /* On the device pass (the host backend: its op is the reference, akv_fwd_sample_ref) a
         * request at a temperature with no format and no logits wanted is drawn by the pass
         * (AKV_FORWARD_LOGITS_SAMPLE: no row comes back). With top_k 1 the draw is the
         * penalised argmax, so its tokens must be the host sampler's (host_sampling) exactly,
         * penalties and all; seeded draws at a temperature give the same tokens run to run. */
        static seen top1[2], hot[3][2];
        for (int run = 0; run < 3; run++) {
            akv_engine_params ep = akv_engine_default_params();
            ep.max_seqs = 3, ep.pass = AKV_ENGINE_PASS_DEVICE, ep.host_sampling = run == 2;
            akv_engine *e = engine_open(model, &ep);
            if (!e) break;
            akv_request *r[3];
            seen *one = &top1[run == 2];
            memset(one, 0, sizeof *one);
            akv_request_params rp = greedy(tokens + 10, 17, 24, one);
            rp.want_logits = false;
            rp.sample.temp = 0.9f, rp.sample.top_k = 1, rp.sample.repeat_penalty = 1.5f;
            rp.sample.presence_penalty = 0.5f, rp.sample.frequency_penalty = 0.3f;
            CHECK_OK(akv_engine_submit(e, &rp, &r[0], NULL));
            for (int i = 0; i < 2; i++) {
                memset(&hot[run][i], 0, sizeof hot[run][i]);
                akv_request_params hp = greedy(tokens + 200 + 30 * i, 9 + i, 20, &hot[run][i]);
                hp.want_logits = false;
                hp.sample = akv_sample_default_params();
                hp.sample.seed = 11 + (uint64_t)i, hp.sample.repeat_penalty = 1.2f;
                CHECK_OK(akv_engine_submit(e, &hp, &r[1 + i], NULL));
            }
            CHECK(run_all(e, 200) > 0);
            akv_engine_stats st;
            akv_engine_get_stats(e, &st);
            if (run == 2) CHECK_EQ_U64(st.pass_draws, 0);
            else CHECK_EQ_U64(st.pass_draws, 24 + 20 + 20); /* the first tokens too */
            for (int i = 0; i < 3; i++) akv_engine_release(e, r[i]);
            akv_engine_destroy(e);
        }
        /* a step that fails on a transient fault and is redone draws with the same uniform:
         * the seeded request's tokens are those of the run without the fault */
        static seen redo;
        memset(&redo, 0, sizeof redo);
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 3, ep.pass = AKV_ENGINE_PASS_DEVICE;
        akv_engine *e = engine_open(model, &ep);
        if (e) {
            akv_request *rr;
            akv_request_params hp = greedy(tokens + 200, 9, 20, &redo);
            hp.want_logits = false;
            hp.sample = akv_sample_default_params();
            hp.sample.seed = 11, hp.sample.repeat_penalty = 1.2f;
            CHECK_OK(akv_engine_submit(e, &hp, &rr, NULL));
            for (int i = 0; i < 4; i++) CHECK_OK(akv_engine_step(e, NULL));
            akv_log_set(NULL, NULL, AKV_LOG_OFF);
            CHECK_OK(akv_dev_inject_fault(akv_engine_dev(e), AKV_FAULT_OP, 2, 0));
            CHECK(akv_engine_step(e, NULL) != AKV_OK);
            CHECK_OK(akv_dev_clear_faults(akv_engine_dev(e)));
            akv_log_set(NULL, NULL, AKV_LOG_WARN);
            CHECK(run_all(e, 200) > 0);
            akv_request_info ri;
            akv_request_get_info(rr, &ri);
            CHECK_EQ_INT(ri.n_retries, 1);
            akv_engine_release(e, rr);
            akv_engine_destroy(e);
            CHECK_EQ_INT(redo.n, 20);
            CHECK_BYTES(redo.tok, hot[0][0].tok, 20 * sizeof redo.tok[0]);
        }
        CHECK_EQ_INT(top1[0].n, 24);
        CHECK_EQ_INT(top1[0].n_logits, 0);
        CHECK_BYTES(top1[0].tok, top1[1].tok, 24 * sizeof top1[0].tok[0]);
        for (int i = 0; i < 2; i++) {
            CHECK_EQ_INT(hot[0][i].n, 20);
            CHECK_EQ_INT(hot[0][i].n_logits, 0);
            CHECK_BYTES(hot[0][i].tok, hot[1][i].tok, 20 * sizeof hot[0][i].tok[0]);
        }
    }

    TEST_CASE(logit_bias_moves_the_choice) {
        /* -100 on a greedy answer's first token: another first token, and that one never; +100
         * on a token: every token is it; the same on the device pass (the host samples a biased
         * request: no draw by the pass); bad biases refused by name */
        for (int pass = 0; pass < 2; pass++) {
            akv_engine_params ep = akv_engine_default_params();
            ep.max_seqs = 2;
            if (pass) ep.pass = AKV_ENGINE_PASS_DEVICE;
            akv_engine *e = engine_open(model, &ep);
            if (!e) break;
            static seen base, ban, force;
            memset(&base, 0, sizeof base), memset(&ban, 0, sizeof ban), memset(&force, 0, sizeof force);
            akv_request *r[3];
            akv_request_params bp = greedy(tokens + 5, 20, 6, &base);
            bp.want_logits = false;
            CHECK_OK(akv_engine_submit(e, &bp, &r[0], NULL));
            CHECK(run_all(e, 100) > 0);
            const akv_logit_bias no_first = {base.tok[0], -100}, always = {7, 100};
            akv_request_params np = bp, fp = bp;
            np.user = &ban, np.bias = &no_first, np.n_bias = 1;
            fp.user = &force, fp.bias = &always, fp.n_bias = 1;
            fp.ignore_eog = true;
            CHECK_OK(akv_engine_submit(e, &np, &r[1], NULL));
            CHECK_OK(akv_engine_submit(e, &fp, &r[2], NULL));
            CHECK(run_all(e, 100) > 0);
            CHECK(ban.n >= 1 && ban.tok[0] != base.tok[0]);
            for (uint32_t i = 0; i < ban.n; i++) CHECK(ban.tok[i] != base.tok[0]);
            CHECK_EQ_INT(force.n, 6);
            for (uint32_t i = 0; i < force.n; i++) CHECK_EQ_INT(force.tok[i], 7);
            akv_engine_stats st;
            akv_engine_get_stats(e, &st);
            CHECK_EQ_U64(st.pass_draws, 0);
            const akv_logit_bias bad[2] = {{(int32_t)NV + 3, 1}, {1, NAN}};
            akv_log_set(NULL, NULL, AKV_LOG_OFF);
            for (int b = 0; b < 2; b++) {
                akv_request_params xp = bp;
                xp.bias = &bad[b], xp.n_bias = 1;
                akv_request *rx = NULL;
                akv_refusal rf;
                CHECK_STATUS(akv_engine_submit(e, &xp, &rx, &rf), AKV_EINVAL);
                CHECK(rf.reason == AKV_REFUSE_INVALID && strstr(rf.field, "logit_bias") != NULL);
            }
            akv_log_set(NULL, NULL, AKV_LOG_WARN);
            for (int i = 0; i < 3; i++) akv_engine_release(e, r[i]);
            akv_engine_destroy(e);
        }
    }

    TEST_CASE(trace_follows_every_token) {
        /* A trace at the spans level over three requests: valid Chrome JSON with the engine's
         * track and one per request, each request's time queued once, one prefill or decode
         * span a step it took part in and one emit span a token, a sample span a token the
         * host sampled (the one at a temperature); its last counters are the end report's
         * figures. The same work with a trace at level off (and with none) makes the same
         * allocations, and the trace takes no lock. */
        uint64_t allocs[2] = {0, 0};
        for (int level = 2; level >= 0; level--) {
            akv_trace *tr = NULL;
            if (!REQUIRE_OK(akv_trace_create((akv_trace_level)level, 1 << 16, &tr))) break;
            for (int with = level ? 1 : 0; with < 2; with++) {
                akv_engine_params ep = akv_engine_default_params();
                ep.max_seqs = 3, ep.trace = with ? tr : NULL;
                akv_engine *e = engine_open(model, &ep);
                if (!e) break;
                static seen sn[3];
                akv_request *r[3];
                uint64_t ids[3];
                const uint64_t a0 = akv__alloc_calls();
                for (int i = 0; i < 3; i++) {
                    memset(&sn[i], 0, sizeof sn[i]);
                    akv_request_params rp = greedy(tokens + 40 * i, 20 + 9 * (uint32_t)i, 10 + (uint32_t)i, &sn[i]);
                    rp.want_logits = false;
                    if (i == 2) rp.sample.temp = 0.8f, rp.sample.seed = 3;
                    CHECK_OK(akv_engine_submit(e, &rp, &r[i], NULL));
                    akv_request_info info;
                    akv_request_get_info(r[i], &info);
                    ids[i] = info.serial;
                }
                CHECK(run_all(e, 300) > 0);
                if (!level) allocs[with] = akv__alloc_calls() - a0;
                akv_engine_stats st;
                akv_engine_get_stats(e, &st);
                for (int i = 0; i < 3; i++) akv_engine_release(e, r[i]);
                akv_engine_destroy(e);
                if (level != AKV_TRACE_SPANS) continue;
                char *js = NULL;
                if (!REQUIRE_OK(akv_trace_json(tr, &js, NULL))) break;
                cJSON *doc = cJSON_Parse(js);
                const cJSON *ev = cJSON_GetObjectItem(doc, "traceEvents");
                CHECK(cJSON_IsArray(ev));
                CHECK_EQ_INT(trace_count(ev, "M", "thread_name", AKV_TRACE_TRACK_ENGINE, -1), 1);
                CHECK_EQ_INT(trace_count(ev, "X", "step", AKV_TRACE_TRACK_ENGINE, -1) +
                                 trace_count(ev, "X", "decode step", AKV_TRACE_TRACK_ENGINE, -1),
                             (int)st.n_steps);
                for (int i = 0; i < 3; i++) {
                    const int tid = AKV_TRACE_TRACK_REQUEST + (int)ids[i];
                    CHECK_EQ_INT(trace_count(ev, "M", "thread_name", tid, -1), 1);
                    CHECK_EQ_INT(trace_count(ev, "X", "queued", tid, -1), 1);
                    CHECK_EQ_INT(trace_count(ev, "X", "emit", tid, 1), (int)sn[i].n); /* a token each */
                    CHECK_EQ_INT(trace_count(ev, "X", "decode", tid, -1), (int)sn[i].n - 1);
                    CHECK(trace_count(ev, "X", "prefill", tid, -1) >= 1);
                    const int sampled = i == 2 ? (int)sn[i].n : 0; /* the host samples at a temperature */
                    CHECK_EQ_INT(trace_count(ev, "X", "sample", tid, -1), sampled);
                }
                /* the last counters: the end report's */
                CHECK_EQ_U64((uint64_t)trace_last(ev, "generated tokens"), st.gen_tokens);
                CHECK_EQ_U64((uint64_t)trace_last(ev, "prompt tokens"), st.prompt_tokens);
                CHECK_EQ_U64((uint64_t)trace_last(ev, "steps"), st.n_steps);
                cJSON_Delete(doc);
                akv__free(js);
            }
            akv_trace_stats ts;
            akv_trace_get_stats(tr, &ts);
            if (level == AKV_TRACE_OFF) CHECK_EQ_U64(ts.n_locks, 0);
            else CHECK(ts.n_events > 0 && ts.n_dropped == 0);
            akv_trace_destroy(tr);
        }
        CHECK_EQ_U64(allocs[1], allocs[0]);
    }

    TEST_CASE(a_full_disk_loses_nothing) {
        /* The disk full (a file size limit: writes past it fail with EFBIG, as on a full
         * disk): saving a session is refused with AKV_EIO and the conversation stays in memory
         * (its next turn reuses it); any earlier file stays whole; with a session directory the
         * conversations that cannot be written are closed as without one, and answers go on */
        char dir[] = "/tmp/akv_full_XXXXXX";
        if (!CHECK(mkdtemp(dir) != NULL)) break;
        char path[600];
        snprintf(path, sizeof path, "%s/s.akvs", dir);
        struct rlimit old_lim;
        getrlimit(RLIMIT_FSIZE, &old_lim);
        void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 2;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        static seen t1, t2;
        memset(&t1, 0, sizeof t1), memset(&t2, 0, sizeof t2);
        akv_request *q1, *q2;
        akv_request_params p1 = greedy(tokens, 40, 6, &t1);
        CHECK_OK(akv_engine_submit(e, &p1, &q1, NULL));
        CHECK(run_all(e, 100) > 0);
        CHECK_OK(akv_engine_session_save(e, tokens, 46, path)); /* a whole earlier file */
        FILE *f = fopen(path, "rb");
        long whole = -1;
        if (f) fseek(f, 0, SEEK_END), whole = ftell(f), fclose(f);
        const struct rlimit small = {.rlim_cur = 4096, .rlim_max = old_lim.rlim_max};
        CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        CHECK_STATUS(akv_engine_session_save(e, tokens, 46, path), AKV_EIO);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK(setrlimit(RLIMIT_FSIZE, &old_lim) == 0);
        f = fopen(path, "rb");
        long now = -2;
        if (f) fseek(f, 0, SEEK_END), now = ftell(f), fclose(f);
        CHECK(whole > 4096 && now == whole); /* the earlier file as it was */
        CHECK_EQ_INT(dir_each(dir, NULL), 1); /* no temporary file left */
        int32_t next[52];
        akv_request_params p2 = greedy(next, next_turn(next, tokens, 40, &t1, 6, 700, 6), 3, &t2);
        CHECK_OK(akv_engine_submit(e, &p2, &q2, NULL));
        CHECK(run_all(e, 100) > 0);
        akv_request_info info;
        akv_request_get_info(q2, &info);
        CHECK_EQ_U64(info.n_cached, 45); /* the conversation stayed */
        akv_engine_release(e, q1), akv_engine_release(e, q2);
        akv_engine_destroy(e);

        /* a session directory on the full disk: nothing written, every answer given */
        ep.max_idle = 1, ep.session_dir = dir;
        e = engine_open(model, &ep);
        if (!e) break;
        CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        static seen ts[4];
        for (int i = 0; i < 4; i++) {
            memset(&ts[i], 0, sizeof ts[i]);
            akv_request_params rp = greedy(tokens + 300 + 100 * i, 30, 4, &ts[i]); /* not the file's */
            akv_request *rq;
            CHECK_OK(akv_engine_submit(e, &rp, &rq, NULL));
            CHECK(run_all(e, 100) > 0);
            CHECK_EQ_INT(ts[i].n, 4);
            akv_engine_release(e, rq);
        }
        akv__engine_flush_sessions(e);
        akv_engine_stats st;
        akv_engine_get_stats(e, &st);
        CHECK_EQ_U64(st.n_spill_files, 1); /* the earlier file only */
        CHECK(st.n_idle_closed >= 3);
        akv_engine_destroy(e);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK(setrlimit(RLIMIT_FSIZE, &old_lim) == 0);
        signal(SIGXFSZ, old_sig);
        CHECK_EQ_INT(dir_each(dir, file_remove), 1); /* no temporary file left by the failed writes */
        rmdir(dir);
    }

    TEST_CASE(refusal_and_queueing_by_the_plan) {
        akv_engine_params ep = akv_engine_default_params();
        ep.max_context = 64;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        seen s = {0};
        akv_request *ra = NULL, *rb = NULL;
        akv_refusal rf;
        akv_request_params pa = greedy(tokens, 8, 8, &s);
        CHECK_OK(akv_engine_submit(e, &pa, &ra, &rf));
        /* refuse mode (no queue): a second request while the one sequence runs */
        CHECK_STATUS(akv_engine_submit(e, &pa, &rb, &rf), AKV_EFULL);
        CHECK(rb == NULL && rf.reason == AKV_REFUSE_BUSY && !strcmp(rf.field, "max_seqs"));
        /* never fits: past max_context, an empty prompt, a token outside the vocabulary */
        akv_request_params big = greedy(tokens, 60, 8, &s);
        CHECK_STATUS(akv_engine_submit(e, &big, &rb, &rf), AKV_EFULL);
        CHECK(rf.reason == AKV_REFUSE_CONTEXT && !strcmp(rf.field, "max_context"));
        printf("  refused: %s\n", rf.message);
        akv_request_params empty = greedy(tokens, 0, 8, &s);
        CHECK_STATUS(akv_engine_submit(e, &empty, &rb, &rf), AKV_EINVAL);
        CHECK(rf.reason == AKV_REFUSE_INVALID);
        int32_t bad[2] = {1, NV};
        akv_request_params pbad = greedy(bad, 2, 8, &s);
        CHECK_STATUS(akv_engine_submit(e, &pbad, &rb, &rf), AKV_EINVAL);
        CHECK(run_all(e, 100) > 0);
        akv_engine_release(e, ra);
        akv_engine_destroy(e);

        /* queue mode: one waits, the next is refused (the queue is full); the waiting one
         * starts when the first leaves */
        ep.max_queue = 1;
        e = engine_open(model, &ep);
        if (!e) break;
        seen s1 = {0}, s2 = {0};
        akv_request_params p1 = greedy(tokens, 8, 8, &s1), p2 = greedy(tokens + 50, 8, 8, &s2);
        akv_request *q1, *q2, *q3 = NULL;
        CHECK_OK(akv_engine_submit(e, &p1, &q1, NULL));
        CHECK_OK(akv_engine_submit(e, &p2, &q2, NULL));
        CHECK_STATUS(akv_engine_submit(e, &p2, &q3, &rf), AKV_EFULL);
        CHECK(rf.reason == AKV_REFUSE_QUEUE && !strcmp(rf.field, "max_queue"));
        akv_request_info i2;
        akv_request_get_info(q2, &i2);
        CHECK(i2.state == AKV_REQUEST_QUEUED);
        CHECK(run_all(e, 100) > 0);
        CHECK(s1.n == 8 && s2.n == 8);
        akv_request_get_info(q2, &i2);
        akv_request_info i1;
        akv_request_get_info(q1, &i1);
        CHECK(i2.t_admit >= i1.t_done); /* it waited for the first to leave */
        akv_engine_stats st;
        akv_engine_get_stats(e, &st);
        CHECK_EQ_U64(st.n_refused[AKV_REFUSE_QUEUE], 1);
        akv_engine_release(e, q1), akv_engine_release(e, q2);
        akv_engine_destroy(e);

        /* a plan that does not fit: refused at create, naming the field */
        akv_engine_params huge = akv_engine_default_params();
        huge.max_context = 1u << 30, huge.max_seqs = 64, huge.page_tokens = P, huge.model = model;
        CHECK_OK(akv_dev_create(akv_dev_host_backend(), NULL, &huge.dev));
        akv_engine *none = NULL;
        CHECK_STATUS(akv_engine_create(&huge, &none), AKV_EFULL);
        CHECK(none == NULL);
        huge = akv_engine_default_params(); /* a step budget below one chunk + the decodes */
        huge.max_context = 128, huge.page_tokens = P, huge.model = model, huge.max_seqs = 8;
        huge.chunk = 64, huge.step_tokens = 32;
        CHECK_OK(akv_dev_create(akv_dev_host_backend(), NULL, &huge.dev));
        CHECK_STATUS(akv_engine_create(&huge, &none), AKV_EINVAL);
        /* pools of 0 GiB are refused (the operator sizes them; nothing stands in for 0) */
        for (int which = 0; which < 2; which++) {
            huge = akv_engine_default_params();
            huge.max_context = 64, huge.page_tokens = P, huge.model = model;
            if (which) huge.device_gib = 0;
            else huge.host_gib = 0;
            CHECK_OK(akv_dev_create(akv_dev_host_backend(), NULL, &huge.dev));
            CHECK(akv_engine_create(&huge, &none) != AKV_OK && none == NULL);
            if (none) akv_engine_destroy(none);
        }
    }

    TEST_CASE(cancel_mid_prefill_and_mid_decode_with_faults) {
        /* the device pass on the host backend (queued routes, faults can be injected):
         * cancels at once (one last event, then none), the sequence's pages freed only after
         * the step's fences; a step that fails on an injected fault is redone */
        for (int staged = 0; staged < 2; staged++) {
            akv_engine_params ep = akv_engine_default_params();
            ep.max_seqs = 2, ep.pass = AKV_ENGINE_PASS_DEVICE;
            ep.step_tokens =
                16 + 5; /* step 1: a's first chunk and b's prompt; then a chunk a step */
            ep.route = route_kind(staged ? "staged" : "resident"), ep.window_pages = 2;
            akv_engine *e = engine_open(model, &ep);
            if (!e) break;
            akv_dev *dev = akv_engine_dev(e);
            seen a = {0}, b = {0};
            akv_request *ra, *rb;
            akv_request_params pa = greedy(tokens, 70, 30, &a), pb = greedy(tokens + 100, 5, 30, &b);
            CHECK_OK(akv_engine_submit(e, &pa, &ra, NULL));
            CHECK_OK(akv_engine_submit(e, &pb, &rb, NULL));
            CHECK_OK(akv_engine_step(e, NULL));
            CHECK_OK(akv_engine_step(e, NULL));
            CHECK_OK(akv_dev_inject_delays(dev, 5, 5000, 1));
            /* a is in its prefill (70 tokens in chunks of 16), b decodes */
            akv_request_info ia;
            akv_request_get_info(ra, &ia);
            CHECK(ia.state == AKV_REQUEST_PREFILL);
            akv_engine_cancel(e, ra);
            CHECK(a.finish == AKV_FINISH_CANCELLED && a.n_final == 1);
            CHECK_OK(akv__engine_check(e));
            /* b fails a step on a transient fault, and goes on */
            CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_OP, 2, 0));
            akv_status st = akv_engine_step(e, NULL);
            CHECK(st != AKV_OK);
            CHECK_OK(akv_dev_clear_faults(dev));
            for (int i = 0; i < 5; i++) CHECK_OK(akv_engine_step(e, NULL));
            CHECK_OK(akv__engine_check(e));
            akv_request_info ib;
            akv_request_get_info(rb, &ib);
            CHECK(ib.state == AKV_REQUEST_DECODE && ib.n_retries == 1);
            akv_engine_cancel(e, rb); /* mid-decode */
            CHECK(b.finish == AKV_FINISH_CANCELLED && b.n_final == 1);
            uint32_t nb = b.n;
            for (int i = 0; i < 3; i++) CHECK_OK(akv_engine_step(e, NULL));
            CHECK_EQ_U64(b.n, nb); /* nothing after the cancel */
            CHECK(!a.after_final && !b.after_final);
            CHECK_OK(akv_dev_inject_delays(dev, 5, 0, 1));
            CHECK_OK(akv_route_sync(akv_engine_route(e)));
            CHECK_OK(akv__engine_check(e));
            akv_engine_release(e, ra), akv_engine_release(e, rb);
            akv_engine_destroy(e);
        }
    }

    TEST_CASE(idle_context_reused_by_prefix) {
        /* A finishes; B's prompt is A's prompt + A's reply + more: B reuses A's context (its
         * shared prefix is not computed again) and its logits stay within float error of a
         * fresh run's */
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 2, ep.max_idle = 4;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        seen a = {0}, b = {0}, f = {0};
        akv_request *ra, *rb, *rf;
        akv_request_params pa = greedy(tokens, 30, 10, &a);
        CHECK_OK(akv_engine_submit(e, &pa, &ra, NULL));
        CHECK(run_all(e, 100) > 0);
        int32_t pb_tok[64];
        const uint32_t nb = next_turn(pb_tok, tokens, 30, &a, a.n, 500, 12);
        akv_request_params pb = greedy(pb_tok, nb, 6, &b);
        CHECK_OK(akv_engine_submit(e, &pb, &rb, NULL));
        CHECK(run_all(e, 100) > 0);
        akv_request_info ib;
        akv_request_get_info(rb, &ib);
        /* A's context holds its prompt and the tokens it fed (its last sampled one was not) */
        CHECK_EQ_U64(ib.n_cached, 30 + a.n - 1);
        akv_engine_destroy(e);
        ep.no_reuse = true;
        e = engine_open(model, &ep);
        if (!e) break;
        akv_request_params pf = greedy(pb_tok, nb, 6, &f);
        CHECK_OK(akv_engine_submit(e, &pf, &rf, NULL));
        CHECK(run_all(e, 100) > 0);
        size_t at;
        CHECK(fx_rel_err(b.logits[0], f.logits[0], NV, &at) < 1e-4);
        akv_engine_destroy(e);
    }

    TEST_CASE(conversations_share_a_prefix_by_reference) {
        /* A (a 40-token system prompt and a question) finishes and is idle. B (the same 40
         * tokens, another question) starts from a fork of A that shares A's two full pages of
         * the prefix and copies the partial third: B computes only its own tokens, A stays
         * whole. C, A's conversation going on, then reuses all of A (no fork). B's logits are
         * B's alone, bit for bit; a salted request shares nothing */
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 2, ep.max_idle = 4;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        const uint32_t n_layers = akv_engine_get_plan(e)->geom.n_layers;
        static seen a, b, c, d, f;
        memset(&a, 0, sizeof a), memset(&b, 0, sizeof b), memset(&c, 0, sizeof c);
        memset(&d, 0, sizeof d), memset(&f, 0, sizeof f);
        akv_request *ra, *rb, *rc, *rd, *rf;
        akv_request_params pa = greedy(tokens, 60, 5, &a);
        CHECK_OK(akv_engine_submit(e, &pa, &ra, NULL));
        CHECK(run_all(e, 100) > 0);
        int32_t pb_tok[60];
        memcpy(pb_tok, tokens, 40 * sizeof *pb_tok);
        for (int i = 40; i < 60; i++) pb_tok[i] = (tokens[i] + 1 + i) % NV; /* not A's */
        akv_request_params pb = greedy(pb_tok, 60, 5, &b);
        CHECK_OK(akv_engine_submit(e, &pb, &rb, NULL));
        CHECK_OK(akv_engine_step(e, NULL));
        akv_host_pool_stats hs;
        akv_host_pool_get_stats(akv_engine_host_pool(e), &hs);
        CHECK_EQ_U64(hs.n_shares, 2u * n_layers); /* pages 0 and 1 of every layer: A's and B's */
        CHECK_OK(akv__engine_check(e));
        CHECK(run_all(e, 100) > 0);
        akv_request_info ib;
        akv_request_get_info(rb, &ib);
        CHECK_EQ_U64(ib.n_cached, 40);
        akv_engine_stats es;
        akv_engine_get_stats(e, &es);
        CHECK_EQ_U64(es.n_forked, 1);
        CHECK_EQ_INT(es.n_idle, 2);
        int32_t pc_tok[80];
        akv_request_params pc = greedy(pc_tok, next_turn(pc_tok, tokens, 60, &a, 5, 700, 10), 3, &c);
        CHECK_OK(akv_engine_submit(e, &pc, &rc, NULL));
        CHECK(run_all(e, 100) > 0);
        akv_request_info ic;
        akv_request_get_info(rc, &ic);
        CHECK_EQ_U64(ic.n_cached, 64); /* A's prompt and the 4 replies it fed: A, whole */
        akv_engine_get_stats(e, &es);
        CHECK_EQ_U64(es.n_forked, 1); /* A was taken on, not forked */
        akv_request_params pd = greedy(pb_tok, 60, 5, &d);
        pd.cache_salt = 3;
        CHECK_OK(akv_engine_submit(e, &pd, &rd, NULL));
        CHECK(run_all(e, 100) > 0);
        akv_request_info id;
        akv_request_get_info(rd, &id);
        CHECK_EQ_U64(id.n_cached, 0);
        CHECK_OK(akv__engine_check(e));
        akv_engine_destroy(e);
        ep.no_reuse = true;
        if (!(e = engine_open(model, &ep))) break;
        akv_request_params pf = greedy(pb_tok, 60, 5, &f);
        CHECK_OK(akv_engine_submit(e, &pf, &rf, NULL));
        CHECK(run_all(e, 100) > 0);
        CHECK(b.n == 5 && memcmp(b.tok, f.tok, sizeof b.tok[0] * 5) == 0);
        CHECK(memcmp(d.tok, f.tok, sizeof d.tok[0] * 5) == 0);
        CHECK(b.n_logits == 5 && f.n_logits == 5); /* bit for bit: the host pass is batch-invariant */
        CHECK(memcmp(b.logits, f.logits, 5 * sizeof b.logits[0]) == 0);
        akv_engine_destroy(e);
    }

    TEST_CASE(admission_counts_a_shared_page_once) {
        /* A host pool of 20 pages (2 layers: 10 of 16 tokens a layer). A (48 tokens of a
         * system prompt, 8 of its own, 8 to generate: 8 pages) runs; then B..H, the same 48
         * and 8 of their own each. Each of them will share A's 3 full pages of every layer, so
         * it needs 2 pages more, not 8: six are admitted beside A (8 + 6 x 2 = 20), H waits;
         * counting every reservation whole would have admitted one. Every request's tokens and
         * logits are its own, bit for bit. Salted, they share nothing and two run. */
        int32_t pt[8][56];
        for (int r = 0; r < 8; r++) {
            memcpy(pt[r], tokens, 48 * sizeof pt[r][0]);
            for (int i = 48; i < 56; i++) pt[r][i] = (tokens[i] + 3 * r + i) % NV;
        }
        static seen sh[8], solo[8];
        for (int salted = 0; salted < 2; salted++) {
            akv_engine_params ep = akv_engine_default_params();
            ep.max_seqs = 8, ep.max_queue = 8, ep.max_idle = 8, ep.host_pages_max = 20;
            akv_engine *e = engine_open(model, &ep);
            if (!e) break;
            CHECK_EQ_U64(akv_engine_get_plan(e)->host_pages, 20);
            akv_request *rq[8];
            memset(sh, 0, sizeof sh);
            akv_request_params p0 = greedy(pt[0], 56, 8, &sh[0]);
            CHECK_OK(akv_engine_submit(e, &p0, &rq[0], NULL));
            for (int k = 0; k < 20 && sh[0].n == 0; k++) CHECK_OK(akv_engine_step(e, NULL));
            for (int r = 1; r < 8; r++) {
                akv_request_params pr = greedy(pt[r], 56, 8, &sh[r]);
                pr.cache_salt = salted ? (uint64_t)r : 0;
                CHECK_OK(akv_engine_submit(e, &pr, &rq[r], NULL));
            }
            akv_engine_stats es;
            akv_engine_get_stats(e, &es);
            CHECK_EQ_INT(es.n_running, salted ? 2 : 7);
            CHECK_EQ_INT(es.n_queued, salted ? 6 : 1);
            printf("  %s: %u running beside A's prompt, %u waiting; their reservations sum to "
                   "%llu host pages, the pool holds 20\n",
                   salted ? "salted" : "shared", es.n_running, es.n_queued,
                   (unsigned long long)es.host_pages_reserved);
            CHECK_OK(akv__engine_check(e));
            CHECK(run_all(e, 400) > 0);
            akv_engine_get_stats(e, &es);
            CHECK(salted ? es.n_forked == 0 : es.n_forked >= 6); /* one may take an idle one over */
            for (int r = 0; r < 8; r++) {
                akv_request_info in;
                akv_request_get_info(rq[r], &in);
                CHECK_EQ_INT(sh[r].n, 8);
                if (r) TEST_CHECK_(in.n_cached == (salted ? 0u : 48u), "request %d reused %u tokens", r, in.n_cached);
                akv_engine_release(e, rq[r]);
            }
            akv_engine_destroy(e);
            /* each alone, nothing reused */
            ep.no_reuse = true, ep.host_pages_max = 0, ep.max_seqs = 1;
            if (!(e = engine_open(model, &ep))) break;
            for (int r = 0; r < 8; r++) {
                memset(&solo[r], 0, sizeof solo[r]);
                akv_request *one;
                akv_request_params pr = greedy(pt[r], 56, 8, &solo[r]);
                CHECK_OK(akv_engine_submit(e, &pr, &one, NULL));
                CHECK(run_all(e, 100) > 0);
                akv_engine_release(e, one);
                CHECK(memcmp(sh[r].tok, solo[r].tok, 8 * sizeof sh[r].tok[0]) == 0);
                CHECK(sh[r].n_logits == 8 && solo[r].n_logits == 8 &&
                      memcmp(sh[r].logits, solo[r].logits, 8 * sizeof sh[r].logits[0]) == 0);
            }
            akv_engine_destroy(e);
        }
    }

    TEST_CASE(admission_under_a_small_pool_never_sticks) {
        /* Under a pool of 20 host pages (host_pages_max), each without a walker between the
         * steps (the walker syncs the route, which would hide a close not yet done):
         * - idle contexts closed to make room free their pages at the next sync: the trim
         *   counts them free at once, closes no more than the room needs, and the waiting
         *   request runs (it stuck once, the pool's pages still counted in use);
         * - a follow-up turn whose idle conversation holds most of the pool is admitted (to
         *   take it over) though sharing it and keeping it whole would not fit;
         * - a slot's conversation that an admitted request will start from cannot be erased
         *   or replaced until it has started;
         * - a restore over a large conversation counts the pages it replaces once. */
        akv_engine_params ep = akv_engine_default_params();
        ep.max_seqs = 4, ep.max_queue = 4, ep.max_idle = 8, ep.host_pages_max = 20;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        static seen s3[3], sr, sx, sf;
        akv_request *r3[3], *rr, *rx, *rf;
        for (int i = 0; i < 3; i++) { /* three idle contexts of 4 pages each (24 tokens) */
            memset(&s3[i], 0, sizeof s3[i]);
            akv_request_params p = greedy(tokens + 100 * i, 20, 4, &s3[i]);
            p.cache_salt = 10 + (uint64_t)i;
            CHECK_OK(akv_engine_submit(e, &p, &r3[i], NULL));
            for (int k = 0; k < 50 && !s3[i].n_final; k++) CHECK_OK(akv_engine_step(e, NULL));
        }
        memset(&sr, 0, sizeof sr);
        akv_request_params p = greedy(tokens + 500, 20, 76, &sr); /* 96 tokens: 12 pages */
        p.cache_salt = 99;
        CHECK_OK(akv_engine_submit(e, &p, &rr, NULL));
        for (int k = 0; k < 200 && !sr.n_final; k++) CHECK_OK(akv_engine_step(e, NULL));
        akv_engine_stats es;
        akv_engine_get_stats(e, &es);
        CHECK_EQ_INT(sr.n, 76);
        CHECK_EQ_U64(es.n_idle_closed, 1); /* 12 + 2 x 4 = 20: one of three closed */
        CHECK_EQ_U64(es.n_unadmitted, 0);
        CHECK_OK(akv__engine_check(e));
        for (int i = 0; i < 3; i++) akv_engine_release(e, r3[i]);
        akv_engine_release(e, rr);
        akv_engine_destroy(e);

        /* X holds 120 tokens (16 of 20 pages); its next turn (150 tokens at most: 20 pages)
         * takes it over */
        if (!(e = engine_open(model, &ep))) break;
        memset(&sx, 0, sizeof sx), memset(&sf, 0, sizeof sf);
        akv_request_params px = greedy(tokens, 120, 1, &sx);
        CHECK_OK(akv_engine_submit(e, &px, &rx, NULL));
        CHECK(run_all(e, 50) > 0);
        int32_t pr[130];
        memcpy(pr, tokens, 120 * sizeof pr[0]);
        pr[120] = sx.tok[0];
        for (int i = 121; i < 130; i++) pr[i] = tokens[500 + i];
        akv_request_params pf = greedy(pr, 130, 20, &sf);
        CHECK_OK(akv_engine_submit(e, &pf, &rf, NULL));
        for (int k = 0; k < 100 && !sf.n_final; k++) CHECK_OK(akv_engine_step(e, NULL));
        akv_request_info inf;
        akv_request_get_info(rf, &inf);
        CHECK_EQ_INT(sf.n, 20);
        CHECK_EQ_U64(inf.n_cached, 120);
        CHECK_OK(akv__engine_check(e));
        akv_engine_release(e, rx), akv_engine_release(e, rf);
        akv_engine_destroy(e);

        /* a pinned slot: erase and restore refused until its request starts */
        ep.host_pages_max = 0, ep.max_seqs = 2;
        if (!(e = engine_open(model, &ep))) break;
        static seen sa, sb;
        memset(&sa, 0, sizeof sa), memset(&sb, 0, sizeof sb);
        int32_t pt[2][56];
        for (int r = 0; r < 2; r++) {
            memcpy(pt[r], tokens, 48 * sizeof pt[r][0]);
            for (int i = 48; i < 56; i++) pt[r][i] = (tokens[i] + 3 * r + i + 1) % NV;
        }
        akv_request *ra, *rb;
        akv_request_params pa = greedy(pt[0], 56, 4, &sa);
        CHECK_OK(akv_engine_submit(e, &pa, &ra, NULL));
        CHECK(run_all(e, 50) > 0);
        char path[] = "/tmp/akv_pin_XXXXXX";
        if (!CHECK(temp_file(path))) break;
        CHECK_OK(akv_engine_slot_save(e, 0, path, NULL));
        akv_request_params pb = greedy(pt[1], 56, 4, &sb);
        CHECK_OK(akv_engine_submit(e, &pb, &rb, NULL)); /* admitted: it will fork slot 0's */
        CHECK_STATUS(akv_engine_slot_erase(e, 0, NULL), AKV_EBUSY);
        CHECK_STATUS(akv_engine_slot_restore(e, 0, path, NULL), AKV_EBUSY);
        CHECK_OK(akv__engine_check(e));
        CHECK(run_all(e, 50) > 0);
        akv_request_info ib;
        akv_request_get_info(rb, &ib);
        CHECK_EQ_U64(ib.n_cached, 48);
        CHECK_OK(akv_engine_slot_erase(e, 0, NULL)); /* started: free to go */
        akv_engine_release(e, ra), akv_engine_release(e, rb);
        akv_engine_destroy(e);

        /* a restore of a small conversation over a large one */
        if (!(e = engine_open(model, &ep))) break;
        memset(&sa, 0, sizeof sa), memset(&sb, 0, sizeof sb);
        akv_request_params ps = greedy(tokens, 20, 4, &sa), pl = greedy(tokens + 300, 150, 4, &sb);
        ps.cache_salt = 1, pl.cache_salt = 2;
        CHECK_OK(akv_engine_submit(e, &ps, &ra, NULL));
        CHECK(run_all(e, 50) > 0);
        CHECK_OK(akv_engine_submit(e, &pl, &rb, NULL));
        CHECK(run_all(e, 50) > 0);
        CHECK_OK(akv_engine_slot_save(e, 0, path, NULL));
        CHECK_OK(akv_engine_slot_restore(e, 1, path, NULL));
        CHECK_OK(akv__engine_check(e));
        akv_engine_release(e, ra), akv_engine_release(e, rb);
        akv_engine_destroy(e);
        remove(path);
    }

    TEST_CASE(kv_tier_auto_weighs_every_placement) {
        /* The gate plans each placement and predicts each: with the default rates (an H100's)
         * it takes a compact tier (the pools hold every placement: 2 GiB, max_context 256; at
         * batch 2 the q4 decode reads at 0.46 of the copy rate, so q8, within 5 % of q4 here,
         * is the one), and the engine serves a request on it. With rates where the compact
         * forms decode so slowly that they cost more than their bytes save, exact stays. */
        akv_gate_rates slow = akv_gate_default_rates();
        for (int b = 0; b < AKV_GATE_BATCHES; b++)
            slow.read_frac[AKV_REPR_Q8][b] = slow.read_frac[AKV_REPR_Q4][b] = 0.2;
        /* q4 needs a head dim that is a power of two of at least 32 */
        const tm_shape d32 = {.arch = "llama", .n_layers = 2, .n_embd = 64, .n_ff = 48,
                              .n_heads = 2, .n_kv_heads = 1, .n_vocab = NV};
        akv_model *m32 = tm_load(&d32, rng);
        for (int k = 0; k < 2 && CHECK(m32 != NULL); k++) {
            akv_engine_params ep = akv_engine_default_params();
            ep.kv_tier = AKV_ENGINE_TIER_AUTO, ep.device_gib = 2, ep.max_seqs = 2;
            ep.exact_recent = P, ep.gate_rates = k ? &slow : NULL;
            akv_engine *e = engine_open(m32, &ep);
            if (!e) break;
            const akv_engine_plan *pl = akv_engine_get_plan(e);
            CHECK_EQ_INT(pl->n_gate, AKV_ENGINE_GATE_OPTIONS);
            int chosen = -1;
            for (uint32_t i = 0; i < pl->n_gate; i++)
                if (pl->gate[i].chosen) chosen = (int)i;
            CHECK(chosen >= 0 && pl->gate[chosen].seqs == 2);
            if (!CHECK(k ? pl->route.tier == AKV_REPR_EXACT : pl->route.tier != AKV_REPR_EXACT)) {
                char said[8192];
                akv_engine_plan_format(pl, said, sizeof said);
                printf("%s", said);
            }
            CHECK_EQ_INT(pl->gate[chosen].tier, pl->route.tier);
            seen a = {0};
            akv_request *ra;
            akv_request_params pa = greedy(tokens, 40, 8, &a);
            CHECK_OK(akv_engine_submit(e, &pa, &ra, NULL));
            CHECK(run_all(e, 200) > 0);
            CHECK_EQ_INT(a.n, 8);
            char buf[8192];
            akv_engine_plan_format(pl, buf, sizeof buf);
            CHECK(strstr(buf, "gate:") != NULL);
            if (!k) {
                /* the gate per context: the plan's threshold is the gate's own arithmetic;
                 * a request within it stays exact (making no compact page), one beyond it
                 * and a short one that asks for the tier do not */
                const uint64_t below = akv_gate_exact_below(&pl->gate_rates, &pl->geom,
                                                            (akv_gate_placement){pl->gate[chosen].kind, pl->route.tier},
                                                            pl->max_seqs, pl->route.exact_recent,
                                                            pl->gate[chosen].weight_bytes, pl->max_context);
                CHECK_EQ_U64(pl->exact_below, below);
                CHECK(below >= pl->route.exact_recent && below < pl->max_context);
                CHECK(strstr(buf, "per context") != NULL);
                printf("  %s", strstr(buf, "gate:        per context"));
                akv_request_info ia;
                akv_request_get_info(ra, &ia);
                CHECK_EQ_INT(ia.kv_exact, 48 <= below);
                akv_engine_release(e, ra);
                seen sh = {0}, lg = {0}, fc = {0};
                akv_request *rs, *rl, *rc;
                akv_request_params ps = greedy(tokens + 1, (uint32_t)below - 4, 4, &sh),
                                   pg = greedy(tokens + 2, (uint32_t)below + 30, 8, &lg),
                                   pc = greedy(tokens + 3, (uint32_t)below - 4, 4, &fc);
                pc.kv_compact = true;
                akv_engine_stats s0, s1;
                akv_engine_get_stats(e, &s0);
                CHECK_OK(akv_engine_submit(e, &ps, &rs, NULL));
                CHECK(run_all(e, 200) > 0);
                akv_engine_get_stats(e, &s1);
                akv_request_info is, il, ic;
                akv_request_get_info(rs, &is);
                CHECK(is.kv_exact && s1.compact_pages == s0.compact_pages);
                CHECK_OK(akv_engine_submit(e, &pg, &rl, NULL));
                CHECK_OK(akv_engine_submit(e, &pc, &rc, NULL));
                CHECK(run_all(e, 200) > 0);
                akv_request_get_info(rl, &il);
                akv_request_get_info(rc, &ic);
                akv_engine_get_stats(e, &s0);
                CHECK(!il.kv_exact && !ic.kv_exact && s0.compact_pages > s1.compact_pages);
                CHECK(sh.n == 4 && lg.n == 8 && fc.n == 4);
                akv_engine_release(e, rs), akv_engine_release(e, rl), akv_engine_release(e, rc);
            }
            akv_engine_destroy(e);
        }
        akv_model_destroy(m32);
    }

    TEST_CASE(a_request_kept_exact_on_a_tiered_engine) {
        /* On an engine with a q8 tier, a request with kv_exact runs beside one without: its
         * logits are an exact engine's bits for it (the host pass is batch invariant), the
         * other's move off them (its older pages are compact), only the other makes compact
         * pages, and an idle context is reused only by a request of its own kind. */
        akv_engine_params xp = akv_engine_default_params();
        akv_engine *ex = engine_open(model, &xp);
        if (!ex) break;
        seen want = {0};
        akv_request *rw;
        akv_request_params pw = greedy(tokens, 60, 8, &want);
        CHECK_OK(akv_engine_submit(ex, &pw, &rw, NULL));
        CHECK(run_all(ex, 200) > 0);
        akv_engine_destroy(ex);
        akv_engine_params ep = akv_engine_default_params();
        ep.kv_tier = AKV_REPR_Q8, ep.exact_recent = P, ep.max_seqs = 2, ep.max_idle = 4;
        ep.device_gib = 2;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        /* a history reserves its exact window (the recent tokens and one step of at most a
         * chunk), not its every page; one kept exact reserves them all */
        const akv_engine_plan *pl = akv_engine_get_plan(e);
        CHECK_EQ_INT(pl->route.max_step, pl->chunk);
        CHECK_EQ_INT(akv_route_plan_need(&pl->route, &pl->geom, 256, false), 4);
        CHECK_EQ_INT(akv_route_plan_need(&pl->route, &pl->geom, 256, true), 16);
        seen a = {0}, b = {0};
        akv_request *ra, *rb;
        akv_request_params pa = greedy(tokens, 60, 8, &a), pb = greedy(tokens, 60, 8, &b);
        pa.kv_exact = true;
        CHECK_OK(akv_engine_submit(e, &pa, &ra, NULL));
        CHECK_OK(akv_engine_submit(e, &pb, &rb, NULL));
        CHECK(run_all(e, 200) > 0);
        CHECK_EQ_INT(a.n, 8);
        CHECK_EQ_INT(a.n_logits, want.n_logits);
        CHECK_BYTES(a.logits, want.logits, sizeof want.logits[0] * want.n_logits);
        CHECK(memcmp(b.logits, want.logits, sizeof want.logits[0] * want.n_logits) != 0);
        akv_engine_stats es;
        akv_engine_get_stats(e, &es);
        /* the other one's pages 1 .. (67 - 16) / 16 - 1 = 1, 2 leave its exact window, each
         * layer's once */
        CHECK_EQ_U64(es.compact_pages, 2u * shape.n_layers);
        /* both idle now: a kept-exact request with A's prompt and reply reuses A's context */
        int32_t pc_tok[80];
        memcpy(pc_tok, tokens, 60 * sizeof *pc_tok);
        memcpy(pc_tok + 60, a.tok, a.n * sizeof *pc_tok);
        seen c = {0};
        akv_request *rc;
        akv_request_params pc = greedy(pc_tok, 60 + a.n, 2, &c);
        pc.kv_exact = true;
        CHECK_OK(akv_engine_submit(e, &pc, &rc, NULL));
        CHECK(run_all(e, 200) > 0);
        akv_engine_get_stats(e, &es);
        CHECK_EQ_U64(es.compact_pages, 2u * shape.n_layers); /* nothing more made */
        akv_request_info ic;
        akv_request_get_info(rc, &ic);
        CHECK_EQ_U64(ic.n_cached, 60 + a.n - 1);
        akv_engine_destroy(e);
    }

    TEST_CASE(a_staged_compact_engine_is_the_resident_one) {
        /* --route staged with a q8 tier: the plan splits the device GiB (the exact windows,
         * then the compact pool with its staging reserve) and the host GiB (the compact copies
         * beside the exact ones); three requests, two at a time, give the resident q8 engine's
         * logits bit for bit (the same compact bytes, read in the same order) */
        static seen want[3], got[3];
        memset(want, 0, sizeof want), memset(got, 0, sizeof got);
        for (int k = 0; k < 2; k++) {
            akv_engine_params ep = akv_engine_default_params();
            ep.kv_tier = AKV_REPR_Q8, ep.exact_recent = P, ep.max_seqs = 2, ep.device_gib = 2;
            ep.max_queue = 4;
            if (k) ep.route = route_kind("staged"), ep.host_gib = 3;
            akv_engine *e = engine_open(model, &ep);
            if (!e) break;
            const akv_engine_plan *pl = akv_engine_get_plan(e);
            if (k) {
                /* head dim 8: a q8 page is 10 bits an element (and its alignment) */
                CHECK_EQ_INT(pl->route.compact_host_gib, 2);
                CHECK(pl->route.compact_gib == 1 && pl->route.compact_target >= 2);
                CHECK(pl->route.compact_staging_pages > 0);
                /* no exact staging reserve (only compact pages are staged); a history kept
                 * exact reserves every page, its exact part being resident */
                CHECK_EQ_INT(pl->route.staging_pages, 0);
                CHECK_EQ_INT(akv_route_plan_need(&pl->route, &pl->geom, 256, true), 16);
                CHECK_EQ_INT(akv_route_plan_need(&pl->route, &pl->geom, 256, false), 4);
                char said[4096];
                akv_engine_plan_format(pl, said, sizeof said);
                CHECK(strstr(said, "stage the rest") != NULL);
            }
            seen *s = k ? got : want;
            akv_request *rq[3];
            for (int i = 0; i < 3; i++) {
                akv_request_params rp = greedy(tokens + 100 * i, 60 + 10 * i, 8, &s[i]);
                CHECK_OK(akv_engine_submit(e, &rp, &rq[i], NULL));
            }
            CHECK(run_all(e, 400) > 0);
            akv_engine_stats es;
            akv_engine_get_stats(e, &es);
            CHECK(es.compact_pages > 0);
            akv_engine_destroy(e);
        }
        for (int i = 0; i < 3; i++) {
            CHECK_EQ_INT(got[i].n, 8);
            CHECK_EQ_INT(got[i].n_logits, want[i].n_logits);
            CHECK_BYTES(got[i].logits, want[i].logits, sizeof want[i].logits[0] * want[i].n_logits);
        }
        /* a host budget that cannot hold both copies is refused, naming it */
        akv_engine_params bad = akv_engine_default_params();
        bad.kv_tier = AKV_REPR_Q8, bad.route = route_kind("staged"), bad.device_gib = 2;
        bad.host_gib = 1, bad.model = model, bad.page_tokens = P, bad.max_context = 256;
        CHECK_OK(akv_dev_create(akv_dev_host_backend(), NULL, &bad.dev));
        akv_engine *be = NULL;
        CHECK_STATUS(akv_engine_create(&bad, &be), AKV_EFULL);
    }

    TEST_CASE(prompt_logits_on_both_passes) {
        /* on_prompt_logits reports every prompt position's logits from prompt_logits_from on,
         * in order, on the host pass in whole chunks and on the device pass in pieces of at
         * most 64 (its logits buffer); the two agree to the device pass's bf16 rounding; an
         * idle context sharing the prompt is reused only up to prompt_logits_from */
        pseen *got[2] = {calloc(1, sizeof(pseen)), calloc(1, sizeof(pseen))};
        for (int pass = 0; pass < 2 && CHECK(got[0] && got[1]); pass++) {
            akv_engine_params ep = akv_engine_default_params();
            ep.chunk = 128, ep.max_context = 512, ep.max_idle = 2;
            if (pass) ep.pass = AKV_ENGINE_PASS_DEVICE;
            akv_engine *e = engine_open(model, &ep);
            if (!e) break;
            seen warm = {0};
            akv_request *rw;
            akv_request_params pw = greedy(tokens, 150, 2, &warm); /* idle after: its prefix */
            CHECK_OK(akv_engine_submit(e, &pw, &rw, NULL));
            CHECK(run_all(e, 100) > 0);
            pseen *g = got[pass];
            g->next = 10, g->in_order = true;
            akv_request *ra;
            akv_request_params pa = greedy(tokens, 200, 1, &g->s);
            pa.prompt_logits_from = 10, pa.on_prompt_logits = on_prompt_rows;
            CHECK_OK(akv_engine_submit(e, &pa, &ra, NULL));
            CHECK(run_all(e, 100) > 0);
            akv_request_info ia;
            akv_request_get_info(ra, &ia);
            CHECK_EQ_U64(ia.n_cached, 10);
            CHECK(g->in_order && g->next == 200);
            CHECK_EQ_INT(g->max_n, pass ? 64 : 128); /* device pieces; host: whole chunks */
            akv_engine_destroy(e);
        }
        if (got[0] && got[1] && got[0]->next == 200 && got[1]->next == 200) {
            size_t at;
            const double err = fx_rel_err(&got[1]->rows[10][0], &got[0]->rows[10][0], 190 * NV, &at);
            /* a row one position off is far off: the rows are the positions they say */
            const double off = fx_rel_err(&got[1]->rows[10][0], &got[0]->rows[11][0], 189 * NV, &at);
            printf("  device pass's prompt logits off the host pass's by %.3g (relative; a position "
                   "off: %.3g)\n", err, off);
            CHECK(err < 0.1 && off > 4 * err);
        }
        free(got[0]), free(got[1]);
    }

    TEST_CASE(idle_contexts_closed_least_recently_used_first) {
        /* max_idle 3: five finished conversations leave the three most recent idle; a prompt
         * sharing the first's prefix computes it again, one sharing the fifth's reuses it */
        akv_engine_params ep = akv_engine_default_params();
        ep.max_idle = 3;
        akv_engine *e = engine_open(model, &ep);
        if (!e) break;
        seen s[7];
        memset(s, 0, sizeof s);
        for (int i = 0; i < 5; i++) {
            akv_request *rq;
            akv_request_params rp = greedy(tokens + 50 * i, 20, 4, &s[i]);
            CHECK_OK(akv_engine_submit(e, &rp, &rq, NULL));
            CHECK(run_all(e, 100) > 0);
            akv_engine_release(e, rq);
        }
        akv_engine_stats st;
        akv_engine_get_stats(e, &st);
        CHECK_EQ_U64(st.n_idle, 3);
        CHECK_EQ_U64(st.n_idle_closed, 2);
        akv_request *r0, *r4;
        akv_request_params p0 = greedy(tokens, 20, 2, &s[5]), p4 = greedy(tokens + 200, 20, 2, &s[6]);
        CHECK_OK(akv_engine_submit(e, &p0, &r0, NULL));
        CHECK(run_all(e, 100) > 0);
        CHECK_OK(akv_engine_submit(e, &p4, &r4, NULL));
        CHECK(run_all(e, 100) > 0);
        akv_request_info i0, i4;
        akv_request_get_info(r0, &i0), akv_request_get_info(r4, &i4);
        CHECK_EQ_U64(i0.n_cached, 0);
        CHECK_EQ_U64(i4.n_cached, 19);
        CHECK_BYTES(s[6].tok, s[4].tok, 2 * sizeof(int32_t)); /* the same greedy start */
        akv_engine_release(e, r0), akv_engine_release(e, r4);
        CHECK_OK(akv__engine_check(e));
        akv_engine_destroy(e);
        /* retention: with max_idle 2, a high-retention conversation outlives later normal ones,
         * and a low one goes first even when it is the most recent */
        ep = akv_engine_default_params();
        ep.max_idle = 2;
        e = engine_open(model, &ep);
        if (!e) break;
        static seen k[6];
        memset(k, 0, sizeof k);
        const int8_t ret[4] = {1, 0, 0, -1};
        for (int i = 0; i < 4; i++) { /* closed as they finish: 1 (after 2), then 3 (low) */
            akv_request *rq;
            akv_request_params rp = greedy(tokens + 50 * i, 20, 2, &k[i]);
            rp.retention = ret[i];
            CHECK_OK(akv_engine_submit(e, &rp, &rq, NULL));
            CHECK(run_all(e, 100) > 0);
            akv_engine_release(e, rq);
        }
        const int ask[2] = {3, 0}, want[2] = {0, 19};
        for (int j = 0; j < 2; j++) {
            akv_request *rq;
            akv_request_params rp = greedy(tokens + 50 * ask[j], 20, 1, &k[4 + j]);
            CHECK_OK(akv_engine_submit(e, &rp, &rq, NULL));
            CHECK(run_all(e, 100) > 0);
            akv_request_info inf;
            akv_request_get_info(rq, &inf);
            TEST_CHECK_(inf.n_cached == (uint32_t)want[j], "conversation %d reused %u", ask[j], inf.n_cached);
            akv_engine_release(e, rq);
        }
        akv_engine_destroy(e);
    }

    TEST_CASE(randomized_operations_with_faults) {
        /* 10^5 operations: arrivals (random prompts, some sharing prefixes, random lengths and
         * limits), cancels, releases, steps, injected device faults (a submission refused, a
         * copy or an op failing while it runs) and their clearing; on the device pass over
         * resident and staged routes; the walkers after every step: no leak, no page owned
         * twice, nothing lost */
        /* wider K/V rows (f32, 4 heads of 16: 8 KiB pages) keep the device pool's walker, which
         * visits every page of its 1 GiB, at a fraction of a millisecond */
        const tm_shape wide = {.arch = "llama", .n_layers = 2, .n_embd = 64, .n_ff = 64,
                               .n_heads = 4, .n_kv_heads = 4, .n_vocab = NV};
        akv_model *wm = tm_load(&wide, rng);
        if (!CHECK(wm != NULL)) break;
        const uint64_t n_ops = 100000;
        uint64_t ops = 0, steps = 0, faults = 0, arrivals = 0, cancels = 0, finished = 0;
        uint64_t gave_up = 0;
        char sdir[] = "/tmp/akv_fault_sdir_XXXXXX";
        if (!CHECK(mkdtemp(sdir) != NULL)) break;
        for (int variant = 0; variant < 3; variant++) {
            /* 0 resident, 1 staged, 2 resident with a session directory (few idle contexts
             * kept: conversations go to the disk and come back under the faults) */
            akv_engine_params ep = akv_engine_default_params();
            ep.max_seqs = 4, ep.max_queue = 6, ep.max_idle = variant == 2 ? 1 : 5, ep.max_context = 96;
            ep.pass = AKV_ENGINE_PASS_DEVICE, ep.chunk = 16;
            ep.route = route_kind(variant == 1 ? "staged" : "resident"), ep.window_pages = 2;
            ep.kv_dtype = AKV_DTYPE_F32;
            /* a host pool of 36 pages (a request may reserve 12): admission waits, shares and
             * trims idle contexts under pressure; the walker checks its promise every step */
            if (variant < 2) ep.host_pages_max = 36;
            if (variant == 2) ep.session_dir = sdir;
            akv_engine *e = engine_open(wm, &ep);
            if (!e) break;
            akv_dev *dev = akv_engine_dev(e);
            enum { LIVE = 24 };
            akv_request *live[LIVE] = {0};
            static seen sn[LIVE];
            memset(sn, 0, sizeof sn);
            bool faulted = false;
            int ok = 1;
            for (uint64_t i = 0; ok && i < (variant < 2 ? n_ops / 2 : n_ops / 4); i++, ops++) {
                uint32_t what = (uint32_t)test_rand_below(&rng, 100);
                uint32_t slot = (uint32_t)test_rand_below(&rng, LIVE);
                if (what < 20 && !live[slot]) {
                    /* an arrival: half of them share a prefix with an earlier prompt */
                    uint32_t n = 1 + (uint32_t)test_rand_below(&rng, 60);
                    uint32_t at = test_rand_below(&rng, 2) ? 0 : (uint32_t)test_rand_below(&rng, 900);
                    memset(&sn[slot], 0, sizeof sn[slot]);
                    akv_request_params rp = greedy(tokens + at, n, 1 + (uint32_t)test_rand_below(&rng, 30), &sn[slot]);
                    rp.want_logits = false;
                    rp.sample.temp = test_rand_below(&rng, 2) ? 0.0f : 0.9f;
                    rp.sample.seed = i;
                    akv_status st = akv_engine_submit(e, &rp, &live[slot], NULL);
                    ok &= CHECK(st == AKV_OK || st == AKV_EFULL);
                    arrivals += st == AKV_OK;
                } else if (what < 26 && live[slot]) {
                    akv_request_info ri;
                    akv_request_get_info(live[slot], &ri);
                    cancels += ri.state != AKV_REQUEST_DONE;
                    akv_engine_cancel(e, live[slot]);
                } else if (what < 30 && live[slot]) {
                    akv_request_info ri;
                    akv_request_get_info(live[slot], &ri);
                    finished += ri.state == AKV_REQUEST_DONE;
                    akv_engine_release(e, live[slot]);
                    live[slot] = NULL;
                } else if (what < 33 && !faulted) {
                    const akv_dev_fault kinds[3] = {AKV_FAULT_COPY, AKV_FAULT_COPY_EXEC, AKV_FAULT_OP_EXEC};
                    ok &= CHECK(akv_dev_inject_fault(dev, kinds[test_rand_below(&rng, 3)],
                                                     1 + test_rand_below(&rng, 40), 0) == AKV_OK);
                    faulted = true, faults++;
                } else if (what < 40 && faulted) {
                    (void)akv_dev_sync(dev);
                    ok &= CHECK(akv_dev_clear_faults(dev) == AKV_OK);
                    faulted = false;
                } else {
                    bool did = false;
                    akv_status st = akv_engine_step(e, &did);
                    steps += did;
                    if (st != AKV_OK && test_rand_below(&rng, 2)) { /* the device recovers */
                        (void)akv_dev_sync(dev);
                        ok &= CHECK(akv_dev_clear_faults(dev) == AKV_OK);
                        faulted = false;
                    }
                    if (akv_engine_failed(e)) {
                        /* it gave up on the device: everything ended cleanly; a new engine */
                        for (int k = 0; k < LIVE; k++) {
                            if (live[k]) {
                                akv_request_info ri;
                                akv_request_get_info(live[k], &ri);
                                ok &= CHECK(ri.state == AKV_REQUEST_DONE);
                            }
                            akv_engine_release(e, live[k]);
                            live[k] = NULL;
                        }
                        /* the device's work ends (a device that never ends it keeps what it
                         * may still write: the engine leaks it, by design) */
                        (void)akv_dev_sync(dev);
                        ok &= CHECK(akv_dev_clear_faults(dev) == AKV_OK);
                        akv_engine_destroy(e);
                        gave_up++;
                        if (!(e = engine_open(wm, &ep))) break;
                        dev = akv_engine_dev(e);
                        faulted = false;
                    } else if (!faulted && st == AKV_OK) {
                        ok &= CHECK(akv__engine_check(e) == AKV_OK);
                    }
                }
                for (int k = 0; k < LIVE; k++) ok &= CHECK(sn[k].after_final == 0 && sn[k].n_final <= 1);
            }
            if (!e) break;
            (void)akv_dev_sync(dev);
            CHECK_OK(akv_dev_clear_faults(dev));
            for (int guard = 0; akv_engine_busy(e) && guard < 10000; guard++) {
                akv_status st = akv_engine_step(e, NULL);
                if (st) (void)akv_dev_clear_faults(dev);
            }
            CHECK(!akv_engine_busy(e));
            CHECK_OK(akv_route_sync(akv_engine_route(e)));
            CHECK_OK(akv__engine_check(e));
            for (int k = 0; k < LIVE; k++) akv_engine_release(e, live[k]);
            if (variant < 2) { /* the small host pool was a pressure (the last engine's counts) */
                akv_engine_stats es;
                akv_engine_get_stats(e, &es);
                printf("  %s, 36 host pages: %llu idle contexts closed, %llu forks, %llu sent back "
                       "to the queue\n", variant ? "staged" : "resident",
                       (unsigned long long)es.n_idle_closed, (unsigned long long)es.n_forked,
                       (unsigned long long)es.n_unadmitted);
            }
            if (variant == 2) {
                akv_engine_stats es;
                akv__engine_flush_sessions(e);
                akv_engine_get_stats(e, &es);
                printf("  with a session directory: %llu conversations written, %llu read back\n",
                       (unsigned long long)es.n_spilled, (unsigned long long)es.n_restored);
                CHECK(es.n_spilled > 10 && es.n_restored > 0);
            }
            akv_engine_destroy(e);
        }
        dir_each(sdir, file_remove);
        rmdir(sdir);
        printf("  %llu operations: %llu arrivals admitted, %llu cancels, %llu steps, %llu faults "
               "injected, %llu finished, %llu engines given up on their device\n",
               (unsigned long long)ops, (unsigned long long)arrivals, (unsigned long long)cancels,
               (unsigned long long)steps, (unsigned long long)faults, (unsigned long long)finished,
               (unsigned long long)gave_up);
        CHECK(ops >= n_ops && steps > 1000 && faults > 100);
        akv_model_destroy(wm);
    }

    akv_model_destroy(model);
    CHECK_EQ_INT(test_alloc_live_settled(), 0);
    return test_finish();
}
