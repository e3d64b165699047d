/* route_staged.c — the staged kind of akv/route.h: per layer of a step, ONE lease of the
 * staging layer (akv/stage.h) for the whole batch: owners = every sequence's host pages that
 * receive the step's new rows, one copy of every sequence's non-window pages into a slot, the
 * layer's table row from the slot ids, ready; at end_layer attended, the write-backs of each
 * sequence's new rows, seal; the leases retired at the next step boundary; the next decode
 * step's layer 0 prefetched when it can be foreseen. */
#include <stdio.h>
#include <string.h>

#include "akv/host_table.h"
#include "akv/stage.h"
#include "core/alloc.h"
#include "core/log.h"
#include "route/route_impl.h"

/* ---- the policy ------------------------------------------------------------------------------ */

/* Two slots, each for every sequence's pages outside its window. */
uint32_t akv__route_staged_plan_staging(const akv_geom *g, uint64_t max_history,
                                        uint32_t window_pages, uint32_t max_seqs) {
    uint32_t slot = akv_route_slot_pages(g, max_history, window_pages, max_seqs);
    return slot > UINT32_MAX / 2 ? UINT32_MAX : 2 * slot;
}

/* Each context's window by right: the plan's share of the window capacity, at least the
 * route's window; what is left beside it may be borrowed. */
akv_status akv__route_staged_plan_windows(const akv_geom *g, uint64_t max_history,
                                          uint32_t max_seqs, const akv_fit *fit,
                                          akv_route_plan *pl) {
    (void)g, (void)max_history;
    const uint64_t cap = fit->window_capacity;
    pl->target = fit->target > pl->window_pages ? fit->target : pl->window_pages;
    if ((uint64_t)pl->target * max_seqs > cap) {
        AKV_LOG_E("route: %u staged contexts of {=window_pages} %u need %llu window pages per "
                  "layer; the device pool holds %llu beside its staging reserve: raise "
                  "{=device_gib} or lower {=max_seqs} or {=window_pages}",
                  max_seqs, pl->window_pages, (unsigned long long)pl->target * max_seqs,
                  (unsigned long long)cap);
        return AKV_EFULL;
    }
    pl->burst = pl->target + fit->burst <= cap ? fit->burst : (uint32_t)(cap - pl->target);
    return AKV_OK;
}

uint32_t akv__route_staged_need(const akv_route_plan *pl, const akv_geom *g, uint64_t n_tokens) {
    (void)pl;
    (void)g, (void)n_tokens;
    return 0; /* its window is lent by the device pool, not reserved */
}

/* A window of target pages by right (at least the route's window_pages) + burst, within the
 * pool's window capacity. */
akv_status akv__route_staged_window(const akv_route *r, akv_route_seq_params *p,
                                    uint32_t window_capacity) {
    if (p->target == 0) p->target = r->window_pages;
    if (r->window_pages >= 2 && p->target >= r->window_pages &&
        (uint64_t)p->target + p->burst <= window_capacity)
        return AKV_OK;
    AKV_LOG_E("route: a staged window of target %u + burst %u pages per layer (target at least "
              "the route's {=window_pages} %u, itself at least 2: the sink and the newest); the "
              "device pool holds %u window pages per layer: raise {=device_gib}",
              p->target, p->burst, r->window_pages, window_capacity);
    return AKV_EINVAL;
}

/* ---- the transport --------------------------------------------------------------------------- */

