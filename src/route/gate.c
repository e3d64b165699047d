/* gate.c — the economic gate's transfer model (akv/gate.h). */
#include "akv/gate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

akv_gate_rates akv_gate_default_rates(void) {
    akv_gate_rates r = {.bus_bps = 55.2e9,
                        .copy_bps = 2822e9,
                        .read_frac = {[AKV_REPR_EXACT] = 1.066, [AKV_REPR_Q8] = 0.977,
                                      [AKV_REPR_Q4] = 0.675}};
    snprintf(r.source, sizeof r.source, "defaults (NVIDIA H100 80GB HBM3, 2026-12-06)");
    return r;
}

/* The file's keys, in the order akv_gate_rates_save writes them. */
static const char *const gate_keys[] = {"bus_bps", "copy_bps", "read_exact", "read_q8", "read_q4"};
enum { GATE_KEYS = 5 };

static double *gate_field(akv_gate_rates *r, int k) {
    switch (k) {
    case 0: return &r->bus_bps;
    case 1: return &r->copy_bps;
    default: return &r->read_frac[k - 2];
    }
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
    char line[256];
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
        while (k < GATE_KEYS && strcmp(key, gate_keys[k])) k++;
        if (got != 2 || k == GATE_KEYS || seen[k] || !isfinite(v) || !(v > 0)) {
            AKV_LOG_E("gate: %s line %u: want `key value` with a key of bus_bps, copy_bps, "
                      "read_exact, read_q8, read_q4 (each once) and a finite positive value",
                      path, no);
            st = AKV_EFORMAT;
            break;
        }
        seen[k] = true;
        *gate_field(&r, k) = v;
    }
    if (!st && ferror(f)) {
        AKV_LOG_E("gate: reading '%s' failed", path);
        st = AKV_EIO;
    }
    fclose(f);
    for (int k = 0; !st && k < GATE_KEYS; k++)
        if (!seen[k]) {
            AKV_LOG_E("gate: %s has no %s", path, gate_keys[k]);
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
    for (int k = 0; k < GATE_KEYS; k++)
        fprintf(f, "%s %.6g\n", gate_keys[k], *gate_field((akv_gate_rates *)r, k));
    if (fclose(f) != 0) {
        AKV_LOG_E("gate: writing '%s' failed", path);
        return AKV_EIO;
    }
    return AKV_OK;
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
    const double dev_s = weight_bytes / r->copy_bps +
                         seqs * (exact_n * tok / (r->copy_bps * r->read_frac[AKV_REPR_EXACT]) +
                                 (compact_n ? compact_n * ctok / (r->copy_bps * r->read_frac[tier]) : 0));
    /* staged: the pages beyond the window, in their form (a tier's window is of compact pages) */
    const double staged_n = tier == AKV_REPR_EXACT ? n : compact_n;
    o.bus_bytes = kind == AKV_ROUTE_STAGED && staged_n > (double)window_tokens
                      ? seqs * (staged_n - (double)window_tokens) * (tier == AKV_REPR_EXACT ? tok : ctok)
                      : 0;
    const double bus_s = o.bus_bytes / r->bus_bps;
    o.step_s = fmax(bus_s, dev_s);
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

size_t akv_gate_format(const akv_gate_rates *r, const akv_gate_option *opts, uint32_t n,
                       uint64_t n_tokens, char *buf, size_t cap) {
    size_t at = 0;
#define GATE_PUT(...)                                                                              \
    do {                                                                                           \
        int k_ = snprintf(buf + (at < cap ? at : cap), at < cap ? cap - at : 0, __VA_ARGS__);       \
        if (k_ > 0) at += (size_t)k_;                                                              \
    } while (0)
    if (cap) buf[0] = 0;
    GATE_PUT("gate:        rates %s: bus %.1f GB/s, device copy %.0f GB/s, decode reads exact "
             "%.2f, q8 %.2f, q4 %.2f of it\n",
             r->source, r->bus_bps / 1e9, r->copy_bps / 1e9, r->read_frac[AKV_REPR_EXACT],
             r->read_frac[AKV_REPR_Q8], r->read_frac[AKV_REPR_Q4]);
    GATE_PUT("gate:        a decode step of histories of %llu tokens: weights / copy rate + K/V "
             "reads / (copy rate x read rate), staged also bus bytes / bus rate, the larger; per "
             "token = step / sequences\n",
             (unsigned long long)n_tokens);
    for (uint32_t i = 0; i < n; i++) {
        const akv_gate_option *o = &opts[i];
        if (!o->seqs) {
            GATE_PUT("gate:          %-9s %-5s does not fit the pools\n", akv_route_kind_name(o->kind),
                     akv_repr_name(o->tier));
            continue;
        }
        GATE_PUT("gate:        %s %-9s %-5s %u sequence(s): %.1f MiB weights + %.1f MiB K/V read, "
                 "%.1f MiB over the bus -> %.2f ms a step, %.3f ms a token\n",
                 o->chosen ? "*" : " ", akv_route_kind_name(o->kind), akv_repr_name(o->tier), o->seqs,
                 o->weight_bytes / (1u << 20), o->device_bytes / (1u << 20),
                 o->bus_bytes / (1u << 20), o->step_s * 1e3,
                 o->token_s * 1e3);
    }
#undef GATE_PUT
    return at;
}
