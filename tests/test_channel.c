/* test_channel.c — what passes between the server's HTTP threads and its engine thread
 * (src/server/channel.c): the command queue's order under concurrent posters, the requests'
 * reference counts (every allocation comes back), the channel's phases and text under a
 * concurrent writer and reader, cancel races, a close with readers waiting, and a failed
 * allocation that changes nothing. */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "core/alloc.h"
#include "server/channel.h"
#include "test.h"

enum { N_POSTERS = 4, PER_POSTER = 500 };

typedef struct poster {
    akv_srv_queue *q;
    akv_srv_req *reqs[PER_POSTER];
    int id;
} poster;

/* Posts SUBMIT then CANCEL for each of its requests, interleaved with the other posters. */
static void *poster_main(void *arg) {
    poster *p = arg;
    for (int i = 0; i < PER_POSTER; i++) {
        akv_srv_req *r = p->reqs[i];
        if (akv_srv_queue_post(p->q, AKV_SRV_SUBMIT, r) != AKV_OK) abort();
        if (i % 3 == 0) sched_yield();
        if (akv_srv_queue_post(p->q, AKV_SRV_CANCEL, r) != AKV_OK) abort();
    }
    return NULL;
}

typedef struct writer {
    akv_srv_req *r;
    int n_pieces;
} writer;

/* The engine side: admits, appends n pieces "<i>," each with a token record of id i (every
 * seventh with no text: a token held by a stop string), finishes. */
static void *writer_main(void *arg) {
    writer *w = arg;
    akv_srv_req_admit(w->r);
    char piece[16];
    for (int i = 0; i < w->n_pieces; i++) {
        int n = i % 7 == 3 ? 0 : snprintf(piece, sizeof piece, "%d,", i);
        const akv_srv_tok tok = {.id = i, .logprob = -1.0f};
        akv_srv_req_append(w->r, piece, (size_t)n, &tok);
    }
    akv_srv_req_finish(w->r, AKV_FINISH_LENGTH, 3, 1, (uint32_t)w->n_pieces);
    return NULL;
}

typedef struct racer {
    akv_srv_req *r;
    akv_metrics_end why;
    atomic_int *won;
} racer;

static void *racer_main(void *arg) {
    racer *c = arg;
    if (akv_srv_req_mark_cancelled(c->r, c->why)) atomic_fetch_add(c->won, 1);
    return NULL;
}

/* Waits on a request's eventfd as an HTTP thread does; counts the wakes until DONE. */
static void *reader_main(void *arg) {
    akv_srv_req *r = arg;
    while (akv_srv_req_phase(r) != AKV_SRV_DONE) {
        struct pollfd pf = {.fd = r->efd, .events = POLLIN};
        if (poll(&pf, 1, 5000) <= 0) return (void *)1; /* never woken */
        uint64_t v;
        ssize_t k = read(r->efd, &v, sizeof v);
        (void)k;
    }
    return NULL;
}

