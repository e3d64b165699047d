/*
 * core/par.h — a pool of worker threads for data-parallel loops on the host.
 *
 * akv__par_for(p, n, fn, ctx) runs fn(ctx, t) once for every task t < n, spread over the
 * pool's threads (the caller is one of them), and returns when every task has run. Tasks are
 * claimed in order from a shared counter, so which thread runs a task varies from call to
 * call: a task's result must depend on t alone (the host products split their output
 * columns into tasks; each column is computed by the same arithmetic on any thread, so the
 * results do not depend on the thread count either).
 *
 * A loop waits for its tasks, never for a worker that holds none: a worker the scheduler keeps
 * off its core (another process on the machine) misses the loop and costs it nothing.
 *
 * Waiting: between loops the workers spin for a short while (a decode step runs a few
 * hundred loops a token, and a sleeping thread takes tens of microseconds to wake), yielding
 * their core now and then to any other runnable thread, then sleep on a condition variable;
 * the caller likewise for the tasks' end. A pool of more threads than akv__par_cores() never
 * spins (a spinner would hold the core its peer needs).
 *
 * Thread-safety: one akv__par_for at a time per pool (the owner's thread); fn runs on several
 * threads at once and must only write what its task owns.
 */
#ifndef AKV_CORE_PAR_H
#define AKV_CORE_PAR_H

#include <stdint.h>

#include "akv/status.h"

typedef struct akv_par akv_par;

typedef void (*akv_par_fn)(void *ctx, uint32_t task);

/* The most threads a pool takes (the caller included). */
#define AKV_PAR_MAX_THREADS 1024u

/* The CPUs this process may run on (its affinity mask; at least 1). */
uint32_t akv__par_cores(void);

/* A pool of n_threads threads in all: the caller and n_threads - 1 workers (1 = no worker:
 * loops run on the caller alone). 0 = one per core of akv__par_cores(). AKV_EINVAL above
 * AKV_PAR_MAX_THREADS; AKV_ENOMEM, or AKV_EUNSUPPORTED when a thread cannot be started
 * (logged). */
akv_status akv__par_create(uint32_t n_threads, akv_par **out);

/* Stops and joins the workers. NULL is a no-op. */
void akv__par_destroy(akv_par *p);

uint32_t akv__par_n_threads(const akv_par *p);

/* Runs fn(ctx, t) for t = 0 .. n_tasks-1 (see the file comment). p NULL runs them in order on
 * the caller. */
void akv__par_for(akv_par *p, uint32_t n_tasks, akv_par_fn fn, void *ctx);

#endif
