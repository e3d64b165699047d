/* admit.c — the admission arithmetic (akv/admit.h) over the pools' own layout rules. */
#include "akv/admit.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "akv/dev_pool.h"
#include "akv/host_pool.h"
#include "core/alloc.h"
#include "core/log.h"
#include "mem/mem_text.h"

#define ADMIT_MAX_CONCURRENCY (1u << 20)
#define GIB ((uint64_t)1 << 30)

/* ceil(n_pages * page_bytes / GiB), saturated at UINT32_MAX. */
static uint32_t admit_gib_for(uint64_t n_pages, size_t page_bytes) {
    uint64_t bytes;
    if (__builtin_mul_overflow(n_pages, (uint64_t)page_bytes, &bytes)) return UINT32_MAX;
    uint64_t gib = bytes / GIB + (bytes % GIB != 0);
    return gib > UINT32_MAX ? UINT32_MAX : (uint32_t)gib;
}

static void admit_verdict(akv_fit *f, const char *fmt, ...) AKV_PRINTF(2, 3);
static void admit_verdict(akv_fit *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->verdict, sizeof f->verdict, fmt, ap);
    va_end(ap);
}

/* Checks the parts of the params the pools do not check themselves. */
static akv_status admit_check(const akv_admit_params *p) {
    const akv_geom *g = &p->geom;
    akv_geom again;
    if (g->page_tokens == 0 || akv_geom_init(&again, g->n_layers, g->n_kv_heads, g->head_dim,
                                             g->dtype, g->page_tokens) != AKV_OK) {
        AKV_LOG_E("admission: the geometry is not initialised (akv_geom_init)");
        return AKV_EINVAL;
    }
    if (p->max_context == 0) {
        AKV_LOG_E("admission: {=max_context} must be at least 1 token");
        return AKV_EINVAL;
    }
    if (akv_geom_pages_for_tokens(g, p->max_context) > INT32_MAX) {
        AKV_LOG_E("admission: {=max_context} %llu needs more than %d pages per layer",
                  (unsigned long long)p->max_context, INT32_MAX);
        return AKV_EINVAL;
    }
    if (p->concurrency == 0 || p->concurrency > ADMIT_MAX_CONCURRENCY) {
        AKV_LOG_E("admission: {=concurrency} %u must be in [1, %u]", p->concurrency,
                  ADMIT_MAX_CONCURRENCY);
        return AKV_EINVAL;
    }
    if (p->mode != AKV_ADMIT_REFUSE && p->mode != AKV_ADMIT_SHRINK) {
        AKV_LOG_E("admission: mode %d is neither refuse nor shrink", (int)p->mode);
        return AKV_EINVAL;
    }
    return AKV_OK;
}

