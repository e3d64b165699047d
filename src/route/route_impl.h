/*
 * route/route_impl.h — the route's insides (akv/route.h), shared by the history core
 * (route.c: sequences, the step's placement, tables, fills, settle) and the kinds
 * (route_resident.c; route_staged.c: one lease per layer for the whole batch, prefetch).
 *
 * The kind is an interface: akv__route_kind is everything a kind decides, and nothing outside
 * this floor names a kind. Its policy: its part of the engine's memory plan (plan_staging,
 * plan_windows), a request's reservation (need), a sequence's window (window), and the
 * placement of each step (order: the logical pages it wants in the device window, most wanted
 * first, which the device pool holds as far as the budget allows; outside: where the rest
 * lies for the step). Its transport: what it adds to the core's step (resident: the
 * write-back of the new rows at end_layer; staged: the lease of each layer, copies at
 * begin_layer, write-back and seal at end_layer, retirement at the next step boundary).
 *
 * Tables (tab_h, and its device copy tab_d in the queued mode), one layout for every step:
 *   [indptr max_seqs+1][last_page_len max_seqs][pad to 4] [indices n_layers x cap]
 *   cap = max_seqs * max_pages; the step's sequence i owns indices[l * cap + indptr[i] + p]
 *   for its logical page p of layer l (CSR over the step, packed in batch order). The window
 *   is uniform over layers, so indptr and last_page_len serve every layer. Addresses never
 *   move, so a resident decode batch replays as a graph.
 */
#ifndef AKV_ROUTE_IMPL_H
#define AKV_ROUTE_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "akv/admit.h"
#include "akv/host_table.h"
#include "akv/route.h"
#include "akv/stage.h"
#include "core/par.h"

struct akv_route_seq {
    akv_route *r;
    akv_host_table *ht;     /* the authoritative copy */
    akv_dev_pool_ctx *ctx;  /* the device window */
    akv_route_seq_params p; /* resolved: max_history, target, burst, tag */
    akv_dev_pool_ctx *cctx; /* hybrid: its compact pages */
    akv_host_table *cht;    /* staged hybrid: its compact copies, grown with ht (a page's copy
                               is made once the page leaves the exact part) */
    uint32_t hc_valid;      /* staged hybrid: its compact copies below this logical page are
                               encodings of its host copy as it is now */
    uint32_t *cstaged;      /* staged hybrid, the step begun last: its compact pages outside
                               its compact window (ascending), [max_pages] */
    uint32_t n_cstaged;
    uint32_t cstage_off;    /* the first of them in a layer's compact copy list */
    uint32_t x0;            /* the exact table holds logical page 0 then x0, x0+1, ... (the
                               step begun last; hybrid: its first exact page after the sink;
                               host-attended: its first page after the host's, 1 + the pages
                               the host attends; else 1) */
    uint32_t n_compact;     /* hybrid: compact pages of the step begun last (1 .. x0-1) */
    uint32_t c_valid;       /* hybrid: its compact pages below this logical page are encodings
                               of its host copy as it is now (a truncate lowers it) */
    uint64_t n_tokens;      /* history length (host table length) */
    /* the placement of the step begun last (route.c, route_place): runs over its logical
     * pages, in order, covering its history */
    akv_kv_run *runs;       /* [max_pages] */
    uint32_t n_runs;
    uint64_t step_first;    /* its length before the step begun last that held it */
    int32_t slot;           /* its index in the step begun last; -1 when not in it */
    bool refill;            /* the device window is not trusted: a step failed after the device
                               pool placed it (the pool marks pages fresh for one step only), a
                               queue failed, or (queued) the step begun last has not reached
                               its last end_layer. Its next step refills every window page that
                               holds earlier tokens */
    bool closing;           /* closed: freed once nothing may touch its pages */
    bool unfilled;          /* opened unfilled: its host copy is being written by the caller
                               (akv_route_seq_open_unfilled); it takes part in nothing yet */
    akv_route_seq_stats stats;
    /* staged, the step begun last: its logical pages outside the window (ascending; the same
     * in every layer), where they sit in the layer's copy list, and its owner pages */
    uint32_t *staged;       /* [max_pages] */
    uint32_t n_staged;      /* (derived from its runs: every page of a STAGED run) */
    uint32_t stage_off;     /* first of its pages in the copy list / slot ids */
    uint32_t owner_off;     /* first of its owner pages in the lease's owner list */
    akv_route_seq *next, *prev; /* the open list, or the closing list */
};