/* The stage (borrowed, or created from the staging reserve) and the scratch. */
akv_status akv__route_staged_open(akv_route *r, const akv_route_params *p) {
    const akv_geom *g = &r->geom;
    uint32_t slot = akv_route_slot_pages(g, r->max_history, r->window_pages, r->max_seqs);
    if (p->stage) {
        if (akv_stage_check_pools(p->stage, r->hp, r->dp) != AKV_OK) return AKV_EINVAL; /* logged */
        akv_stage_params sp = akv_stage_get_params(p->stage);
        if (sp.slot_pages < slot) {
            AKV_LOG_E("route: the stage's slots hold %u pages; %u staged histories of %llu "
                      "tokens with windows of %u pages stage up to %u per layer ({=max_history}, "
                      "{=max_seqs})",
                      sp.slot_pages, r->max_seqs, (unsigned long long)r->max_history,
                      r->window_pages, slot);
            return AKV_EINVAL;
        }
        r->stage = p->stage;
        slot = sp.slot_pages;
    } else {
        akv_stage_params sp = akv_stage_default_params();
        sp.n_slots = 2, sp.slot_pages = slot;
        akv_status st = akv_stage_create(r->dev, r->hp, r->dp, &sp, &r->stage);
        if (st == AKV_EFULL)
            AKV_LOG_E("route: the staged route needs a staging reserve of %u pages (2 slots x %u "
                      "pages of %zu KiB) in the device pool: raise {=device_gib} or lower "
                      "{=max_history} or {=max_seqs}",
                      2 * slot, slot, akv_geom_page_bytes(g) >> 10);
        if (st) return st;
        r->own_stage = true;
    }
    r->slot_pages = slot;
    r->prefetch = r->queued && (p->prefetch > 0 || (p->prefetch == 0 && r->own_stage));
    r->slot_ids = akv__calloc(slot, sizeof *r->slot_ids);
    r->pf_pages = akv__calloc(slot, sizeof *r->pf_pages);
    r->pf_seqs = akv__calloc(r->max_seqs, sizeof *r->pf_seqs);
    r->pf_len = akv__calloc(r->max_seqs, sizeof *r->pf_len);
    r->lease = akv__calloc(g->n_layers, sizeof *r->lease);
    r->lease_live = akv__calloc(g->n_layers, sizeof *r->lease_live);
    akv_status st = akv__array_reserve((void **)&r->hpages, &r->hpages_cap, slot, sizeof *r->hpages);
    return st ? st
           : r->slot_ids && r->pf_pages && r->pf_seqs && r->pf_len && r->lease && r->lease_live
               ? AKV_OK
               : AKV_ENOMEM;
}

bool akv__route_staged_live(const akv_route *r) {
    if (r->pf_live) return true;
    for (uint32_t l = 0; r->lease_live && l < r->geom.n_layers; l++)
        if (r->lease_live[l]) return true;
    return false;
}

/* ---- retirement ----------------------------------------------------------------------------- */

/* Retires one lease of `stage` (fences waited on): AKV_OK, or the failure; *released says
 * whether the record is gone (retired, or failed with completion established after a
 * quarantine). *quarantined: whether this pass already quarantined (once per pass: a drain
 * that could not establish completion for one lease will not for the next). */
static akv_status route_retire_lease(akv_stage *stage, akv_stage_lease l, akv_stage_receipt *rc,
                                     bool *released, bool *quarantined) {
    memset(rc, 0, sizeof *rc);
    akv_status s = akv_stage_retire(stage, l, rc);
    if (s == AKV_EFAILED && !rc->failed && !*quarantined) {
        /* retained by a quarantine that could not establish completion: the device may
         * have recovered since; only a new quarantine's fences let the lease go */
        *quarantined = true;
        if (akv_stage_quarantine(stage) == AKV_OK) {
            memset(rc, 0, sizeof *rc);
            s = akv_stage_retire(stage, l, rc);
        }
    }
    *released = s == AKV_OK || (s == AKV_EFAILED && rc->failed);
    return s;
}