akv_status akv_admit_fit(const akv_admit_params *p, akv_fit *out) {
    if (!p || !out) return AKV_EINVAL;
    akv_status st = admit_check(p);
    if (st != AKV_OK) return st;
    const akv_geom *g = &p->geom;
    akv_host_pool_params hp = {.limit_gib = p->host_gib, .arena_bytes = p->arena_bytes};
    akv_dev_pool_params dp = {.device_gib = p->device_gib, .staging_pages = p->staging_pages};
    akv_host_pool_stats hl;
    akv_dev_pool_stats dl;
    if ((st = akv_host_pool_layout(g, &hp, &hl)) != AKV_OK) return st;
    if ((st = akv_dev_pool_layout(g, &dp, &dl)) != AKV_OK) return st;

    akv_fit f;
    memset(&f, 0, sizeof f);
    f.params = *p;
    f.token_bytes = akv_geom_token_bytes(g);
    /* both pools hold exact pages (the host copy is authoritative, so always exact; the device
     * window has no other representation yet) */
    f.page_bytes = akv_geom_repr_page_bytes(g, AKV_REPR_EXACT);
    f.page_tokens = g->page_tokens;
    /* host: one full-length history, and how many the pool holds */
    f.pages_per_layer = akv_geom_pages_for_tokens(g, p->max_context);
    f.pages_per_history = f.pages_per_layer * g->n_layers; /* < 2^31 * 2^12: no overflow */
    if (__builtin_mul_overflow(f.pages_per_history, (uint64_t)f.page_bytes, &f.history_bytes)) {
        AKV_LOG_E("admission: one history of {=max_context} %llu tokens overflows 64 bits",
                  (unsigned long long)p->max_context);
        return AKV_EOVERFLOW;
    }
    f.host_limit_bytes = hl.limit_bytes;
    f.pages_per_arena = hl.pages_per_arena;
    f.n_arenas = hl.n_slots;
    f.host_pages = hl.capacity_pages;
    f.histories = f.host_pages / f.pages_per_history;
    f.min_host_gib = admit_gib_for(f.pages_per_history * p->concurrency, f.page_bytes);
    /* device: window pages, and how many floors they hold */
    f.device_pages = dl.n_pages;
    f.staging_pages = p->staging_pages;
    f.window_capacity = dl.window_capacity;
    f.floor = 2;
    f.max_floors = (uint32_t)(f.window_capacity / f.floor);
    f.min_device_gib = admit_gib_for(
        (uint64_t)p->concurrency * f.floor * g->n_layers + p->staging_pages, f.page_bytes);

    /* effective concurrency = min(configured, histories, floors) */
    uint64_t eff = p->concurrency;
    if (f.histories < eff) eff = f.histories;
    if (f.max_floors < eff) eff = f.max_floors;
    f.concurrency = (uint32_t)eff;
    f.status = AKV_OK;
    if (f.histories == 0) {
        f.status = AKV_EFULL;
        f.setting = "host_gib";
        admit_verdict(&f,
                      "refused: not even one full-length history fits: one needs %llu pages "
                      "(%.2f GiB) and {=host_gib} %u holds %llu; raise {=host_gib} to at least %u "
                      "or lower {=max_context}",
                      (unsigned long long)f.pages_per_history, (double)f.history_bytes / GIB,
                      p->host_gib, (unsigned long long)f.host_pages,
                      admit_gib_for(f.pages_per_history, f.page_bytes));
    } else if (f.max_floors == 0) {
        f.status = AKV_EFULL;
        f.setting = "device_gib";
        admit_verdict(&f,
                      "refused: the device pool holds %llu window page(s), less than one floor "
                      "(%u); raise {=device_gib} to at least %u (or lower {=staging_pages})",
                      (unsigned long long)f.window_capacity, f.floor,
                      admit_gib_for((uint64_t)f.floor * g->n_layers + p->staging_pages,
                                    f.page_bytes));
    } else if (eff < p->concurrency && p->mode == AKV_ADMIT_REFUSE) {
        f.status = AKV_EFULL;
        int host = f.histories < p->concurrency;
        f.setting = host ? "host_gib" : "device_gib";
        if (host)
            admit_verdict(&f,
                          "refused: {=concurrency} %u exceeds the %llu full-length histories "
                          "{=host_gib} %u holds; raise {=host_gib} to at least %u or lower "
                          "{=concurrency} to %u (or {=max_context})",
                          p->concurrency, (unsigned long long)f.histories, p->host_gib,
                          f.min_host_gib, f.concurrency);
        else
            admit_verdict(&f,
                          "refused: {=concurrency} %u needs %u floors of %u window pages; "
                          "{=device_gib} %u holds %u; raise {=device_gib} to at least %u or lower "
                          "{=concurrency} to %u",
                          p->concurrency, p->concurrency, f.floor, p->device_gib, f.max_floors,
                          f.min_device_gib, f.concurrency);
    } else if (eff < p->concurrency) {
        f.shrunk = 1;
        admit_verdict(&f,
                      "fits after shrinking: {=concurrency} %u -> %u = min(%u configured, %llu "
                      "histories in {=host_gib} %u, %u floors in {=device_gib} %u); the rest queue",
                      p->concurrency, f.concurrency, p->concurrency,
                      (unsigned long long)f.histories, p->host_gib, f.max_floors, p->device_gib);
        AKV_LOG_W("admission: %s", f.verdict);
    } else {
        admit_verdict(&f, "fits: %u concurrent full-length context(s) of %llu tokens",
                      f.concurrency, (unsigned long long)p->max_context);
    }
    /* the window each served context gets: target by right, the rest of its history as
     * burst while pages are free */
    if (f.concurrency > 0) {
        uint64_t share = f.window_capacity / f.concurrency;
        uint64_t whole = f.pages_per_layer < f.window_capacity ? f.pages_per_layer : f.window_capacity;
        uint64_t target = f.pages_per_layer < share ? f.pages_per_layer : share;
        if (target < f.floor) target = f.floor; /* share >= floor here; a 1-page history */
        f.target = (uint32_t)target;
        f.burst = whole > target ? (uint32_t)(whole - target) : 0;
    }
    *out = f;
    return AKV_OK;
}

