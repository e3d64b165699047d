/*
 * dev_host.c — the host backend: device memory is host memory, every queue is a thread.
 *
 * It exists so that every invariant of the memory layer and the staging lifecycle runs on
 * the CPU, in CI, under the sanitizers. Device memory is page-aligned host memory; its
 * "device address" is the host address as a number. Pinned memory is page-aligned memory
 * (the host backend has no bus to pin for).
 *
 * Queues. Each of the three queues is a FIFO of commands served by its own worker thread,
 * so work really runs after the submitting call returns and really overlaps across queues:
 * a missing event wait is a real race here, not a theoretical one. Random per-queue delays
 * (akv_dev_inject_delays) widen the windows in which such a race shows.
 *
 * Events. An event counts its records (`submitted`); a record command carries its sequence
 * number and, when it runs, marks done[q] = seq on its queue. A wait or sync captures the
 * latest record (its seq and queue) at call time and is satisfied when done[queue] >= seq.
 * Records on one queue complete in order, so done[q] is monotonic and the test is exact even
 * when an event is re-recorded on another queue while an older record is pending.
 *
 * Faults. A command that fails while it runs (an injected exec failure, an op returning an
 * error, a wait on a failed record) faults its queue: later commands on it are skipped, the
 * records on it complete as failed, and queue/device sync report AKV_EDEVICE until
 * clear_faults. Skipped records still complete, so no waiter ever hangs. A record that failed
 * before a clear_faults stays failed (akv_dev_event_outcome) but no longer faults a queue that
 * waits on it: the recovered device is not failed again by old work.
 *
 * Locks: each queue's `mu` guards its list and counters; the state's `mu` guards every event
 * and every queue's `faulted`. A worker never holds both.
 *
 * Close never waits: it tells the workers to stop and detaches them. A worker in the middle of
 * a command finishes that one command; queued commands are dropped, never run; the last
 * worker to leave frees the state.
 */
#define _POSIX_C_SOURCE 200809L
#include "dev/dev_impl.h"

#include <pthread.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"

typedef struct host_event {
    /* all guarded by host_state.mu */
    int refs;                          /* the owner + commands in flight naming it */
    uint64_t submitted;                /* records submitted; the latest record's seq */
    akv_queue last_q;                  /* queue of the latest record */
    uint64_t done[AKV_N_QUEUES];       /* highest completed record seq, per queue */
    uint64_t failed_seq[AKV_N_QUEUES]; /* highest record seq that completed failed, per queue */
    uint64_t failed_epoch[AKV_N_QUEUES]; /* host_state.epoch when that record failed */
    uint64_t t_ns;                     /* completion time of the latest record */
} host_event;

typedef enum host_cmd_kind {
    CMD_COPY,   /* one 2D copy */
    CMD_BATCH,  /* n spans, trailing */
    CMD_MEMSET, /* dst, byte, n */
    CMD_RECORD, /* ev, seq */
    CMD_WAIT,   /* ev, seq on ev_q */
    CMD_OP,     /* op, args trailing */
    CMD_FN,     /* fn(arg) */
} host_cmd_kind;

typedef struct host_cmd {
    struct host_cmd *next;
    host_cmd_kind kind;
    unsigned flags;              /* AKV_SUBMIT_* */
    akv_dev_copy2d copy;         /* CMD_COPY; CMD_BATCH uses copy.kind */
    size_t n_spans;              /* CMD_BATCH */
    uint64_t dst;                /* CMD_MEMSET */
    int byte;                    /* CMD_MEMSET */
    size_t n_bytes;              /* CMD_MEMSET */
    host_event *ev;              /* CMD_RECORD, CMD_WAIT */
    uint64_t seq;                /* CMD_RECORD: this record; CMD_WAIT: the awaited record */
    akv_queue ev_q;              /* CMD_WAIT: the awaited record's queue */
    const akv_dev_op *op;        /* CMD_OP */
    akv_dev *dev;                /* CMD_OP: the front, for the host implementation */
    akv_dev_host_fn fn;          /* CMD_FN */
    void *arg;                   /* CMD_FN */
    alignas(max_align_t) unsigned char tail[]; /* spans or op arguments */
} host_cmd;

struct host_state;