int main(int argc, char **argv) {
    test_args(argc, argv);

    TEST_CASE(queue_order_and_refs) {
        const int64_t live0 = akv__alloc_live();
        akv_srv_queue q;
        akv_srv_queue_init(&q);
        poster ps[N_POSTERS];
        for (int p = 0; p < N_POSTERS; p++) {
            ps[p].q = &q, ps[p].id = p;
            for (int i = 0; i < PER_POSTER; i++) {
                if (akv_srv_req_create(&ps[p].reqs[i])) abort();
                ps[p].reqs[i]->num = (uint64_t)(p * PER_POSTER + i);
            }
        }
        pthread_t t[N_POSTERS];
        for (int p = 0; p < N_POSTERS; p++)
            pthread_create(&t[p], NULL, poster_main, &ps[p]);
        /* the taker: every request's SUBMIT before its CANCEL, each poster's in its order */
        int seen_submit[N_POSTERS * PER_POSTER] = {0}, seen_cancel[N_POSTERS * PER_POSTER] = {0};
        int next_submit[N_POSTERS] = {0};
        int n_taken = 0, n_bad = 0;
        while (n_taken < 2 * N_POSTERS * PER_POSTER) {
            bool closed;
            akv_srv_cmd *c = akv_srv_queue_take(&q, true, &closed);
            while (c) {
                akv_srv_cmd *next = c->next;
                const int num = (int)c->r->num, p = num / PER_POSTER, i = num % PER_POSTER;
                if (c->kind == AKV_SRV_SUBMIT) {
                    n_bad += seen_submit[num]++ != 0 || next_submit[p]++ != i;
                } else {
                    n_bad += !seen_submit[num] || seen_cancel[num]++;
                }
                akv_srv_cmd_free(c);
                c = next;
                n_taken++;
            }
        }
        for (int p = 0; p < N_POSTERS; p++)
            pthread_join(t[p], NULL);
        CHECK_EQ_INT(n_bad, 0);
        CHECK_EQ_INT(n_taken, 2 * N_POSTERS * PER_POSTER);
        /* the commands' references are gone: one each remains, the posters' */
        for (int p = 0; p < N_POSTERS; p++)
            for (int i = 0; i < PER_POSTER; i++) {
                CHECK_EQ_INT(ps[p].reqs[i]->refs, 1);
                akv_srv_req_unref(ps[p].reqs[i]);
            }
        akv_srv_queue_deinit(&q);
        CHECK_EQ_INT(akv__alloc_live(), live0);
    }

    TEST_CASE(close_drops_posts_and_deinit_frees) {
        const int64_t live0 = akv__alloc_live();
        akv_srv_queue q;
        akv_srv_queue_init(&q);
        akv_srv_req *r;
        if (!REQUIRE_OK(akv_srv_req_create(&r))) break;
        CHECK_OK(akv_srv_queue_post(&q, AKV_SRV_SUBMIT, r));
        CHECK_EQ_INT(r->refs, 2);
        akv_srv_queue_close(&q);
        CHECK_STATUS(akv_srv_queue_post(&q, AKV_SRV_CANCEL, r), AKV_ESTATE);
        CHECK_EQ_INT(r->refs, 2);
        bool closed = false;
        akv_srv_cmd *c = akv_srv_queue_take(&q, true, &closed); /* does not wait: closed */
        CHECK(closed && c && !c->next);
        akv_srv_cmd_free(c);
        CHECK_EQ_INT(r->refs, 1);
        /* commands left in a queue are freed with it */
        akv_srv_queue q2;
        akv_srv_queue_init(&q2);
        CHECK_OK(akv_srv_queue_post(&q2, AKV_SRV_SUBMIT, r));
        CHECK_OK(akv_srv_queue_post(&q2, AKV_SRV_CANCEL, r));
        akv_srv_queue_deinit(&q2);
        CHECK_EQ_INT(r->refs, 1);
        akv_srv_req_unref(r);
        akv_srv_queue_deinit(&q);
        CHECK_EQ_INT(akv__alloc_live(), live0);
    }

    TEST_CASE(post_out_of_memory_changes_nothing) {
        akv_srv_queue q;
        akv_srv_queue_init(&q);
        akv_srv_req *r;
        if (!REQUIRE_OK(akv_srv_req_create(&r))) break;
        akv__alloc_fail_nth(1);
        CHECK_STATUS(akv_srv_queue_post(&q, AKV_SRV_SUBMIT, r), AKV_ENOMEM);
        CHECK(akv__alloc_failure_fired());
        akv__alloc_fail_nth(0);
        CHECK_EQ_INT(r->refs, 1);
        bool closed;
        CHECK(akv_srv_queue_take(&q, false, &closed) == NULL);
        akv_srv_req_unref(r);
        akv_srv_queue_deinit(&q);
        /* and a request that cannot be made leaves nothing behind */
        const int64_t live0 = akv__alloc_live();
        akv__alloc_fail_nth(1);
        CHECK_STATUS(akv_srv_req_create(&r), AKV_ENOMEM);
        akv__alloc_fail_nth(0);
        CHECK_EQ_INT(akv__alloc_live(), live0);
    }

    TEST_CASE(text_and_phases_concurrent) {
        akv_srv_req *r;
        if (!REQUIRE_OK(akv_srv_req_create(&r))) break;
        CHECK_EQ_INT(akv_srv_req_phase(r), AKV_SRV_PENDING);
        writer w = {r, 20000};
        pthread_t t;
        pthread_create(&t, NULL, writer_main, &w);
        /* the reader: pieces in order; DONE seen only with every piece taken; the records in
         * order, each taken with its text or before it, none lost */
        char *got = NULL;
        size_t n_got = 0, cap = 0;
        int32_t next_tok = 0;
        bool toks_in_order = true, toks_with_text = true;
        for (;;) {
            char *piece;
            size_t n, n_toks;
            akv_srv_tok *toks;
            akv_srv_phase ph;
            CHECK_OK(akv_srv_req_take_text(r, &piece, &n, &toks, &n_toks, &ph));
            for (size_t i = 0; i < n_toks; i++) toks_in_order &= toks[i].id == next_tok++;
            if (piece && n_toks) { /* the last record's text is the piece's last */
                char want[16];
                int32_t last = next_tok - 1;
                while (last % 7 == 3) last--;
                const int k = snprintf(want, sizeof want, "%d,", last);
                toks_with_text &= n >= (size_t)k && !memcmp(piece + n - (size_t)k, want, (size_t)k);
            }
            akv__free(toks);
            if (piece) {
                akv__array_reserve((void **)&got, &cap, n_got + n + 1, 1);
                memcpy(got + n_got, piece, n);
                n_got += n;
                akv__free(piece);
                continue;
            }
            if (ph == AKV_SRV_DONE) break;
        }
        pthread_join(t, NULL);
        char want[16];
        size_t at = 0;
        bool same = true;
        for (int i = 0; i < w.n_pieces && same; i++) {
            if (i % 7 == 3) continue;
            int n = snprintf(want, sizeof want, "%d,", i);
            same = at + (size_t)n <= n_got && !memcmp(got + at, want, (size_t)n);
            at += (size_t)n;
        }
        CHECK(same && at == n_got);
        CHECK(toks_in_order && toks_with_text);
        CHECK_EQ_INT(next_tok, w.n_pieces);
        CHECK(r->finish == AKV_FINISH_LENGTH && r->n_gen == 20000 && r->n_prompt == 3);
        /* a finished request cannot be cancelled any more */
        CHECK(!akv_srv_req_mark_cancelled(r, AKV_END_ABORT));
        akv__free(got);
        akv_srv_req_unref(r);
    }

    TEST_CASE(cancel_race_one_wins) {
        for (int round = 0; round < 200; round++) {
            akv_srv_req *r;
            if (!REQUIRE_OK(akv_srv_req_create(&r))) break;
            if (round & 1) akv_srv_req_admit(r);
            atomic_int won = 0;
            racer a = {r, AKV_END_ABORT, &won}, b = {r, AKV_END_SHUTDOWN, &won};
            pthread_t ta, tb;
            pthread_create(&ta, NULL, racer_main, &a);
            pthread_create(&tb, NULL, racer_main, &b);
            pthread_join(ta, NULL);
            pthread_join(tb, NULL);
            CHECK_EQ_INT(atomic_load(&won), 1);
            CHECK(r->cancelled && (r->end == AKV_END_ABORT || r->end == AKV_END_SHUTDOWN));
            akv_srv_req_unref(r);
        }
        /* a refused request is not cancelled either */
        akv_srv_req *r;
        if (!REQUIRE_OK(akv_srv_req_create(&r))) break;
        akv_api_error e;
        akv_api_error_set(&e, 429, "rate_limit_error", NULL, NULL, "busy");
        akv_srv_req_refuse(r, &e);
        CHECK(!akv_srv_req_mark_cancelled(r, AKV_END_ABORT));
        CHECK_EQ_INT(akv_srv_req_phase(r), AKV_SRV_REFUSED);
        CHECK_EQ_INT(r->refusal.status, 429);
        akv_srv_req_unref(r);
    }

    TEST_CASE(close_wakes_waiting_readers) {
        /* readers wait on their requests; the engine side closes the queue and ends each (as
         * a shutdown does): every reader wakes, and the last reference frees each request */
        const int64_t live0 = akv__alloc_live();
        akv_srv_queue q;
        akv_srv_queue_init(&q);
        enum { N = 8 };
        akv_srv_req *r[N];
        pthread_t t[N];
        for (int i = 0; i < N; i++) {
            if (akv_srv_req_create(&r[i])) abort();
            akv_srv_queue_post(&q, AKV_SRV_SUBMIT, r[i]);
            pthread_create(&t[i], NULL, reader_main, r[i]);
        }
        usleep(50000);
        akv_srv_queue_close(&q);
        bool closed;
        akv_srv_cmd *c = akv_srv_queue_take(&q, true, &closed);
        CHECK(closed);
        for (akv_srv_cmd *n; c; c = n) {
            n = c->next;
            akv_srv_req_admit(c->r);
            akv_srv_req_mark_cancelled(c->r, AKV_END_SHUTDOWN);
            akv_srv_req_finish(c->r, AKV_FINISH_CANCELLED, 1, 0, 0);
            akv_srv_cmd_free(c);
        }
        for (int i = 0; i < N; i++) {
            void *rc;
            pthread_join(t[i], &rc);
            CHECK(rc == NULL);
            CHECK(r[i]->end == AKV_END_SHUTDOWN);
        }
        for (int i = 0; i < N; i++)
            akv_srv_req_unref(r[i]); /* the last reference */
        akv_srv_queue_deinit(&q);
        CHECK_EQ_INT(akv__alloc_live(), live0);
    }
    return test_finish();
}
