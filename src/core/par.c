/* par.c — the worker-thread pool of core/par.h.
 *
 * One loop at a time, in generations. The pool's state is one 64-bit word: the generation
 * (bits 33..63), an "open" bit (32) and the number of workers inside the loop (bits 0..31).
 * The caller writes a loop's fields while no worker is inside and the word is closed, then
 * publishes the next generation, open. A worker joins by raising the count with a
 * compare-and-swap that also checks the generation and the open bit, so it reads the loop's
 * fields only while the caller cannot rewrite them; it claims tasks from a shared counter and
 * leaves. The caller runs tasks too, waits until every task has run, and closes the word; the
 * next loop first waits for the workers still inside (they found no task left and are
 * leaving).
 *
 * So a loop never waits for a worker that has not joined it: a worker the scheduler keeps off
 * its core (another process on the machine) costs a loop nothing unless it holds one of its
 * tasks, and a worker that misses a loop altogether misses nothing.
 *
 * Waiting: where every thread has a core of its own, a worker spins PAR_SPIN_NS for the next
 * loop and the caller spins for the tasks' end, since a loop is microseconds; a spinner yields
 * its core at every clock check, so a runnable thread of another process gets it. With more
 * threads than cores online nobody spins: workers sleep at once, and the caller sleeps until
 * the tasks are done. */
#define _GNU_SOURCE
#include "core/par.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"

enum { PAR_SPIN_NS = 200000 }; /* a spinner spins this long, then sleeps */

#define ST_OPEN ((uint64_t)1 << 32)
#define ST_INSIDE ((uint64_t)0xffffffffu)
#define ST_GEN(s) ((s) >> 33)

struct akv_par {
    uint32_t n_threads; /* the caller included */
    pthread_t *workers; /* [n_threads - 1] */
    uint32_t n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* workers wait here for a generation */
    pthread_cond_t done_cv; /* the caller waits here for the tasks' end or the last leaver */
    _Atomic uint64_t state; /* generation | open | workers inside (the file comment) */
    atomic_uint next;       /* the next task to claim */
    atomic_uint done;       /* tasks run */
    atomic_int stop;
    atomic_int caller_waiting; /* the caller sleeps on done_cv */
    bool spin;                 /* n_threads <= the cores online */
    /* the current loop: written by the caller while the state is closed and nobody inside */
    akv_par_fn fn;
    void *ctx;
    uint32_t n_tasks;
};

static inline void par_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* A condition a thread waits for (arg: what it needs besides the pool). */
typedef bool (*par_cond)(akv_par *p, uint64_t arg);

/* Spins (where the pool may) until done(p, arg) holds or PAR_SPIN_NS pass, yielding the core
 * now and then; whether it holds. */
static bool par_spin_until(akv_par *p, par_cond done, uint64_t arg) {
    if (!p->spin) return done(p, arg);
    const uint64_t t0 = akv_clock_ns();
    for (uint32_t i = 1;; i++) {
        if (done(p, arg)) return true;
        par_pause();
        if ((i & 255) == 0) {
            if (akv_clock_ns() - t0 > PAR_SPIN_NS) return done(p, arg);
            sched_yield();
        }
    }
}

/* The caller sleeps on done_cv until done(p) holds. The seq_cst store of caller_waiting pairs
 * with the seq_cst update a worker makes before it reads caller_waiting: one of the two sees
 * the other. */
static void par_sleep_until(akv_par *p, par_cond done) {
    if (done(p, 0)) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->caller_waiting, 1);
    while (!done(p, 0)) pthread_cond_wait(&p->done_cv, &p->mu);
    atomic_store(&p->caller_waiting, 0);
    pthread_mutex_unlock(&p->mu);
}

static void par_wake_caller(akv_par *p) {
    if (!atomic_load(&p->caller_waiting)) return;
    pthread_mutex_lock(&p->mu);
    pthread_cond_signal(&p->done_cv);
    pthread_mutex_unlock(&p->mu);
}

/* seq_cst loads: par_sleep_until's pairing needs them */
static bool par_tasks_done(akv_par *p, uint64_t unused) {
    (void)unused;
    return atomic_load(&p->done) == p->n_tasks;
}
static bool par_nobody_inside(akv_par *p, uint64_t unused) {
    (void)unused;
    return (atomic_load(&p->state) & ST_INSIDE) == 0;
}

static void par_run_tasks(akv_par *p) {
    for (;;) {
        const unsigned t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t);
        if (atomic_fetch_add(&p->done, 1) + 1 == p->n_tasks) par_wake_caller(p);
    }
}

static bool par_stopping(const akv_par *p) {
    return atomic_load_explicit(&p->stop, memory_order_acquire);
}

/* A worker's wait: a generation other than `seen` published, or the pool stopping. */
static bool par_moved_on(akv_par *p, uint64_t seen) {
    return ST_GEN(atomic_load_explicit(&p->state, memory_order_acquire)) != seen || par_stopping(p);
}

/* A worker: waits for a generation it has not seen, joins it if still open, runs tasks,
 * leaves. */
static void *par_worker(void *arg) {
    akv_par *p = arg;
    uint64_t seen = 0;
    for (;;) {
        if (!par_spin_until(p, par_moved_on, seen)) {
            pthread_mutex_lock(&p->mu);
            while (!par_moved_on(p, seen)) pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (par_stopping(p)) break;
        uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
        if (!(s & ST_OPEN)) { /* missed: the caller ran that loop without us */
            seen = ST_GEN(s);
            continue;
        }
        if (!atomic_compare_exchange_strong_explicit(&p->state, &s, s + 1, memory_order_acq_rel,
                                                     memory_order_acquire))
            continue; /* another joined, or the loop closed or moved on: look again */
        seen = ST_GEN(s);
        par_run_tasks(p);
        const uint64_t left = atomic_fetch_sub(&p->state, 1) - 1;
        if ((left & ST_INSIDE) == 0 && !(left & ST_OPEN)) par_wake_caller(p);
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
    atomic_init(&p->state, 0);
    atomic_init(&p->next, 0);
    atomic_init(&p->done, 0);
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
    /* the last loop's stragglers out before its fields change */
    if (!par_spin_until(p, par_nobody_inside, 0)) par_sleep_until(p, par_nobody_inside);
    p->fn = fn, p->ctx = ctx, p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    /* publish the next generation, open (nobody inside: the count is 0); the mutex orders
     * the bump against a worker about to sleep */
    const uint64_t s = atomic_load_explicit(&p->state, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->state, ((ST_GEN(s) + 1) << 33) | ST_OPEN, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    par_run_tasks(p);
    if (!par_spin_until(p, par_tasks_done, 0)) par_sleep_until(p, par_tasks_done);
    atomic_fetch_and(&p->state, ~ST_OPEN);
}