typedef struct akv__route_kind {
    akv_route_kind kind;
    const char *name;
    /* ---- the policy ---- */
    /* plan: device pages its stage takes from the device pool's reserve for max_seqs
     * histories of max_history tokens with windows of window_pages */
    uint32_t (*plan_staging)(const akv_geom *g, uint64_t max_history, uint32_t window_pages,
                             uint32_t max_seqs);
    /* plan: each context's window (pl->target, pl->burst) once the pools are sized, or
     * AKV_EFULL, logged naming the field to change, when max_seqs histories cannot be held */
    akv_status (*plan_windows)(const akv_geom *g, uint64_t max_history, uint32_t max_seqs,
                               const akv_fit *fit, akv_route_plan *pl);
    /* need: window pages per layer a history of n_tokens reserves under plan pl (0: lent, not
     * reserved) */
    uint32_t (*need)(const akv_route_plan *pl, const akv_geom *g, uint64_t n_tokens);
    /* a sequence's window: target and burst of *p resolved and checked against the pool's
     * window capacity (AKV_EINVAL, logged naming the field) */
    akv_status (*window)(const akv_route *r, akv_route_seq_params *p, uint32_t window_capacity);
    /* place: the logical pages of a history of n_tokens wanted in the device window, most
     * wanted first, into order (room for every logical page); the first *n_floor are its
     * floor. Returns how many. */
    uint32_t (*order)(const akv_route *r, const akv_route_seq *s, uint64_t n_tokens,
                      uint32_t *order, uint32_t *n_floor);
    /* place: the pages of the compact part (hybrid; NULL for a kind without one), most wanted
     * first, into order; all of them are needed (*n_floor = the count). Returns how many (0:
     * none this step). */
    uint32_t (*compact_order)(const akv_route *r, const akv_route_seq *s, uint64_t n_tokens,
                              uint32_t *order, uint32_t *n_floor);
    /* place: the residence of the step's pages outside the window; AKV_KV_WINDOW = none may
     * be (the device pool's refusal to hold them all is the step's failure; a kind with a
     * compact part reads them there) */
    akv_kv_residence outside;
    /* place (host-attended; NULL = none): of the n_cold pages of s outside its window this
     * step (pages 1 .. n_cold: the window is the sink and the newest pages), how many, the
     * oldest, the host attends where they lie (AKV_KV_HOST); decode: the step gives every
     * sequence one new token (the host part's states come a row a sequence) */
    uint32_t (*host_pages)(const akv_route *r, const akv_route_seq *s, uint32_t n_cold, bool decode);
    /* a queued route of this kind is replayable as a graph (akv_kv_hooks.replayable) */
    bool replayable;
    /* ---- the transport ---- */
    /* staged: the stage (borrowed or made from the staging reserve); NULL = nothing */
    akv_status (*open)(akv_route *r, const akv_route_params *p);
    /* frees what open made beyond the staged kind's (route_free frees that); NULL = nothing */
    void (*free)(akv_route *r);
    /* the transport of the last step retired (fences waited on), and a prefetched lease with
     * it unless keep_prefetch (begin_step keeps it for the step it was made for);
     * *quarantined: once per call */
    akv_status (*retire)(akv_route *r, bool keep_prefetch, bool *quarantined);
    /* after begin_step placed the batch reqs[n] (not yet committed): drop a prefetch made for
     * another step */
    akv_status (*placed)(akv_route *r, const akv_route_req *reqs, uint32_t n);
    akv_status (*begin_layer)(akv_route *r, uint32_t layer);
    /* host-attended (NULL = none): the layer's host part once the parts are filled: the
     * query rows from parts->q to the host, the host's states of every sequence's host pages
     * into parts->host_o/host_lse, in the compute queue's order */
    akv_status (*host_part)(akv_route *r, uint32_t layer, akv_kv_parts *parts);
    akv_status (*end_layer)(akv_route *r, uint32_t layer);
    /* leases live (destroy and close wait for them) */
    bool (*live)(const akv_route *r);
} akv__route_kind;