typedef struct host_queue {
    struct host_state *s;
    akv_queue id;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;      /* guards the fields below */
    pthread_cond_t work_cv;  /* a command arrived, or stop */
    pthread_cond_t done_cv;  /* a command finished */
    host_cmd *head, *tail;
    uint64_t n_submitted, n_done;
    int stop;
    uint64_t rng;           /* delay random stream */
    uint32_t max_delay_us;  /* 0 = no delays */
    uint32_t delay_one_in;  /* a command is delayed with probability 1/delay_one_in */
    /* guarded by host_state.mu */
    int faulted;
    char why[160];          /* the first fault's reason */
} host_queue;

typedef struct host_state {
    pthread_mutex_t mu;    /* events, faulted flags, n_workers */
    pthread_cond_t ev_cv;  /* some record completed (or stop) */
    int stop;              /* guarded by mu: closing, waiters give up */
    int n_workers;         /* guarded by mu: worker threads alive; the last one frees the state */
    uint64_t epoch;        /* guarded by mu: recoveries so far (clear_faults) */
    host_queue q[AKV_N_QUEUES];
} host_state;

/* ---- memory ----------------------------------------------------------------------------- */

static akv_status host_aligned(size_t n_bytes, size_t align, void **p) {
    /* Not through core/alloc: these are the backend's "device" and "pinned" bytes,
     * accounted by the dev front, and injected there. */
    void *q = NULL;
    if (posix_memalign(&q, align, n_bytes) != 0) return AKV_ENOMEM;
    *p = q;
    return AKV_OK;
}

