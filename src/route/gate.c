/* gate.c — the economic gate's transfer model (akv/gate.h). */
#include "akv/gate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

akv_gate_rates akv_gate_default_rates(void) {
    /* akv calibrate on an NVIDIA H100 80GB HBM3, 2026-12-06 (docs/benchmarks.md) */
    akv_gate_rates r = {.bus_bps = 55.48e9,
                        .bus_page = {0.581, 0.875, 0.919, 0.935, 0.947, 0.953, 0.976},
                        .copy_bps = 3006e9,
                        .read_frac = {[AKV_REPR_EXACT] = {0.888, 0.944, 1.009, 1.038, 1.051, 1.069},
                                      [AKV_REPR_Q8] = {0.638, 0.746, 0.868, 0.944, 0.986, 0.880},
                                      [AKV_REPR_Q4] = {0.394, 0.461, 0.565, 0.627, 0.666, 0.527}},
                        .bus_shared = 0.993,
                        .read_shared = 0.928};
    snprintf(r.source, sizeof r.source, "defaults (NVIDIA H100 80GB HBM3, 2026-12-06)");
    return r;
}

/* The file's keys, in the order akv_gate_rates_save writes them: bus_bps, copy_bps, the
 * bus by page size, the reads by form and batch, the two shared fractions. */
enum {
    GK_BUS_PAGE = 2,
    GK_READ = GK_BUS_PAGE + AKV_GATE_PAGE_SIZES,
    GK_SHARED = GK_READ + AKV_REPR_COUNT * AKV_GATE_BATCHES,
    GATE_KEYS = GK_SHARED + 2
};

/* Key k's name into buf and its field in r. */
static double *gate_key(akv_gate_rates *r, int k, char *buf, size_t cap) {
    if (k == 0) return snprintf(buf, cap, "bus_bps"), &r->bus_bps;
    if (k == 1) return snprintf(buf, cap, "copy_bps"), &r->copy_bps;
    if (k < GK_READ) {
        const int i = k - GK_BUS_PAGE;
        snprintf(buf, cap, "bus_page_%uk", 16u << i);
        return &r->bus_page[i];
    }
    if (k < GK_SHARED) {
        const int f = (k - GK_READ) / AKV_GATE_BATCHES, b = (k - GK_READ) % AKV_GATE_BATCHES;
        snprintf(buf, cap, "read_%s_b%u", akv_repr_name((akv_repr)f), 1u << b);
        return &r->read_frac[f][b];
    }
    if (k == GK_SHARED) return snprintf(buf, cap, "bus_shared"), &r->bus_shared;
    return snprintf(buf, cap, "read_shared"), &r->read_shared;
}

akv_status akv_gate_rates_load(const char *path, akv_gate_rates *out) {
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) {
        AKV_LOG_E("gate: cannot read the calibration '%s': %s", path ? path : "(null)",
                  strerror(errno));
        return AKV_EIO;
    }
    akv_gate_rates r;
    memset(&r, 0, sizeof r);
    bool seen[GATE_KEYS] = {false};
    char line[256], name[32];
    unsigned no = 0;
    akv_status st = AKV_OK;
    while (!st && fgets(line, sizeof line, f)) {
        no++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char key[64], rest[2];
        double v;
        int got = sscanf(line, "%63s %lf %1s", key, &v, rest);
        if (got <= 0) continue; /* blank or a comment */
        int k = 0;
        while (k < GATE_KEYS && (gate_key(&r, k, name, sizeof name), strcmp(key, name))) k++;
        if (got != 2 || k == GATE_KEYS || seen[k] || !isfinite(v) || !(v > 0)) {
            AKV_LOG_E("gate: %s line %u: want `key value` with a key of akv calibrate's (bus_bps, "
                      "copy_bps, bus_page_16k .. bus_page_1024k, read_FORM_bB, bus_shared, "
                      "read_shared; each once) and a finite positive value",
                      path, no);
            st = AKV_EFORMAT;
            break;
        }
        seen[k] = true;
        *gate_key(&r, k, name, sizeof name) = v;
    }
    if (!st && ferror(f)) {
        AKV_LOG_E("gate: reading '%s' failed", path);
        st = AKV_EIO;
    }
    fclose(f);
    for (int k = 0; !st && k < GATE_KEYS; k++)
        if (!seen[k]) {
            gate_key(&r, k, name, sizeof name);
            AKV_LOG_E("gate: %s has no %s (a file of an older akv calibrate? run it again)", path,
                      name);
            st = AKV_EFORMAT;
        }
    if (st) return st;
    snprintf(r.source, sizeof r.source, "calibrated (%.80s)", path);
    *out = r;
    return AKV_OK;
}