enum { AKV__ROUTE_HEAD_ALIGN = 4 }; /* int32s: the indices start 16-byte aligned */
/* The staged compact route's stage: two slots, a layer's copies overlapping the layer before's
 * attention. A third slot (measured, docs/benchmarks.md) left the bus's idle time between
 * layers as it was, since the step's compute is as long as its copies, and took its pages from
 * the compact window, so more was staged and the step was slower. */
enum { AKV__ROUTE_CSTAGE_SLOTS = 2 };

/* A compact page to make: the exact host page it encodes, and where it goes: a page of the
 * compact pool (through cstage), or a compact copy on the host (dst, staged hybrid). */
typedef struct akv__route_cjob {
    const void *src;
    void *dst;
    uint32_t page_id;
} akv__route_cjob;

struct akv_route {
    akv_dev *dev;
    akv_host_pool *hp;
    akv_dev_pool *dp;
    akv_geom geom;
    const akv__route_kind *kind;
    bool queued;
    uint64_t max_history;  /* the longest history of any sequence, tokens */
    uint32_t max_pages;    /* logical pages per layer at max_history: the attention's capacity */
    uint32_t max_seqs;     /* sequences per step */
    uint32_t window_pages; /* staged: a sequence's default target */
    /* sequences */
    akv_route_seq *open_list, *closing_list;
    uint32_t n_open;
    /* the step begun last */
    akv_route_seq **step;  /* [max_seqs] in batch order; NULL where a closed one was freed */
    uint32_t n_step;
    uint32_t n_idx;        /* indptr[n_step]: pages of a layer over the step */
    bool pending;          /* work enqueued that no sync has settled since (a step begun, a
                              pass's hooks): closing sequences wait for it (pages a live
                              prefetch still reads are leased: their free is deferred) */
    bool step_done;        /* the step begun last is over (its last end_layer, an abort, or the
                              next begin_step): a closed sequence of it may be freed */
    /* tables (the layout in the file comment) */
    int32_t *tab_h;        /* pinned (queued) or heap (direct) */
    akv_dptr tab_d;        /* queued: the device copy */
    size_t head_ints;      /* ints before the indices */
    size_t cap;            /* indices per layer */
    int32_t *indptr, *last, *indices; /* into tab_h */
    bool tab_dirty;        /* indices changed since the last upload */
    uint32_t *order;       /* [cap] scratch of a step: the orders the device pool is given */
    akv_event **ev;        /* [n_layers]: the layer's attention enqueued (write-back waits) */
    akv_event *ev_wb;      /* resident: recorded on D2H after the step's last write-back */
    akv_event *ev_fill;    /* recorded on D2H before fills: fresh pages wait for their readers */
    akv_event *ev_fill_h2d; /* recorded on H2D before fills: fresh pages wait for earlier fills
                               (another route's, whose pass failed before their layer) */
    akv_event *ev_fill_c;  /* recorded on the compute queue when the fills are sent: they wait
                              for the step's work there so far (compact encodes) */
    akv_event *ev_tab;     /* recorded on the compute queue after begin_step's table uploads;
                              the H2D queue waits for it, so a layer's row copied there with its
                              pages (akv_stage_copy_table) lands after them */
    akv_event **ev_lfill;  /* [n_layers] queued: recorded on H2D after layer l's fills */
    uint8_t *lfill_wait;   /* [n_layers] layer l's fills enqueued, its kernels not yet behind them */
    bool fills_h2d;        /* fills enqueued on H2D that no sync of that queue has seen done */
    akv_dev_xfer *fills;   /* queued: the step's fills (route_write_table), not sent yet while
                              n_fills; one batched copy a layer on the H2D queue at the step's
                              first begin_layer (route_fills_send) */
    size_t n_fills, cap_fills;
    uint32_t *fill_layer;  /* the layer of each fill */
    akv_dev_xfer *fills_by; /* scratch: the fills ordered by layer */
    size_t *fill_end;      /* [n_layers + 1] scratch: where each layer's fills end in fills_by */
    size_t cap_fill_layer, cap_fills_by;
    bool wb_check;         /* resident, queued: the step's write-backs were all enqueued and
                              ev_wb recorded; route_settle has not checked how they ended */
    akv_route_stats stats;
    /* the compact tier (hybrid: route_hybrid.c; table layout as the exact one's) */
    akv_dev_pool *dpc;         /* NULL = none */
    akv_repr tier;
    akv_repr_layout clayout;
    uint64_t exact_recent;
    uint32_t max_step;
    int32_t *ctab;             /* indptr[max_seqs+1], last[max_seqs], then indices per layer;
                                  pinned (queued) or heap (direct) */
    akv_dptr ctab_d;           /* queued: the device copy */
    int32_t *c_indptr, *c_last, *c_indices;
    uint32_t n_cidx;           /* c_indptr[n_step]: compact pages of a layer over the step */
    bool ctab_dirty;           /* queued: compact indices changed since the last upload */
    uint32_t *c_order;         /* [cap] scratch of a step */
    uint8_t *cpage;            /* one compact page (the walker's encoding) */
    uint8_t *cstage;           /* AKV__ROUTE_CSTAGE_PAGES compact pages encoded for their copies
                                  (queued: pinned, reused once the compute queue has run them) */
    akv__route_cjob *cjobs;    /* a step's compact pages to make on the host (grown on demand) */
    uint32_t n_cjobs, cjobs_cap;
    int32_t *dpairs_h;         /* queued: (exact page id, compact page id) of a step's compact
                                  pages made on the device, pinned; dpairs_d their device copy */
    akv_dptr dpairs_d;
    uint32_t n_dpairs, dpairs_cap;
    akv_par *cpar;             /* the encoders' threads */
    /* the staged hybrid's compact lane (route_hybrid.c): the compact copies, staged per
     * layer into slots of the compact pool's staging reserve */
    akv_host_pool *hpc;        /* NULL = the compact part is resident */
    uint32_t ctarget, cburst;  /* each sequence's compact window */
    akv_stage *cst;            /* the stage of compact pages (the route's own) */
    uint32_t cslot_pages;
    uint32_t n_cstaged;        /* compact pages of a layer staged this step, every sequence's */
    uint32_t *cslot_ids;       /* [cslot_pages] where a layer's copies landed */
    akv_host_page *chpages;    /* [cslot_pages] a layer's copy list */
    akv_stage_lease *clease;   /* [n_layers] this step's compact leases */
    uint8_t *clease_live;      /* [n_layers] begun and not yet retired */
    int32_t copen_layer;       /* the compact lease begun and not sealed; -1 = none */
    /* staged (route_staged.c) */
    akv_stage *stage;
    bool own_stage;
    uint32_t slot_pages;       /* the stage's slot: the most pages one layer stages */
    uint32_t n_staged;         /* pages of a layer staged this step, every sequence's */
    akv_host_page *hpages;     /* scratch: a layer's copy list or its owners (grown on demand) */
    size_t hpages_cap;
    uint32_t *slot_ids;        /* [slot_pages] where the last copy landed (a prefetch's stays
                                  there, untouched, until the next step's layer 0 reads it) */
    akv_stage_lease *lease;    /* [n_layers] this step's leases */
    uint8_t *lease_live;       /* [n_layers] begun and not yet retired */
    int32_t open_layer;        /* the layer whose lease is begun but not sealed; -1 = none */
    bool transport_lost;       /* a lease of the last step was released after a transport
                                  failure: its copies and write-backs cannot be trusted, the
                                  step is undone at the sync (route.c) */
    bool prefetch;             /* prefetch on for this route */
    bool pf_live;              /* begun (not yet used or retired) */
    bool pf_cancelled;         /* cancelled: retire it, never use it */
    akv_stage_lease pf;
    akv_host_page *pf_pages;   /* [slot_pages] the host pages it copied (layer 0), to compare */
    uint32_t pf_n;             /* of them */
    akv_route_seq **pf_seqs;   /* [max_seqs] the batch it was made for, in order */
    uint64_t *pf_len;          /* [max_seqs] and their lengths after that step */
    uint32_t pf_n_seq;
    /* host-attended (route_host.c): a layer's host part, per layer so a layer's host
     * function reads and writes only its own while the engine's thread goes on */
    float host_share;
    akv_par *hpar;             /* the host part's threads */
    struct akv__route_host_layer *hl; /* [n_layers] */
    uint32_t h_heads;          /* query heads of the buffers below (0: not made yet) */
    float *hq;                 /* [n_layers][max_seqs][h_heads * head_dim] the query rows
                                  (queued: pinned) */
    float *hst;                /* [n_layers][max_seqs][h_heads * (head_dim + 1)] the states:
                                  a layer's o rows, then its lse rows (queued: pinned) */
    akv_dptr hst_d;            /* queued: hst's device address (mapped: the merge reads the
                                  states across the bus where the host wrote them) */
    akv_dev_xfer *hx;          /* [max_seqs] queued: a layer's query rows, device -> hq */
    uint64_t *htok;            /* [max_seqs] the step's tokens in each sequence's host part */
    float *hscratch;           /* the chunks' states: grown at a step's first layer (engine
                                  thread, the queues idle), read by the host functions in
                                  queue order, one at a time */
    size_t hscratch_n;
    _Atomic uint64_t host_ns;  /* the host functions' time (stats.host_ns), added as they end */
    akv_route_layer_times *times; /* [n_layers] the staged layers of the last step retired
                                     (akv_route_step_times); NULL until one is */
    uint32_t n_times;
};

