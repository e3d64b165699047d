/* par.c — the worker-thread pool of core/par.h.
 *
 * One loop at a time: the caller publishes (fn, ctx, n_tasks), bumps the generation, runs
 * tasks itself, then waits until every worker has checked out of that generation. So no
 * worker is still inside a loop when the next one is published, and the loop's fields need
 * no lock: the generation's release/acquire pair orders them.
 *
 * Waiting: where every thread has a core of its own, a worker spins PAR_SPIN_NS for the next
 * loop and the caller spins for the workers' check-out, since a loop is microseconds. With
 * more threads than cores online a spinner takes the core a thread it waits for needs, so
 * nobody spins: workers sleep at once, and the caller sleeps until the last worker checks out. */
#define _GNU_SOURCE
#include "core/par.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"

enum { PAR_SPIN_NS = 200000 }; /* a worker spins this long for the next loop, then sleeps */

struct akv_par {
    uint32_t n_threads; /* the caller included */
    pthread_t *workers; /* [n_threads - 1] */
    uint32_t n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint_fast64_t gen; /* loops published so far */
    atomic_uint next;         /* the next task to claim */
    atomic_uint out;          /* workers done with the current loop */
    atomic_int stop;
    bool spin;                /* n_threads <= the cores online */
    atomic_int caller_waiting; /* the caller sleeps on done_cv */
    pthread_cond_t done_cv;
    /* the current loop: written by the caller before gen is bumped */
    akv_par_fn fn;
    void *ctx;
    uint32_t n_tasks;
};

static inline void par_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void par_run_tasks(akv_par *p) {
    for (;;) {
        unsigned t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t);
    }
}

/* A worker: waits for a generation it has not run, runs its tasks, checks out. */
static void *par_worker(void *arg) {
    akv_par *p = arg;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g == seen && !atomic_load_explicit(&p->stop, memory_order_relaxed)) {
            uint64_t t0 = akv_clock_ns();
            for (uint32_t i = 0; g == seen && p->spin; i++) {
                par_pause();
                g = atomic_load_explicit(&p->gen, memory_order_acquire);
                if ((i & 255) == 255 && akv_clock_ns() - t0 > PAR_SPIN_NS) break;
            }
            if (g == seen) {
                pthread_mutex_lock(&p->mu);
                while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
                       !atomic_load_explicit(&p->stop, memory_order_relaxed))
                    pthread_cond_wait(&p->cv, &p->mu);
                pthread_mutex_unlock(&p->mu);
            }
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        seen = g;
        par_run_tasks(p);
        /* seq_cst with the caller's caller_waiting store: one of the two sees the other */
        if (atomic_fetch_add(&p->out, 1) + 1 == p->n_started && atomic_load(&p->caller_waiting)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

uint32_t akv__par_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return (uint32_t)CPU_COUNT(&set);
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (uint32_t)n;
}

akv_status akv__par_create(uint32_t n_threads, akv_par **out) {
    if (!out) return AKV_EINVAL;
    const uint32_t cores = akv__par_cores();
    if (n_threads == 0) n_threads = cores > AKV_PAR_MAX_THREADS ? AKV_PAR_MAX_THREADS : cores;
    if (n_threads > AKV_PAR_MAX_THREADS) {
        AKV_LOG_E("par: %u threads; at most %u", n_threads, AKV_PAR_MAX_THREADS);
        return AKV_EINVAL;
    }
    akv_par *p = akv__calloc(1, sizeof *p);
    if (!p) return AKV_ENOMEM;
    p->n_threads = n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->next, 0);
    atomic_init(&p->out, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->caller_waiting, 0);
    p->spin = n_threads <= cores;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    if (n_threads > 1 && !(p->workers = akv__calloc(n_threads - 1, sizeof *p->workers))) {
        akv__par_destroy(p);
        return AKV_ENOMEM;
    }
    for (uint32_t i = 0; i + 1 < n_threads; i++) {
        int e = pthread_create(&p->workers[i], NULL, par_worker, p);
        if (e) {
            AKV_LOG_E("par: starting worker thread %u of %u failed (error %d)", i + 1,
                      n_threads - 1, e);
            akv__par_destroy(p);
            return AKV_EUNSUPPORTED;
        }
        p->n_started++;
    }
    *out = p;
    return AKV_OK;
}

void akv__par_destroy(akv_par *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->n_started; i++)
        pthread_join(p->workers[i], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    akv__free(p->workers);
    akv__free(p);
}

uint32_t akv__par_n_threads(const akv_par *p) {
    return p ? p->n_threads : 1;
}

void akv__par_for(akv_par *p, uint32_t n_tasks, akv_par_fn fn, void *ctx) {
    if (n_tasks == 0) return;
    if (!p || p->n_started == 0 || n_tasks == 1) {
        for (uint32_t t = 0; t < n_tasks; t++)
            fn(ctx, t);
        return;
    }
    p->fn = fn, p->ctx = ctx, p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->out, 0, memory_order_relaxed);
    /* publish; wake sleepers (the mutex orders the bump against a worker about to wait) */
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    par_run_tasks(p);
    const uint64_t t0 = p->spin ? akv_clock_ns() : 0;
    for (uint32_t i = 0;
         p->spin && atomic_load_explicit(&p->out, memory_order_acquire) < p->n_started; i++) {
        par_pause();
        if ((i & 255) == 255 && akv_clock_ns() - t0 > PAR_SPIN_NS) break;
    }
    if (atomic_load_explicit(&p->out, memory_order_acquire) < p->n_started) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_waiting, 1);
        while (atomic_load(&p->out) < p->n_started) pthread_cond_wait(&p->done_cv, &p->mu);
        atomic_store(&p->caller_waiting, 0);
        pthread_mutex_unlock(&p->mu);
    }
}