akv_status akv_gate_rates_save(const char *path, const akv_gate_rates *r) {
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) {
        AKV_LOG_E("gate: cannot write '%s': %s", path ? path : "(null)", strerror(errno));
        return AKV_EIO;
    }
    fprintf(f, "# akv calibrate: the transfer model of the economic gate (akv/gate.h)\n");
    akv_gate_rates copy = *r;
    char name[32];
    for (int k = 0; k < GATE_KEYS; k++) {
        const double v = *gate_key(&copy, k, name, sizeof name);
        fprintf(f, "%s %.6g\n", name, v);
    }
    if (fclose(f) != 0) {
        AKV_LOG_E("gate: writing '%s' failed", path);
        return AKV_EIO;
    }
    return AKV_OK;
}

/* y at x over points y[i] at x = x0 * 2^i, i < n: linear in log2(x), held at the ends. */
static double gate_log2_lerp(const double *y, int n, double x0, double x) {
    if (!(x > x0)) return y[0];
    const double t = log2(x / x0);
    if (t >= n - 1) return y[n - 1];
    const int i = (int)t;
    return y[i] + (y[i + 1] - y[i]) * (t - i);
}

double akv_gate_bus_rate(const akv_gate_rates *r, double page_bytes) {
    return r->bus_bps * gate_log2_lerp(r->bus_page, AKV_GATE_PAGE_SIZES, 16384.0, page_bytes);
}

double akv_gate_read_rate(const akv_gate_rates *r, akv_repr form, uint32_t seqs) {
    if ((int)form < 0 || form >= AKV_REPR_COUNT) form = AKV_REPR_EXACT;
    return r->copy_bps * gate_log2_lerp(r->read_frac[form], AKV_GATE_BATCHES, 1.0, (double)seqs);
}

float akv_gate_host_share(const akv_gate_rates *r, double page_bytes, double host_bps) {
    const double bus = akv_gate_bus_rate(r, page_bytes);
    return host_bps > 0 && bus > 0 ? (float)(host_bps / (host_bps + bus)) : 0.0f;
}

double akv_gate_overlap(const akv_gate_rates *r, double bus_s, double device_s) {
    if (!(bus_s > 0)) return device_s;
    if (!(device_s > 0)) return bus_s;
    const double fb = fmin(fmax(r->bus_shared, 1e-3), 1.0), fd = fmin(fmax(r->read_shared, 1e-3), 1.0);
    /* both run until the one that finishes first under sharing is done; the other finishes
     * alone: long + short x (1 - long's fraction) / short's fraction */
    if (bus_s / fb >= device_s / fd) return bus_s + device_s * (1 - fb) / fd;
    return device_s + bus_s * (1 - fd) / fb;
}

akv_gate_placement akv_gate_placement_at(uint32_t i) {
    static const akv_gate_placement all[AKV_GATE_PLACEMENTS] = {
        {AKV_ROUTE_RESIDENT, AKV_REPR_EXACT},
        {AKV_ROUTE_RESIDENT, AKV_REPR_Q8},
        {AKV_ROUTE_RESIDENT, AKV_REPR_Q4},
        {AKV_ROUTE_STAGED, AKV_REPR_EXACT},
        {AKV_ROUTE_STAGED, AKV_REPR_Q8},
        {AKV_ROUTE_STAGED, AKV_REPR_Q4}};
    return all[i < AKV_GATE_PLACEMENTS ? i : 0];
}

akv_gate_option akv_gate_predict(const akv_gate_rates *r, const akv_geom *g, akv_route_kind kind,
                                 akv_repr tier, uint32_t seqs, uint64_t n_tokens,
                                 uint64_t exact_recent, uint64_t window_tokens,
                                 double weight_bytes) {
    akv_gate_option o = {.kind = kind, .tier = tier, .seqs = seqs, .weight_bytes = weight_bytes};
    if (!seqs) return o;
    const double tok = (double)akv_geom_token_bytes(g) * g->n_layers; /* every layer */
    const double n = (double)n_tokens;
    /* the older history in its form, the recent exact (the hybrid kind) */
    const double exact_n = tier == AKV_REPR_EXACT ? n : fmin(n, (double)exact_recent);
    const double compact_n = n - exact_n;
    const double ctok = tier == AKV_REPR_EXACT ? 0 : tok * akv_repr_bits(tier, g->dtype, g->head_dim) /
                                                         akv_repr_bits(AKV_REPR_EXACT, g->dtype, g->head_dim);
    o.device_bytes = seqs * (exact_n * tok + compact_n * ctok);
    o.device_s = weight_bytes / r->copy_bps +
                 seqs * (exact_n * tok / akv_gate_read_rate(r, AKV_REPR_EXACT, seqs) +
                         (compact_n ? compact_n * ctok / akv_gate_read_rate(r, tier, seqs) : 0));
    /* staged: the pages beyond the window, in their form (a tier's window is of compact pages) */
    const double staged_n = tier == AKV_REPR_EXACT ? n : compact_n;
    o.bus_bytes = kind == AKV_ROUTE_STAGED && staged_n > (double)window_tokens
                      ? seqs * (staged_n - (double)window_tokens) * (tier == AKV_REPR_EXACT ? tok : ctok)
                      : 0;
    if (o.bus_bytes > 0) {
        o.page_bytes = (double)akv_geom_repr_page_bytes(g, tier);
        o.bus_s = o.bus_bytes / akv_gate_bus_rate(r, o.page_bytes);
    }
    o.step_s = akv_gate_overlap(r, o.bus_s, o.device_s);
    o.token_s = o.step_s / seqs;
    return o;
}