/* The kinds (route_resident.c, route_staged.c, route_hybrid.c), and the one a value names
 * (NULL: none). */
extern const akv__route_kind akv__route_resident;
extern const akv__route_kind akv__route_staged;
extern const akv__route_kind akv__route_hybrid;
extern const akv__route_kind akv__route_hybrid_staged;
extern const akv__route_kind akv__route_host;
const akv__route_kind *akv__route_kind_of(akv_route_kind kind);
/* Compact pages the hybrid encodes at once (in parallel) ahead of their copies. */
#define AKV__ROUTE_CSTAGE_PAGES 256u

/* The kind that serves `kind` with a compact tier (hybrid for resident, staged hybrid for
 * staged; NULL: none can). */
const akv__route_kind *akv__route_kind_tiered(akv_route_kind kind, akv_repr tier);

/* The resident write-back of every sequence's new rows of a layer (route_resident.c), which
 * the hybrid kind shares. */
akv_status akv__route_write_back(akv_route *r, uint32_t layer);

/* Hybrid: the first exact page after the sink for sequence s of n_old tokens growing to n_new:
 * every page holding one of the last exact_recent tokens, or one of the step's new tokens, is
 * exact; at least 1 (1 for a sequence kept exact: it has no compact part). */
uint32_t akv__route_exact_from(const akv_route *r, const akv_route_seq *s, uint64_t n_old,
                               uint64_t n_new);