/* Waits until queue q has run everything submitted to it so far (or is stopping). */
static void host_queue_idle(host_queue *q) {
    pthread_mutex_lock(&q->mu);
    uint64_t target = q->n_submitted;
    while (q->n_done < target && !q->stop) pthread_cond_wait(&q->done_cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

/* Waits until every queue has run everything submitted (what cudaFree does before freeing). */
static void host_drain(host_state *s) {
    for (int i = 0; i < AKV_N_QUEUES; i++)
        host_queue_idle(&s->q[i]);
}

static akv_status host_mem_alloc(void *state, size_t n_bytes, uint64_t *addr) {
    (void)state;
    void *p;
    if (host_aligned(n_bytes, 4096, &p) != AKV_OK) return AKV_EDEVMEM;
    *addr = (uint64_t)(uintptr_t)p;
    return AKV_OK;
}

static akv_status host_mem_free(void *state, uint64_t addr) {
    host_drain(state);
    free((void *)(uintptr_t)addr);
    return AKV_OK;
}

static akv_status host_pinned_alloc(void *state, size_t n_bytes, void **p) {
    (void)state;
    return host_aligned(n_bytes, 4096, p);
}

static akv_status host_pinned_dptr(void *state, const void *p, uint64_t *addr) {
    (void)state;
    *addr = (uint64_t)(uintptr_t)p; /* device addresses are host addresses here */
    return AKV_OK;
}

static akv_status host_pinned_free(void *state, void *p) {
    host_drain(state);
    free(p);
    return AKV_OK;
}

static void host_copy2d(const akv_dev_copy2d *c) {
    for (size_t r = 0; r < c->n_rows; r++)
        memmove((char *)(uintptr_t)c->dst + r * c->dst_pitch,
                (const char *)(uintptr_t)c->src + r * c->src_pitch, c->width_bytes);
}

static akv_status host_copy_sync(void *state, akv_dev_copy_kind kind, uint64_t dst, uint64_t src,
                                 size_t n_bytes) {
    (void)state;
    (void)kind; /* every address is a host address here */
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n_bytes);
    return AKV_OK;
}

static akv_status host_memset_sync(void *state, uint64_t dst, int byte, size_t n_bytes) {
    (void)state;
    memset((void *)(uintptr_t)dst, byte, n_bytes);
    return AKV_OK;
}

/* ---- the workers --------------------------------------------------------------------------- */

static void host_event_unref(host_state *s, host_event *ev) {
    pthread_mutex_lock(&s->mu);
    int last = --ev->refs == 0;
    pthread_mutex_unlock(&s->mu);
    if (last) akv__free(ev);
}

static void host_cmd_free(host_state *s, host_cmd *c) {
    if (c->ev) host_event_unref(s, c->ev);
    akv__free(c);
}

/* Faults queue q with a reason (the first reason sticks). Caller holds s->mu. */
static void host_fault_locked(host_queue *q, const char *why) {
    if (!q->faulted) {
        q->faulted = 1;
        snprintf(q->why, sizeof q->why, "%s", why);
        AKV_LOG_E("dev(host): queue %s faulted: %s", akv_queue_name(q->id), why);
    }
}

static void host_fault(host_queue *q, const char *why) {
    pthread_mutex_lock(&q->s->mu);
    host_fault_locked(q, why);
    pthread_mutex_unlock(&q->s->mu);
}

static int host_faulted(host_queue *q) {
    pthread_mutex_lock(&q->s->mu);
    int f = q->faulted;
    pthread_mutex_unlock(&q->s->mu);
    return f;
}

/* Runs one command on queue q's worker. */
static void host_run(host_queue *q, host_cmd *c) {
    host_state *s = q->s;
    switch (c->kind) {
    case CMD_COPY:
    case CMD_BATCH:
    case CMD_MEMSET:
    case CMD_OP:
    case CMD_FN: {
        if (host_faulted(q)) return; /* skipped: the queue already failed */
        if (c->flags & AKV_SUBMIT_FAIL_EXEC) {
            host_fault(q, c->kind == CMD_OP   ? "injected op failure"
                          : c->kind == CMD_FN ? "injected host function failure"
                                              : "injected copy failure");
            return;
        }
        if (c->kind == CMD_COPY) {
            host_copy2d(&c->copy);
        } else if (c->kind == CMD_BATCH) {
            const akv_dev_xfer *x = (const akv_dev_xfer *)c->tail;
            for (size_t i = 0; i < c->n_spans; i++) {
                void *d = (void *)(uintptr_t)x[i].d.addr;
                if (c->copy.kind == AKV_COPY_H2D) memcpy(d, x[i].h, x[i].n_bytes);
                else memcpy(x[i].h, d, x[i].n_bytes);
            }
        } else if (c->kind == CMD_MEMSET) {
            memset((void *)(uintptr_t)c->dst, c->byte, c->n_bytes);
        } else if (c->kind == CMD_FN) {
            c->fn(c->arg);
        } else {
            akv_status st = c->op->host(c->dev, c->tail);
            if (st != AKV_OK) {
                char why[160];
                snprintf(why, sizeof why, "op '%s' failed: %s", c->op->name, akv_status_str(st));
                host_fault(q, why);
            }
        }
        return;
    }
    case CMD_RECORD: {
        pthread_mutex_lock(&s->mu);
        host_event *ev = c->ev;
        if (c->seq > ev->done[q->id]) ev->done[q->id] = c->seq;
        if (q->faulted && c->seq > ev->failed_seq[q->id])
            ev->failed_seq[q->id] = c->seq, ev->failed_epoch[q->id] = s->epoch;
        if (c->seq == ev->submitted) ev->t_ns = akv_clock_ns();
        pthread_cond_broadcast(&s->ev_cv);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    case CMD_WAIT: {
        pthread_mutex_lock(&s->mu);
        host_event *ev = c->ev;
        while (ev->done[c->ev_q] < c->seq && !s->stop) pthread_cond_wait(&s->ev_cv, &s->mu);
        /* a record that failed before the last recovery is finished work: waiting for it is
         * satisfied, it does not fault the recovered queue (its outcome stays failed) */
        if (ev->failed_seq[c->ev_q] >= c->seq && ev->failed_epoch[c->ev_q] == s->epoch) {
            char why[160];
            snprintf(why, sizeof why, "waited on an event whose record on queue %s failed",
                     akv_queue_name(c->ev_q));
            host_fault_locked(q, why);
        }
        pthread_mutex_unlock(&s->mu);
        return;
    }
    }
}

/* Sleeps a random while before a command, when delays are on (caller holds q->mu). */
static uint64_t host_pick_delay_ns(host_queue *q) {
    if (!q->max_delay_us) return 0;
    uint64_t z = (q->rng += 0x9E3779B97F4A7C15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    if ((z >> 32) % q->delay_one_in) return 0;
    return (z & 0xFFFFFFFFu) % ((uint64_t)q->max_delay_us + 1) * 1000;
}

/* Frees everything once no worker is left: queued commands are dropped, never run. */
static void host_free_state(host_state *s) {
    for (int i = 0; i < AKV_N_QUEUES; i++) {
        host_queue *q = &s->q[i];
        for (host_cmd *c = q->head, *next; c; c = next) {
            next = c->next;
            host_cmd_free(s, c);
        }
        pthread_cond_destroy(&q->work_cv);
        pthread_cond_destroy(&q->done_cv);
        pthread_mutex_destroy(&q->mu);
    }
    pthread_cond_destroy(&s->ev_cv);
    pthread_mutex_destroy(&s->mu);
    akv__free(s);
}

static void *host_worker(void *arg) {
    host_queue *q = arg;
    host_state *s = q->s;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop) pthread_cond_wait(&q->work_cv, &q->mu);
        if (q->stop) break;
        host_cmd *c = q->head;
        q->head = c->next;
        if (!q->head) q->tail = NULL;
        uint64_t delay_ns = host_pick_delay_ns(q);
        pthread_mutex_unlock(&q->mu);
        if (delay_ns) akv_clock_sleep_ns(delay_ns);
        host_run(q, c);
        host_cmd_free(q->s, c);
        pthread_mutex_lock(&q->mu);
        q->n_done++;
        pthread_cond_broadcast(&q->done_cv);
    }
    pthread_mutex_unlock(&q->mu);
    pthread_mutex_lock(&s->mu);
    int last = --s->n_workers == 0;
    pthread_mutex_unlock(&s->mu);
    if (last) host_free_state(s);
    return NULL;
}

/* A new command with `tail_bytes` of trailing storage; NULL when memory is short. */
static host_cmd *host_cmd_new(host_cmd_kind kind, unsigned flags, size_t tail_bytes) {
    size_t n;
    if (!akv__size_add(sizeof(host_cmd), tail_bytes, &n)) return NULL;
    host_cmd *c = akv__malloc(n);
    if (!c) return NULL;
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->flags = flags;
    return c;
}

/* Queues the chain first -> ... -> last (n commands, linked by next) as one unit: no other
 * submission lands between them. */
static void host_enqueue_chain(host_state *s, akv_queue qi, host_cmd *first, host_cmd *last,
                               size_t n) {
    host_queue *q = &s->q[qi];
    last->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail) q->tail->next = first;
    else q->head = first;
    q->tail = last;
    q->n_submitted += n;
    pthread_cond_signal(&q->work_cv);
    pthread_mutex_unlock(&q->mu);
}