akv_status akv__route_retire_layers(akv_route *r, akv_stage *stage, akv_stage_lease *lease,
                                    uint8_t *live, int32_t *open_layer, uint32_t n_staged,
                                    const char *what, bool *quarantined) {
    akv_status first = AKV_OK;
    if (*open_layer >= 0) {
        akv_status s = akv_stage_cancel(stage, lease[*open_layer]);
        if (s != AKV_OK) first = s;
        *open_layer = -1;
    }
    bool timed = false; /* this retirement's layers replace the last step's times */
    for (uint32_t l = 0; l < r->geom.n_layers; l++) {
        if (!live[l]) continue;
        if (!timed && r->times) memset(r->times, 0, r->geom.n_layers * sizeof *r->times), r->n_times = 0;
        timed = true;
        akv_stage_receipt rc;
        bool released = false;
        akv_status s = route_retire_lease(stage, lease[l], &rc, &released, quarantined);
        /* released: retired, or failed with completion established (a receipt came back);
         * otherwise it stays live (retained, or not sealed: a bug); released after a failure:
         * its copies (and write-backs) cannot be trusted, the step is undone at the sync */
        if (released) live[l] = 0;
        if (released && s != AKV_OK) r->transport_lost = true;
        if (s != AKV_OK) {
            if (first == AKV_OK) first = s;
            continue;
        }
        r->stats.n_leases++;
        r->stats.staged_copy_ns += rc.h2d_ns;
        if (!r->times) r->times = akv__calloc(r->geom.n_layers, sizeof *r->times);
        if (r->times && !rc.cancelled) {
            r->times[l] = (akv_route_layer_times){rc.at_h2d_start_ns, rc.at_h2d_done_ns,
                                                  rc.at_attn_start_ns, rc.at_attn_done_ns,
                                                  rc.t_copied_ns, rc.bus_idle_at_copy, rc.step};
            if (l + 1 > r->n_times) r->n_times = l + 1;
        }
        if (!rc.cancelled && (rc.n_copies != n_staged || rc.failed)) {
            AKV_LOG_E("route: the %s of layer %u (step %llu) staged %u pages; %u were submitted",
                      what, l, (unsigned long long)rc.step, rc.n_copies, n_staged);
            if (first == AKV_OK) first = AKV_ESTATE;
        }
    }
    return first;
}

/* The prefetched lease, when the next step is not the one it was made for: cancelled and
 * retired (*quarantined: as for route_retire_lease, shared by the caller's pass). */
static akv_status staged_drop_prefetch(akv_route *r, bool *quarantined) {
    if (!r->pf_live) return AKV_OK;
    akv_status first = AKV_OK;
    if (!r->pf_cancelled) {
        first = akv_stage_cancel(r->stage, r->pf);
        r->pf_cancelled = true; /* even if the cancel failed: never use it */
        r->stats.n_prefetch_dropped++;
    }
    akv_stage_receipt rc;
    bool released = false;
    akv_status s = route_retire_lease(r->stage, r->pf, &rc, &released, quarantined);
    if (released) r->pf_live = false, r->pf_cancelled = false;
    return first != AKV_OK ? first : s;
}

/* Cancels the lease a failed pass left open (begun, ready or attended, never sealed), then
 * retires every lease of the last step: waits on their fences and checks each receipt against
 * what was submitted (owner write-backs and staged copies). A prefetch is dropped too unless
 * keep_prefetch. */
akv_status akv__route_staged_retire(akv_route *r, bool keep_prefetch, bool *quarantined) {
    akv_status first = akv__route_retire_layers(r, r->stage, r->lease, r->lease_live, &r->open_layer,
                                                r->n_staged, "lease", quarantined);
    if (!keep_prefetch) {
        akv_status s = staged_drop_prefetch(r, quarantined);
        if (first == AKV_OK) first = s;
    }
    /* a stage of the route's own that failed is replaced once every lease is released (the
     * quarantine established their completion, so the slots are free): the route goes on
     * after a device failure it recovered from. A borrowed stage is its owner's to replace. */
    if (r->own_stage && !akv__route_staged_live(r) && (!r->stage || akv_stage_status(r->stage) != AKV_OK)) {
        akv_stage_params sp = akv_stage_default_params();
        sp.n_slots = 2, sp.slot_pages = r->slot_pages;
        if (r->stage && akv_stage_destroy(r->stage) == AKV_OK) r->stage = NULL;
        akv_status s = r->stage ? AKV_EBUSY : akv_stage_create(r->dev, r->hp, r->dp, &sp, &r->stage);
        if (s == AKV_OK) AKV_LOG_W("route: the failed stage was replaced by a new one");
        else if (first == AKV_OK) first = s; /* tried again at the next retirement */
    }
    return first;
}