size_t akv_fit_format(const akv_fit *f, char *buf, size_t cap) {
    const akv_admit_params *p = &f->params;
    const akv_geom *g = &p->geom;
    size_t len = 0;
    if (cap) buf[0] = '\0';
    akv__mem_appendf(buf, cap, &len,
                  "geometry:    %u layers x %u K/V heads x head dim %u, %s: %zu bytes per token "
                  "per layer (K+V)\n"
                  "page:        P = %u tokens -> %zu bytes (%.0f KiB) %s, %.0f bits an element; "
                  "both pools hold %s pages\n",
                  g->n_layers, g->n_kv_heads, g->head_dim, akv_dtype_name(g->dtype),
                  f->token_bytes, f->page_tokens, f->page_bytes, (double)f->page_bytes / 1024,
                  akv_repr_name(AKV_REPR_EXACT), akv_geom_repr_bits(g, AKV_REPR_EXACT),
                  akv_repr_name(AKV_REPR_EXACT));
    akv__mem_appendf(buf, cap, &len,
                  "history:     {=max_context} %llu tokens -> ceil(%llu / %u) = %llu pages per "
                  "layer x %u layers = %llu pages = %.2f GiB per full-length context\n",
                  (unsigned long long)p->max_context, (unsigned long long)p->max_context,
                  f->page_tokens, (unsigned long long)f->pages_per_layer, g->n_layers,
                  (unsigned long long)f->pages_per_history, (double)f->history_bytes / GIB);
    akv__mem_appendf(buf, cap, &len,
                  "host pool:   {=host_gib} %u -> floor(%zu / %zu) = %llu pages (%u arena(s) of "
                  "up to %u pages)\n"
                  "             histories = floor(%llu / %llu) = %llu\n",
                  p->host_gib, f->host_limit_bytes, f->page_bytes,
                  (unsigned long long)f->host_pages, f->n_arenas, f->pages_per_arena,
                  (unsigned long long)f->host_pages, (unsigned long long)f->pages_per_history,
                  (unsigned long long)f->histories);
    akv__mem_appendf(buf, cap, &len,
                  "device pool: {=device_gib} %u -> %llu pages; {=staging_pages} %u -> window "
                  "capacity floor((%llu - %u) / %u) = %llu window pages\n"
                  "             floors = floor(%llu / %u) = %u\n",
                  p->device_gib, (unsigned long long)f->device_pages, f->staging_pages,
                  (unsigned long long)f->device_pages, f->staging_pages, g->n_layers,
                  (unsigned long long)f->window_capacity, (unsigned long long)f->window_capacity,
                  f->floor, f->max_floors);
    akv__mem_appendf(buf, cap, &len,
                  "at once:     effective = min({=concurrency} %u, histories %llu, floors %u) = "
                  "%u (mode %s)\n",
                  p->concurrency, (unsigned long long)f->histories, f->max_floors, f->concurrency,
                  p->mode == AKV_ADMIT_SHRINK ? "shrink" : "refuse");
    if (f->concurrency > 0)
        akv__mem_appendf(buf, cap, &len,
                      "per context: floor %u, target = max(floor, min(%llu, floor(%llu / %u))) = %u, "
                      "burst = max(0, min(%llu, %llu) - target) = %u window pages (%llu tokens "
                      "resident by right, %llu at most)\n",
                      f->floor, (unsigned long long)f->pages_per_layer,
                      (unsigned long long)f->window_capacity, f->concurrency, f->target,
                      (unsigned long long)f->pages_per_layer,
                      (unsigned long long)f->window_capacity, f->burst,
                      (unsigned long long)f->target * f->page_tokens,
                      (unsigned long long)(f->target + f->burst) * f->page_tokens);
    akv__mem_appendf(buf, cap, &len, "verdict:     %s\n", f->verdict);
    return len;
}