static void host_enqueue(host_state *s, akv_queue qi, host_cmd *c) {
    host_enqueue_chain(s, qi, c, c, 1);
}

/* ---- open / close ----------------------------------------------------------------------------- */

static void host_close(void *state) {
    host_state *s = state;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->ev_cv);
    int n_workers = s->n_workers;
    pthread_mutex_unlock(&s->mu);
    if (n_workers == 0) { /* open failed before any thread started */
        host_free_state(s);
        return;
    }
    /* Detach first, and collect the queues now: once the last worker sees `stop` it frees
     * the state, so nothing of `s` may be read after the last queue's unlock. */
    host_queue *started[AKV_N_QUEUES];
    int n = 0;
    for (int i = 0; i < AKV_N_QUEUES; i++) {
        if (!s->q[i].started) continue;
        pthread_detach(s->q[i].thread);
        started[n++] = &s->q[i];
    }
    for (int i = 0; i < n; i++) {
        host_queue *q = started[i];
        pthread_mutex_lock(&q->mu);
        q->stop = 1;
        pthread_cond_broadcast(&q->work_cv);
        pthread_cond_broadcast(&q->done_cv);
        pthread_mutex_unlock(&q->mu);
    }
}

static akv_status host_open(const akv_dev_params *params, void **state) {
    if (params->device_index != 0) return AKV_EDEVICE; /* the host is one device */
    host_state *s = akv__calloc(1, sizeof *s);
    if (!s) return AKV_ENOMEM;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->ev_cv, NULL);
    for (int i = 0; i < AKV_N_QUEUES; i++) {
        host_queue *q = &s->q[i];
        q->s = s;
        q->id = (akv_queue)i;
        q->delay_one_in = 1;
        pthread_mutex_init(&q->mu, NULL);
        pthread_cond_init(&q->work_cv, NULL);
        pthread_cond_init(&q->done_cv, NULL);
    }
    for (int i = 0; i < AKV_N_QUEUES; i++) {
        pthread_mutex_lock(&s->mu);
        s->n_workers++; /* before the thread exists: it may only decrement after this */
        pthread_mutex_unlock(&s->mu);
        if (pthread_create(&s->q[i].thread, NULL, host_worker, &s->q[i]) != 0) {
            pthread_mutex_lock(&s->mu);
            s->n_workers--;
            pthread_mutex_unlock(&s->mu);
            AKV_LOG_E("dev(host): cannot start the %s queue's thread", akv_queue_name((akv_queue)i));
            host_close(s);
            return AKV_EDEVICE;
        }
        s->q[i].started = 1;
    }
    *state = s;
    return AKV_OK;
}