/* ---- a layer -------------------------------------------------------------------------------- */

/* The host pages of `layer` that the step's copies read, every sequence's in batch order, into
 * r->hpages; returns their count (r->n_staged). */
static uint32_t staged_copy_list(akv_route *r, uint32_t layer) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < r->n_step; i++) {
        const akv_route_seq *s = r->step[i];
        for (uint32_t j = 0; j < s->n_staged; j++)
            r->hpages[k++] = akv_host_table_page(s->ht, layer, s->staged[j]);
    }
    return k;
}

/* The copies of the step's staged pages of `layer` under lease l; where they landed into
 * r->slot_ids. */
static akv_status staged_copy(akv_route *r, uint32_t layer, akv_stage_lease l) {
    uint32_t n = staged_copy_list(r, layer);
    akv_status st = akv_stage_copy(r->stage, l, r->hpages, n, r->slot_ids);
    if (st) return st;
    const size_t pb = akv_geom_page_bytes(&r->geom);
    r->stats.h2d_bytes += (uint64_t)n * pb;
    for (uint32_t i = 0; i < r->n_step; i++) r->step[i]->stats.h2d_bytes += (uint64_t)r->step[i]->n_staged * pb;
    return AKV_OK;
}

/* The owners of `layer`: every sequence's host pages that receive the step's new rows, in
 * batch order (each sequence's first at s->owner_off), into r->hpages. */
static akv_status staged_owner_list(akv_route *r, uint32_t layer, uint32_t *n_out) {
    const uint32_t P = r->geom.page_tokens;
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->n_step; i++) {
        const akv_route_seq *s = r->step[i];
        n += (uint32_t)((s->n_tokens - 1) / P - s->step_first / P + 1);
    }
    akv_status st = akv__array_reserve((void **)&r->hpages, &r->hpages_cap, n, sizeof *r->hpages);
    if (st) return st;
    n = 0;
    for (uint32_t i = 0; i < r->n_step; i++) {
        akv_route_seq *s = r->step[i];
        s->owner_off = n;
        for (uint64_t p = s->step_first / P; p * P < s->n_tokens; p++)
            r->hpages[n++] = akv_host_table_page(s->ht, layer, (uint32_t)p);
    }
    *n_out = n;
    return AKV_OK;
}

/* begin_layer: the lease (owners = the host pages of the step's new rows), the copies of the
 * non-window pages, their slot ids into the layer's table row, the compute queue's wait. */