int akv_gate_choose(akv_gate_option *opts, uint32_t n) {
    int best = -1;
    for (uint32_t i = 0; i < n; i++) {
        opts[i].chosen = false;
        if (!opts[i].seqs) continue;
        /* the list is most exact first: a later one must be 5 % cheaper to win */
        if (best < 0 || opts[i].token_s < 0.95 * opts[best].token_s) best = (int)i;
    }
    if (best >= 0) opts[best].chosen = true;
    return best;
}

/* Whether a history of n tokens stays exact (akv_gate_exact_below). */
static bool gate_keeps_exact(const akv_gate_rates *r, const akv_geom *g, akv_repr tier, uint32_t seqs,
                             uint64_t n, uint64_t exact_recent, double weight_bytes) {
    const akv_gate_option x = akv_gate_predict(r, g, AKV_ROUTE_RESIDENT, AKV_REPR_EXACT, seqs, n, 0, 0,
                                               weight_bytes),
                          c = akv_gate_predict(r, g, AKV_ROUTE_RESIDENT, tier, seqs, n, exact_recent, 0,
                                               weight_bytes);
    return !(c.token_s < 0.95 * x.token_s);
}

uint64_t akv_gate_exact_below(const akv_gate_rates *r, const akv_geom *g, akv_gate_placement pl,
                              uint32_t seqs, uint64_t exact_recent, double weight_bytes,
                              uint64_t max_tokens) {
    const akv_repr tier = pl.tier;
    if (!r || !g || tier == AKV_REPR_EXACT || !seqs) return max_tokens;
    if (pl.kind != AKV_ROUTE_RESIDENT) return 0;
    if (!gate_keeps_exact(r, g, tier, seqs, 1, exact_recent, weight_bytes)) return 0;
    uint64_t lo = 1, hi = max_tokens; /* lo stays exact; find the last that does */
    if (gate_keeps_exact(r, g, tier, seqs, hi, exact_recent, weight_bytes)) return hi;
    while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2;
        if (gate_keeps_exact(r, g, tier, seqs, mid, exact_recent, weight_bytes)) lo = mid;
        else hi = mid;
    }
    return lo;
}

size_t akv_gate_format(const akv_gate_rates *r, const akv_gate_option *opts, uint32_t n,
                       uint64_t n_tokens, char *buf, size_t cap) {
    size_t at = 0;
#define GATE_PUT(...)                                                                              \
    do {                                                                                           \
        int k_ = snprintf(buf + (at < cap ? at : cap), at < cap ? cap - at : 0, __VA_ARGS__);       \
        if (k_ > 0) at += (size_t)k_;                                                              \
    } while (0)
    if (cap) buf[0] = 0;
    const uint32_t b8 = 3; /* the read rates said at batch 8 */
    GATE_PUT("gate:        rates %s: bus %.1f GB/s (pages of 64 KiB at %.2f of it, 256 KiB at "
             "%.2f), device copy %.0f GB/s, decode reads at batch 8 exact %.2f, q8 %.2f, q4 %.2f "
             "of it; shared, the bus keeps %.2f and the reads %.2f\n",
             r->source, r->bus_bps / 1e9, r->bus_page[2], r->bus_page[4], r->copy_bps / 1e9,
             r->read_frac[AKV_REPR_EXACT][b8], r->read_frac[AKV_REPR_Q8][b8],
             r->read_frac[AKV_REPR_Q4][b8], r->bus_shared, r->read_shared);
    GATE_PUT("gate:        a decode step of histories of %llu tokens: device = weights / copy rate "
             "+ K/V reads / (copy rate x read rate at the batch); staged, bus = bytes / the rate "
             "of its pages' size; step = the two overlapped (the longer + the shorter's loss to "
             "sharing); per token = step / sequences\n",
             (unsigned long long)n_tokens);
    for (uint32_t i = 0; i < n; i++) {
        const akv_gate_option *o = &opts[i];
        if (!o->seqs) {
            GATE_PUT("gate:          %-9s %-5s does not fit the pools\n", akv_route_kind_name(o->kind),
                     akv_repr_name(o->tier));
            continue;
        }
        GATE_PUT("gate:        %s %-9s %-5s %u sequence(s): %.1f MiB weights + %.1f MiB K/V read "
                 "(%.2f ms), %.1f MiB over the bus (%.2f ms) -> %.2f ms a step, %.3f ms a token\n",
                 o->chosen ? "*" : " ", akv_route_kind_name(o->kind), akv_repr_name(o->tier), o->seqs,
                 o->weight_bytes / (1u << 20), o->device_bytes / (1u << 20), o->device_s * 1e3,
                 o->bus_bytes / (1u << 20), o->bus_s * 1e3, o->step_s * 1e3, o->token_s * 1e3);
    }
#undef GATE_PUT
    return at;
}