static akv_status host_info(void *state, akv_dev_info *out) {
    (void)state;
    memset(out, 0, sizeof *out);
    strcpy(out->name, "host");
    out->is_host = 1;
    out->n_sm = 1;
    out->smem_per_block_bytes = 227 * 1024;
    out->l2_bytes = 0;
    return AKV_OK;
}

/* ---- events --------------------------------------------------------------------------------- */

static akv_status host_event_create(void *state, unsigned flags, void **out) {
    (void)state;
    (void)flags; /* every host event keeps a completion time */
    host_event *ev = akv__calloc(1, sizeof *ev);
    if (!ev) return AKV_ENOMEM;
    ev->refs = 1;
    *out = ev;
    return AKV_OK;
}

static void host_event_destroy(void *state, void *ev) {
    host_event_unref(state, ev);
}

/* Submits a record of ev on q (CMD_RECORD: a new sequence number), or a wait of q for ev's
 * latest record (CMD_WAIT: captured now, CUDA semantics). */
static akv_status host_event_cmd(host_state *s, host_cmd_kind kind, host_event *ev, akv_queue q) {
    host_cmd *c = host_cmd_new(kind, 0, 0);
    if (!c) return AKV_ENOMEM;
    pthread_mutex_lock(&s->mu);
    c->ev = ev;
    if (kind == CMD_RECORD) {
        c->seq = ++ev->submitted;
        ev->last_q = q;
    } else {
        c->seq = ev->submitted;
        c->ev_q = ev->last_q;
    }
    ev->refs++;
    pthread_mutex_unlock(&s->mu);
    host_enqueue(s, q, c);
    return AKV_OK;
}

static akv_status host_event_record(void *state, void *ev, akv_queue q) {
    return host_event_cmd(state, CMD_RECORD, ev, q);
}

static akv_status host_queue_wait(void *state, akv_queue q, void *ev) {
    return host_event_cmd(state, CMD_WAIT, ev, q);
}

/* Completion of the latest record; caller holds s->mu. 1 done, 0 pending, -1 failed. */
static int host_event_state(const host_event *ev) {
    if (ev->done[ev->last_q] < ev->submitted) return 0;
    return ev->failed_seq[ev->last_q] >= ev->submitted ? -1 : 1;
}

static akv_status host_event_query(void *state, void *evp, int *done) {
    host_state *s = state;
    pthread_mutex_lock(&s->mu);
    int st = host_event_state(evp);
    pthread_mutex_unlock(&s->mu);
    *done = st; /* -1: completed on a faulted queue (the front reports it) */
    return AKV_OK;
}

static akv_status host_event_sync(void *state, void *evp) {
    host_state *s = state;
    host_event *ev = evp;
    pthread_mutex_lock(&s->mu);
    /* Capture the record current at the call: a later re-record is not waited for. */
    uint64_t seq = ev->submitted;
    akv_queue q = ev->last_q;
    while (ev->done[q] < seq && !s->stop) pthread_cond_wait(&s->ev_cv, &s->mu);
    int failed = ev->failed_seq[q] >= seq;
    pthread_mutex_unlock(&s->mu);
    if (failed) {
        AKV_LOG_E("dev(host): event's record completed on a faulted queue (%s)", akv_queue_name(q));
        return AKV_EDEVICE;
    }
    return AKV_OK;
}

static akv_status host_event_elapsed_ns(void *state, void *a, void *b, uint64_t *ns) {
    host_state *s = state;
    host_event *x = a, *y = b;
    pthread_mutex_lock(&s->mu);
    int ok = host_event_state(x) == 1 && host_event_state(y) == 1;
    uint64_t ta = x->t_ns, tb = y->t_ns;
    pthread_mutex_unlock(&s->mu);
    if (!ok) return AKV_ESTATE;
    *ns = tb > ta ? tb - ta : 0;
    return AKV_OK;
}