akv_status akv__route_staged_begin_layer(akv_route *r, uint32_t layer) {
    if (!r->stage) {
        AKV_LOG_E("route: the staged route has no stage (a failed one could not be replaced)");
        return AKV_EFAILED;
    }
    akv_stage_lease *l = &r->lease[layer];
    akv_status st = AKV_OK;
    const bool prefetched = layer == 0 && r->pf_live && !r->pf_cancelled;
    if (prefetched) {
        /* prefetched at the end of the previous step, for this one (begin_step dropped any
         * other): begun, copies enqueued, their slots in r->slot_ids */
        *l = r->pf;
        r->pf_live = false;
        r->lease_live[layer] = 1, r->open_layer = (int32_t)layer; /* held before anything fails */
        r->stats.n_prefetched++;
        uint32_t n_owners;
        if ((st = staged_owner_list(r, layer, &n_owners))) return st; /* the owner offsets */
    } else {
        uint32_t n_owners;
        if ((st = staged_owner_list(r, layer, &n_owners))) return st;
        st = akv_stage_begin(r->stage, layer, r->stats.n_steps, r->hpages, n_owners, l);
        /* AKV_EDEVICE: a device submission of the begin failed after the stage issued the
         * lease (akv_stage_begin): it is live and must be cancelled and retired like any */
        if (st && st != AKV_EDEVICE) return st;
    }
    r->lease_live[layer] = 1;
    r->open_layer = (int32_t)layer;
    if (st) return st;
    if (!prefetched && (st = staged_copy(r, layer, *l))) return st;
    const size_t pb = akv_geom_page_bytes(&r->geom);
    for (uint32_t i = 0; i < r->n_step; i++) {
        akv_route_seq *s = r->step[i];
        int32_t *row = r->indices + (size_t)layer * r->cap + r->indptr[i];
        for (uint32_t j = 0; j < s->n_staged; j++)
            row[akv__route_table_at(s, s->staged[j])] = (int32_t)r->slot_ids[s->stage_off + j];
        s->stats.staged_bytes += (uint64_t)s->n_staged * pb;
    }
    r->stats.staged_bytes += (uint64_t)r->n_staged * pb;
    /* queued: the layer's row of indices travels with its pages (ready's wait covers it) */
    if (r->queued && r->n_staged) {
        size_t off = (r->head_ints + (size_t)layer * r->cap) * sizeof(int32_t);
        if ((st = akv_stage_copy_table(r->stage, *l, akv_dptr_offset(r->tab_d, off),
                                       r->indices + (size_t)layer * r->cap,
                                       (size_t)r->n_idx * sizeof(int32_t))))
            return st;
    }
    if ((st = akv_stage_ready(r->stage, *l))) return st;
    /* direct: the host pass reads the pages now, on this thread */
    return r->queued ? AKV_OK : akv_dev_queue_sync(r->dev, AKV_QUEUE_COMPUTE);
}

/* After the last layer of a step: begins the next decode step's layer-0 lease and enqueues its
 * copies (route.h, prefetch), when that step can be foreseen: the same batch, one token each,
 * every next token in its sequence's current last page (so no window moves by the route's own
 * growth). Its owners are those pages (the next step's new rows). */
static akv_status staged_prefetch(akv_route *r) {
    const uint32_t P = r->geom.page_tokens;
    if (r->pf_live || r->n_staged == 0) return AKV_OK;
    for (uint32_t i = 0; i < r->n_step; i++) {
        const akv_route_seq *s = r->step[i];
        if (s->closing || s->n_tokens % P == 0 || s->n_tokens + 1 > s->p.max_history)
            return AKV_OK;
        /* a kind with a host part stages fewer pages in the decode step that follows a
         * prompt's than in the prompt's own: its staged list could not serve */
        if (r->kind->host_pages && s->n_tokens != s->step_first + 1) return AKV_OK;
    }
    akv_status st = akv__array_reserve((void **)&r->hpages, &r->hpages_cap, r->n_step,
                                       sizeof *r->hpages);
    if (st) return st;
    for (uint32_t i = 0; i < r->n_step; i++) {
        const akv_route_seq *s = r->step[i];
        r->hpages[i] = akv_host_table_page(s->ht, 0, (uint32_t)(s->n_tokens / P));
        r->pf_seqs[i] = r->step[i], r->pf_len[i] = s->n_tokens + 1;
    }
    r->pf_n_seq = r->n_step;
    st = akv_stage_begin(r->stage, 0, r->stats.n_steps + 1, r->hpages, r->n_step, &r->pf);
    if (st && st != AKV_EDEVICE) return st; /* EDEVICE: issued, then a submission failed */
    r->pf_live = true; /* pf_cancelled is false whenever pf_live is (staged_drop_prefetch) */
    if (st) return st;
    bool quarantined = false;
    r->pf_n = staged_copy_list(r, 0);
    memcpy(r->pf_pages, r->hpages, (size_t)r->pf_n * sizeof *r->pf_pages);
    if ((st = staged_copy(r, 0, r->pf)))
        staged_drop_prefetch(r, &quarantined); /* the copy's failure is what the caller hears */
    return st;
}

