/*
 * akv/admit.h — admission arithmetic: how many full-length contexts a configuration can
 * serve, and with what device window each.
 *
 * The formula (every term is a field of akv_fit, so callers can print or log it):
 *   pages per layer      = ceil(max_context / P)
 *   pages per history    = pages per layer * n_layers        (one full-length context)
 *   host pages           = floor(host_gib GiB / page_bytes)  (what the host pool can hold)
 *   histories            = floor(host pages / pages per history)
 *   effective concurrency = min(configured concurrency, histories)
 *   window capacity      = floor((floor(device_gib GiB / page_bytes) - staging pages) / n_layers)
 *   per context: floor = 2 (sink + tail), target = min(pages per layer,
 *                floor(window capacity / concurrency)), burst = min(pages per layer, window
 *                capacity) - target   (all in window pages: one page in every layer)
 * The device must hold every active context's floor at once: concurrency * floor <= window
 * capacity.
 *
 * Modes. refuse: a configuration whose concurrency the host pool (or the device pool's
 * floors) cannot hold is refused, naming the setting to change and the value that would fit.
 * shrink: concurrency is lowered to what fits and the formula is logged (AKV_LOG_WARN); the
 * serving layer queues the rest. In both modes, not even one full-length history (or one
 * floor) fitting is a refusal.
 *
 * Settings are named by the akv_admit_params fields that set them (host_gib, device_gib,
 * concurrency, max_context, staging_pages), in `setting`, in the verdict and in the logs; each
 * front end maps them to its own names (akv fit to its flags, the engine to its params).
 *
 * Thread-safety: pure functions.
 */
#ifndef AKV_ADMIT_H
#define AKV_ADMIT_H

#include <stddef.h>
#include <stdint.h>

#include "akv/geom.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum akv_admit_mode {
    AKV_ADMIT_REFUSE = 0, /* a configuration that does not fit is an error */
    AKV_ADMIT_SHRINK = 1, /* concurrency is lowered to what fits */
} akv_admit_mode;

typedef struct akv_admit_params {
    akv_geom geom;          /* from akv_geom_init */
    uint64_t max_context;   /* tokens of a full-length history; >= 1 */
    uint32_t host_gib;      /* host pool limit, whole GiB */
    size_t arena_bytes;     /* host pool arena size; 0 = 256 MiB */
    uint32_t device_gib;    /* device pool size, whole GiB */
    uint32_t staging_pages; /* device pages reserved for staging */
    uint32_t concurrency;   /* configured limit of contexts served at once */
    akv_admit_mode mode;
} akv_admit_params;

typedef struct akv_fit {
    akv_admit_params params; /* as given */
    /* page */
    size_t token_bytes;       /* one token, one layer, K+V */
    size_t page_bytes;
    uint32_t page_tokens;     /* P */
    /* host */
    uint64_t pages_per_layer;   /* ceil(max_context / P) */
    uint64_t pages_per_history; /* pages_per_layer * n_layers */
    uint64_t history_bytes;     /* pages_per_history * page_bytes */
    size_t host_limit_bytes;    /* host_gib GiB */
    uint32_t pages_per_arena;
    uint32_t n_arenas;          /* arenas the limit allows (the last may be shorter) */
    uint64_t host_pages;        /* floor(host_limit_bytes / page_bytes) */
    uint64_t histories;         /* floor(host_pages / pages_per_history) */
    uint32_t min_host_gib;      /* smallest host_gib holding the configured concurrency */
    /* device */
    uint64_t device_pages;      /* floor(device_gib GiB / page_bytes) */
    uint32_t staging_pages;     /* reserved for staging (the pool adds the odd pages) */
    uint64_t window_capacity;   /* window pages (per layer) */
    uint32_t floor, target, burst; /* per context, window pages */
    uint32_t max_floors;        /* floor(window_capacity / floor): contexts whose floors fit */
    uint32_t min_device_gib;    /* smallest device_gib holding the configured floors */
    /* verdict */
    uint32_t concurrency;       /* effective: min(configured, histories, floors), what is
                                   served at once when it fits; when refused (status), what
                                   would fit (the verdict's "lower concurrency to"), 0 when
                                   not even one context fits */
    int shrunk;                 /* 1: shrink mode lowered the configured concurrency */
    akv_status status;          /* AKV_OK: it fits; AKV_EFULL: refused */
    const char *setting;        /* field to change when refused ("host_gib", ...); else NULL */
    char verdict[320];          /* one line: why it fits, was shrunk, or is refused */
} akv_fit;

/* Computes the fit (the formula above) into *out. AKV_OK whenever the arithmetic could be
 * done, refused or not: out->status says which. AKV_EINVAL (logged naming the setting;
 * *out untouched) for an invalid geometry, a zero max_context/concurrency/host_gib/device_gib,
 * or a configuration the pools themselves reject (akv_host_pool_create, akv_dev_pool_create
 * rules); AKV_EOVERFLOW when a product overflows 64 bits. In shrink mode a lowered concurrency
 * is logged with its formula. */
akv_status akv_admit_fit(const akv_admit_params *p, akv_fit *out);

/* Writes the formula with every term, the per-context window and the verdict as text lines
 * into buf (NUL-terminated, truncated to cap). Returns the length the full text needs, like
 * snprintf. */
size_t akv_fit_format(const akv_fit *f, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* AKV_ADMIT_H */