/* The placement both kinds ask for today: the newest page and the sink (the floor), then the
 * rest newest first. Returns the count; *n_floor = 2 (1 for a one-page history). */
uint32_t akv__route_order_sink_newest(const akv_route *r, const akv_route_seq *s,
                                      uint64_t n_tokens, uint32_t *order, uint32_t *n_floor);

/* The floor of a context (the sink and the newest page) as window pages: max(2, pages of
 * n_tokens), the least any window holds. */
uint32_t akv__route_floor_pages(const akv_geom *g, uint64_t n_tokens);

/* The rows [t0, t1) of logical page p that the step wrote into seq (page-relative). */
static inline void akv__route_page_rows(const akv_route *r, const akv_route_seq *s, uint64_t p,
                                        uint64_t *t0, uint64_t *t1) {
    uint64_t P = r->geom.page_tokens, lo = p * P, hi = lo + P;
    *t0 = (s->step_first > lo ? s->step_first : lo) - lo;
    *t1 = (s->n_tokens < hi ? s->n_tokens : hi) - lo;
}

/* Where seq's logical page p (an exact one in the table: 0, or x0 and after) sits in its row
 * of the step's exact table: the table holds page 0 then x0, x0+1, ... */
static inline uint32_t akv__route_table_at(const akv_route_seq *s, uint64_t p) {
    return (uint32_t)(p == 0 ? 0 : p - s->x0 + 1);
}

