/* test_par.c — the worker-thread pool (core/par.h): every task of every loop runs exactly
 * once and its writes are seen when the loop returns, with workers that spin, sleep, join late
 * or miss loops; pools of more threads than cores; two pools at once; stop while idle. */
#include "test.h"

#include <pthread.h>
#include <stdatomic.h>

#include "core/clock.h"
#include "core/par.h"

typedef struct loop_ctx {
    uint32_t *runs; /* [n_tasks]: times each task ran in this loop */
    uint32_t *vals; /* [n_tasks]: what it wrote */
    uint32_t seed;
    uint32_t slow_every; /* 0: none; else every slow_every-th task sleeps a little */
} loop_ctx;

static void count_task(void *ctx, uint32_t t) {
    loop_ctx *c = ctx;
    c->runs[t]++;
    c->vals[t] = c->seed * 2654435761u + t;
    if (c->slow_every && (t + c->seed) % c->slow_every == 0) akv_clock_sleep_ns(20000 + (t % 7) * 10000);
}

static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* n_loops loops of 1..max_tasks tasks on p; the number of tasks that ran other than once or
 * wrote the wrong value. */
static uint32_t run_loops(akv_par *p, uint32_t n_loops, uint32_t max_tasks, uint32_t slow_every,
                          uint32_t seed) {
    uint32_t runs[256], vals[256], bad = 0;
    for (uint32_t i = 0; i < n_loops; i++) {
        const uint32_t n = 1 + lcg(&seed) % max_tasks;
        memset(runs, 0, sizeof runs);
        loop_ctx c = {runs, vals, lcg(&seed), slow_every};
        akv__par_for(p, n, count_task, &c);
        for (uint32_t t = 0; t < 256; t++)
            bad += t < n ? (runs[t] != 1 || vals[t] != c.seed * 2654435761u + t) : runs[t] != 0;
        if (i % 64 == 63) akv_clock_sleep_ns(300000); /* past the spin: workers go to sleep */
    }
    return bad;
}

typedef struct pool_thread {
    uint32_t n_threads, bad;
    akv_status st;
} pool_thread;

static void *own_pool(void *arg) {
    pool_thread *pt = arg;
    akv_par *p = NULL;
    if ((pt->st = akv__par_create(pt->n_threads, &p)) != AKV_OK) return NULL;
    pt->bad = run_loops(p, 3000, 40, 0, pt->n_threads * 7u + 1);
    akv__par_destroy(p);
    return NULL;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    const uint32_t cores = akv__par_cores();

    TEST_CASE(every_task_runs_once_at_every_pool_size) {
        const uint32_t sizes[] = {1, 2, 3, 5, cores, cores + 3}; /* cores + 3: nobody spins */
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            akv_par *p = NULL;
            if (!CHECK(akv__par_create(sizes[i], &p) == AKV_OK)) break;
            CHECK_EQ_INT(akv__par_n_threads(p), (int)sizes[i]);
            CHECK_EQ_INT(run_loops(p, 4000, 200, 0, sizes[i]), 0);
            akv__par_destroy(p);
        }
    }

    TEST_CASE(slow_tasks_make_workers_join_late_and_miss_loops) {
        const uint32_t sizes[] = {2, 4, cores + 2};
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            akv_par *p = NULL;
            if (!CHECK(akv__par_create(sizes[i], &p) == AKV_OK)) break;
            CHECK_EQ_INT(run_loops(p, 400, 24, 5, 99 + sizes[i]), 0);
            akv__par_destroy(p);
        }
    }

    TEST_CASE(two_pools_at_once_share_the_cores) {
        pthread_t th[2];
        pool_thread pt[2] = {{cores, 0, AKV_OK}, {cores > 1 ? cores : 2, 0, AKV_OK}};
        for (int i = 0; i < 2; i++)
            CHECK_EQ_INT(pthread_create(&th[i], NULL, own_pool, &pt[i]), 0);
        for (int i = 0; i < 2; i++) {
            pthread_join(th[i], NULL);
            CHECK_EQ_INT(pt[i].st, AKV_OK);
            CHECK_EQ_INT(pt[i].bad, 0);
        }
    }

    TEST_CASE(create_and_stop_without_a_loop_or_while_asleep) {
        akv_par *p = NULL;
        CHECK_EQ_INT(akv__par_create(4, &p), AKV_OK);
        akv__par_destroy(p);
        p = NULL;
        CHECK_EQ_INT(akv__par_create(4, &p), AKV_OK);
        CHECK_EQ_INT(run_loops(p, 3, 8, 0, 5), 0);
        akv_clock_sleep_ns(2000000);
        akv__par_destroy(p);
        akv__par_destroy(NULL);
        CHECK_EQ_INT(akv__par_create(AKV_PAR_MAX_THREADS + 1, &p), AKV_EINVAL);
    }

    TEST_CASE(no_pool_runs_in_order_on_the_caller) {
        uint32_t runs[256] = {0}, vals[256];
        loop_ctx c = {runs, vals, 3, 0};
        akv__par_for(NULL, 17, count_task, &c);
        akv__par_for(NULL, 0, count_task, &c);
        uint32_t bad = 0;
        for (uint32_t t = 0; t < 256; t++)
            bad += runs[t] != (t < 17);
        CHECK_EQ_INT(bad, 0);
    }
    return test_finish();
}