/* end_layer: the attention event, the write-back of every sequence's new rows (one 2D copy per
 * owner page, from the device page holding it: window tail or slot page), the seal. */
akv_status akv__route_staged_end_layer(akv_route *r, uint32_t layer) {
    const akv_geom *g = &r->geom;
    uint32_t P = g->page_tokens;
    akv_stage_lease l = r->lease[layer];
    akv_event *ev = NULL;
    akv_status st = akv_stage_attended(r->stage, l, &ev);
    if (st) return st;
    akv_stage_tail tail = {0, 0};
    for (uint32_t i = 0; i < r->n_step; i++) {
        akv_route_seq *s = r->step[i];
        for (uint64_t p = s->step_first / P; p * P < s->n_tokens; p++) {
            uint64_t t0, t1;
            akv__route_page_rows(r, s, p, &t0, &t1);
            akv_host_page host = akv_host_table_page(s->ht, layer, (uint32_t)p);
            st = akv_stage_writeback(r->stage, l, s->owner_off + (uint32_t)(p - s->step_first / P),
                                     host, akv__route_page_id(r, s, layer, p), (uint32_t)t0,
                                     (uint32_t)(t1 - t0), &tail);
            if (st) return st;
            uint64_t b = (t1 - t0) * akv_geom_token_bytes(g);
            r->stats.d2h_bytes += b, s->stats.d2h_bytes += b;
        }
    }
    if ((st = akv_stage_seal(r->stage, l, tail, ev))) return st;
    r->open_layer = -1;
    return layer + 1 == g->n_layers && r->prefetch ? staged_prefetch(r) : AKV_OK;
}

/* After begin_step placed the batch reqs[n] (its staged lists written, not yet committed): a
 * prefetch serves only the step it was made for — the same sequences in the same order, each
 * one token longer, staging the same host pages (the device pool may have moved a window: a
 * reclaim, a borrowed page) — else it is dropped. */
akv_status akv__route_staged_placed(akv_route *r, const akv_route_req *reqs, uint32_t n) {
    if (!r->pf_live || r->pf_cancelled) return AKV_OK;
    bool same = r->pf_n_seq == n;
    for (uint32_t i = 0; same && i < n; i++)
        same = reqs[i].seq == r->pf_seqs[i] && reqs[i].n_tokens == r->pf_len[i];
    uint32_t k = 0;
    for (uint32_t i = 0; same && i < n; i++) {
        const akv_route_seq *s = reqs[i].seq;
        for (uint32_t j = 0; same && j < s->n_staged; j++, k++) {
            akv_host_page h = akv_host_table_page(s->ht, 0, s->staged[j]);
            same = k < r->pf_n && h.id == r->pf_pages[k].id && h.gen == r->pf_pages[k].gen;
        }
    }
    same = same && k == r->pf_n;
    if (same) return AKV_OK;
    bool quarantined = false;
    return staged_drop_prefetch(r, &quarantined);
}

const akv__route_kind akv__route_staged = {.kind = AKV_ROUTE_STAGED,
                                           .name = "staged",
                                           .plan_staging = akv__route_staged_plan_staging,
                                           .plan_windows = akv__route_staged_plan_windows,
                                           .need = akv__route_staged_need,
                                           .window = akv__route_staged_window,
                                           .order = akv__route_order_sink_newest,
                                           .outside = AKV_KV_STAGED,
                                           .replayable = false,
                                           .open = akv__route_staged_open,
                                           .retire = akv__route_staged_retire,
                                           .placed = akv__route_staged_placed,
                                           .begin_layer = akv__route_staged_begin_layer,
                                           .end_layer = akv__route_staged_end_layer,
                                           .live = akv__route_staged_live};