/* The device page of seq's logical page p (an exact one in the table) in layer l. */
static inline uint32_t akv__route_page_id(const akv_route *r, const akv_route_seq *s, uint32_t l,
                                          uint64_t p) {
    return (uint32_t)r->indices[(size_t)l * r->cap + (size_t)r->indptr[s->slot] +
                                akv__route_table_at(s, p)];
}

/* The staged kind's policy and transport, which the host-attended kind runs for the pages it
 * stages (route_staged.c). */
uint32_t akv__route_staged_plan_staging(const akv_geom *g, uint64_t max_history,
                                        uint32_t window_pages, uint32_t max_seqs);
akv_status akv__route_staged_plan_windows(const akv_geom *g, uint64_t max_history, uint32_t max_seqs,
                                          const akv_fit *fit, akv_route_plan *pl);
uint32_t akv__route_staged_need(const akv_route_plan *pl, const akv_geom *g, uint64_t n_tokens);
akv_status akv__route_staged_window(const akv_route *r, akv_route_seq_params *p,
                                    uint32_t window_capacity);
akv_status akv__route_staged_open(akv_route *r, const akv_route_params *p);
akv_status akv__route_staged_retire(akv_route *r, bool keep_prefetch, bool *quarantined);
akv_status akv__route_staged_placed(akv_route *r, const akv_route_req *reqs, uint32_t n);
akv_status akv__route_staged_begin_layer(akv_route *r, uint32_t layer);
akv_status akv__route_staged_end_layer(akv_route *r, uint32_t layer);
bool akv__route_staged_live(const akv_route *r);

/* The leases of the last step on one stage (the staged kind's, or the staged hybrid's
 * compact one): the one a failed pass left open (*open_layer) cancelled, then each live one
 * retired (its fences waited on, its receipt's copies held to n_staged; `what` names it in the
 * log), live[] cleared as they are released, transport_lost set for one released after a
 * failure. Returns the first failure. (route_staged.c) */
akv_status akv__route_retire_layers(akv_route *r, akv_stage *stage, akv_stage_lease *lease,
                                    uint8_t *live, int32_t *open_layer, uint32_t n_staged,
                                    const char *what, bool *quarantined);

/* Queued mode: waits for the compute and D2H queues (route.c). */
akv_status akv__route_wait(akv_route *r);

/* One sequence's new rows of `layer` to its host copy, per page touched: queued, one 2D copy
 * on the D2H queue; direct, synchronous copies (route.c; the resident kind's write-back, and
 * the settle's redo). */
akv_status akv__route_copy_rows(akv_route *r, akv_route_seq *s, uint32_t layer);

#endif