static akv_status host_queue_sync(void *state, akv_queue qi) {
    host_state *s = state;
    host_queue *q = &s->q[qi];
    host_queue_idle(q);
    pthread_mutex_lock(&s->mu);
    int faulted = q->faulted;
    char why[sizeof q->why];
    memcpy(why, q->why, sizeof why);
    pthread_mutex_unlock(&s->mu);
    if (faulted) {
        AKV_LOG_E("dev(host): queue %s is faulted: %s", akv_queue_name(qi), why);
        return AKV_EDEVICE;
    }
    return AKV_OK;
}

static akv_status host_dev_sync(void *state) {
    akv_status first = AKV_OK;
    for (int i = 0; i < AKV_N_QUEUES; i++) {
        akv_status st = host_queue_sync(state, (akv_queue)i);
        if (first == AKV_OK) first = st;
    }
    return first;
}

/* ---- async copies and ops ---------------------------------------------------------------------- */

static akv_status host_copy_async(void *state, akv_queue q, const akv_dev_copy2d *cp,
                                  unsigned flags) {
    host_cmd *c = host_cmd_new(CMD_COPY, flags, 0);
    if (!c) return AKV_ENOMEM;
    c->copy = *cp;
    host_enqueue(state, q, c);
    return AKV_OK;
}

static akv_status host_copy_batch_async(void *state, akv_queue q, akv_dev_copy_kind kind,
                                        const akv_dev_xfer *x, size_t n,
                                        const akv_copy_config *cfg, unsigned flags) {
    (void)cfg; /* every method is a memcpy here */
    size_t tail;
    if (!akv__size_mul(n, sizeof *x, &tail)) return AKV_EOVERFLOW;
    host_cmd *c = host_cmd_new(CMD_BATCH, flags, tail);
    if (!c) return AKV_ENOMEM;
    c->copy.kind = kind;
    c->n_spans = n;
    memcpy(c->tail, x, tail);
    host_enqueue(state, q, c);
    return AKV_OK;
}

static akv_status host_memset_async(void *state, akv_queue q, uint64_t dst, int byte,
                                    size_t n_bytes, unsigned flags) {
    host_cmd *c = host_cmd_new(CMD_MEMSET, flags, 0);
    if (!c) return AKV_ENOMEM;
    c->dst = dst;
    c->byte = byte;
    c->n_bytes = n_bytes;
    host_enqueue(state, q, c);
    return AKV_OK;
}

static akv_status host_fn_async(void *state, akv_queue q, akv_dev_host_fn fn, void *arg,
                                unsigned flags) {
    host_cmd *c = host_cmd_new(CMD_FN, flags, 0);
    if (!c) return AKV_ENOMEM;
    c->fn = fn;
    c->arg = arg;
    host_enqueue(state, q, c);
    return AKV_OK;
}

static akv_status host_copy_method_check(void *state, akv_copy_method m) {
    (void)state;
    (void)m; /* every method is a memcpy on the host */
    return AKV_OK;
}

static int host_op_supported(void *state, const akv_dev_op *op) {
    (void)state;
    return op->host != NULL;
}

/* A command that runs op with a copy of its arguments; NULL when memory is short. */
static host_cmd *host_op_cmd(akv_dev *dev, const akv_dev_op *op, const void *args,
                             unsigned flags) {
    host_cmd *c = host_cmd_new(CMD_OP, flags, op->args_bytes);
    if (!c) return NULL;
    c->op = op;
    c->dev = dev;
    if (op->args_bytes) memcpy(c->tail, args, op->args_bytes);
    return c;
}

static akv_status host_op_launch(void *state, akv_dev *dev, const akv_dev_op *op,
                                 const void *args, unsigned flags) {
    host_cmd *c = host_op_cmd(dev, op, args, flags);
    if (!c) return AKV_ENOMEM;
    host_enqueue(state, AKV_QUEUE_COMPUTE, c);
    return AKV_OK;
}

/* ---- graphs: the launches kept, queued again at each launch ------------------------------------ */

typedef struct host_graph {
    akv_dev *dev;
    size_t n;
    const akv_dev_op **ops; /* [n] */
    unsigned char **args;   /* [n], each op->args_bytes (NULL when 0) */
} host_graph;

