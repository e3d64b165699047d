/* route_resident.c — the resident kind of akv/route.h: a sequence's whole history is its
 * window, reserved at admission, and the step's new rows are written back to the host copy
 * after each layer. The baseline every other kind is measured against. */
#include <stdio.h>

#include "core/log.h"
#include "route/route_impl.h"

/* ---- the policy ------------------------------------------------------------------------------ */

static uint32_t resident_plan_staging(const akv_geom *g, uint64_t max_history,
                                      uint32_t window_pages, uint32_t max_seqs) {
    (void)g, (void)max_history, (void)window_pages, (void)max_seqs;
    return 0; /* nothing is staged */
}

static akv_status resident_plan_windows(const akv_geom *g, uint64_t max_history,
                                        uint32_t max_seqs, const akv_fit *fit,
                                        akv_route_plan *pl) {
    (void)max_seqs;
    const uint32_t need = akv__route_floor_pages(g, max_history);
    if (need > fit->window_capacity) {
        AKV_LOG_E("route: a resident history of {=max_context} %llu tokens needs %u window pages "
                  "per layer; the device pool holds %llu: raise {=device_gib}, lower {=max_context}, "
                  "or use the staged route",
                  (unsigned long long)max_history, need, (unsigned long long)fit->window_capacity);
        return AKV_EFULL;
    }
    pl->target = pl->burst = 0; /* each context's window is its whole history */
    return AKV_OK;
}

static uint32_t resident_need(const akv_route_plan *pl, const akv_geom *g, uint64_t n_tokens) {
    (void)pl;
    return akv__route_floor_pages(g, n_tokens);
}

/* The whole history is the window: its target is every page (and at least the floor). */
static akv_status resident_window(const akv_route *r, akv_route_seq_params *p,
                                  uint32_t window_capacity) {
    p->target = akv__route_floor_pages(&r->geom, p->max_history), p->burst = 0;
    if (p->target <= window_capacity) return AKV_OK;
    double need_gib = (double)p->target * r->geom.n_layers * akv_geom_page_bytes(&r->geom) /
                      (1u << 30);
    AKV_LOG_E("route: a resident history of %llu tokens needs %u pages per layer x %u layers "
              "(%.2f GiB of device pool); the pool holds %u pages per layer: raise {=device_gib} or "
              "lower {=max_history}",
              (unsigned long long)p->max_history, p->target, r->geom.n_layers, need_gib,
              window_capacity);
    return AKV_EINVAL;
}

/* ---- the transport --------------------------------------------------------------------------- */

/* Every sequence's new rows of the layer to its host copy. Queued: on the D2H queue after the
 * layer's attention (the last layer's followed by ev_wb, which route_settle reads); direct:
 * now. */
akv_status akv__route_write_back(akv_route *r, uint32_t layer) {
    akv_status st = AKV_OK;
    if (r->queued && ((st = akv_dev_event_record(r->dev, r->ev[layer], AKV_QUEUE_COMPUTE)) ||
                      (st = akv_dev_queue_wait_event(r->dev, AKV_QUEUE_D2H, r->ev[layer]))))
        return st;
    for (uint32_t i = 0; i < r->n_step && !st; i++)
        st = akv__route_copy_rows(r, r->step[i], layer);
    if (st || !r->queued || layer + 1 < r->geom.n_layers) return st;
    st = akv_dev_event_record(r->dev, r->ev_wb, AKV_QUEUE_D2H);
    r->wb_check = st == AKV_OK;
    return st;
}

const akv__route_kind akv__route_resident = {.kind = AKV_ROUTE_RESIDENT,
                                             .name = "resident",
                                             .plan_staging = resident_plan_staging,
                                             .plan_windows = resident_plan_windows,
                                             .need = resident_need,
                                             .window = resident_window,
                                             .order = akv__route_order_sink_newest,
                                             .outside = AKV_KV_WINDOW,
                                             .replayable = true,
                                             .end_layer = akv__route_write_back};