static void host_graph_destroy(void *state, void *gp) {
    (void)state;
    host_graph *g = gp;
    for (size_t i = 0; g->args && i < g->n; i++)
        akv__free(g->args[i]);
    akv__free(g->args);
    akv__free(g->ops);
    akv__free(g);
}

static akv_status host_graph_create(void *state, akv_dev *dev, const akv_dev_launch *l, size_t n,
                                    void **out) {
    host_graph *g = akv__calloc(1, sizeof *g);
    if (!g) return AKV_ENOMEM;
    g->dev = dev, g->n = n;
    g->ops = akv__calloc(n, sizeof *g->ops);
    g->args = akv__calloc(n, sizeof *g->args);
    if (!g->ops || !g->args) {
        host_graph_destroy(state, g);
        return AKV_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        g->ops[i] = l[i].op;
        if (!l[i].op->args_bytes) continue;
        if (!(g->args[i] = akv__malloc(l[i].op->args_bytes))) {
            host_graph_destroy(state, g);
            return AKV_ENOMEM;
        }
        memcpy(g->args[i], l[i].args, l[i].op->args_bytes);
    }
    *out = g;
    return AKV_OK;
}

/* Every command is made before any is queued: a launch is queued whole or not at all. An
 * injected exec failure fails the first launch (the rest are skipped by the faulted queue). */
static akv_status host_graph_launch(void *state, void *gp, unsigned flags) {
    host_graph *g = gp;
    host_cmd *first = NULL, *last = NULL, **link = &first;
    for (size_t i = 0; i < g->n; i++) {
        host_cmd *c = host_op_cmd(g->dev, g->ops[i], g->args[i], i == 0 ? flags : 0);
        if (!c) {
            for (host_cmd *d = first, *next; d; d = next) {
                next = d->next;
                host_cmd_free(state, d);
            }
            return AKV_ENOMEM;
        }
        *link = last = c;
        link = &c->next;
    }
    host_enqueue_chain(state, AKV_QUEUE_COMPUTE, first, last, g->n);
    return AKV_OK;
}

/* ---- test controls ---------------------------------------------------------------------------- */

static akv_status host_inject_delays(void *state, uint64_t seed, uint32_t max_delay_us,
                                     uint32_t one_in) {
    host_state *s = state;
    for (int i = 0; i < AKV_N_QUEUES; i++) {
        host_queue *q = &s->q[i];
        pthread_mutex_lock(&q->mu);
        q->rng = seed * 0x100000001B3ull + (uint64_t)i * 0x9E3779B97F4A7C15ull;
        q->max_delay_us = max_delay_us;
        q->delay_one_in = one_in;
        pthread_mutex_unlock(&q->mu);
    }
    return AKV_OK;
}

static void host_clear_faults(void *state) {
    host_state *s = state;
    host_drain(s); /* work accepted before the recovery ends as it would have (skipped) */
    pthread_mutex_lock(&s->mu);
    s->epoch++;
    for (int i = 0; i < AKV_N_QUEUES; i++) {
        s->q[i].faulted = 0;
        s->q[i].why[0] = 0;
    }
    pthread_mutex_unlock(&s->mu);
}

static const akv_dev_backend host_backend = {
    .name = "host",
    .is_host = 1,
    .open = host_open,
    .close = host_close,
    .info = host_info,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .pinned_alloc = host_pinned_alloc,
    .pinned_free = host_pinned_free,
    .pinned_dptr = host_pinned_dptr,
    .copy_sync = host_copy_sync,
    .memset_sync = host_memset_sync,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .queue_wait = host_queue_wait,
    .event_query = host_event_query,
    .event_sync = host_event_sync,
    .event_elapsed_ns = host_event_elapsed_ns,
    .queue_sync = host_queue_sync,
    .dev_sync = host_dev_sync,
    .copy_async = host_copy_async,
    .copy_batch_async = host_copy_batch_async,
    .host_fn_async = host_fn_async,
    .memset_async = host_memset_async,
    .default_copy_method = AKV_COPY_METHOD_COALESCE,
    .copy_method_check = host_copy_method_check,
    .op_launch = host_op_launch,
    .op_supported = host_op_supported,
    .graph_create = host_graph_create,
    .graph_launch = host_graph_launch,
    .graph_destroy = host_graph_destroy,
    .inject_delays = host_inject_delays,
    .clear_faults = host_clear_faults,
};

const akv_dev_backend *akv_dev_host_backend(void) {
    return &host_backend;
}
