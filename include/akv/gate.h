/*
 * akv/gate.h — the economic gate: which route and which K/V representation serve a workload
 * best on this machine, by a transfer model measured on it.
 *
 * Glossary
 *   rates      what the machine does, measured (akv calibrate) or its defaults: the bus's
 *              large-copy rate (host to device), the device-copy rate (bytes read + written),
 *              and for each representation the rate at which the decode reads its pages, as a
 *              fraction of the copy rate (1.0: the exact kernel at long context reads at the
 *              copy rate; a compact form that its decoding slows reads at less).
 *   placement  a route kind and a representation of the older history: resident exact,
 *              resident with a q8 or q4 tier (the hybrid kind: the last exact_recent tokens
 *              exact), staged exact.
 *   step       a decode step of the admitted sequences: reading the weights and every
 *              history's K/V once on the device, and, staged, copying what the window lacks
 *              across the bus (the staged route runs at the bus's rate: its step is the larger
 *              of the two). The weights are read once a step however many sequences share it,
 *              so a placement that admits more sequences spreads them thinner.
 *
 * The gate predicts, for each placement the memory plan admits, the step of its admitted
 * sequences (each at the full context) and the time a token costs the batch (step / sequences
 * admitted); it chooses the least, the more exact placement on a tie within 5 %, so a compact
 * form is taken only for what it saves. Every compact form chosen is within the quality
 * contract of docs/compact.md (the tests hold it); a placement that admits no sequence is out.
 *
 * Thread-safety: plain values and pure functions, but for the file functions (one file each).
 */
#ifndef AKV_GATE_H
#define AKV_GATE_H

#include <stdbool.h>
#include <stdint.h>

#include "akv/geom.h"
#include "akv/kv_repr.h"
#include "akv/route.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_gate_rates {
    double bus_bps;                    /* host -> device, large copies from pinned memory */
    double copy_bps;                   /* device to device, bytes read + written per second */
    double read_frac[AKV_REPR_COUNT];  /* the decode's read rate of each form's pages, a
                                          fraction of copy_bps (> 0) */
    char source[96];                   /* where they come from (a file, or the defaults) */
} akv_gate_rates;

/* The defaults: an NVIDIA H100 80GB HBM3 measured on 2026-12-06 (docs/benchmarks.md: the
 * bus 55.2 GB/s, the copy rate 2822 GB/s, the decode at 32K keys and batch 8: exact 1.07, q8
 * 0.98, q4 0.68 of the copy rate). */
akv_gate_rates akv_gate_default_rates(void);

/* Reads rates written by akv_gate_rates_save: lines `key value` (bus_bps, copy_bps,
 * read_exact, read_q8, read_q4; '#' starts a comment), every key once, every value a finite
 * positive number. AKV_EIO when the file cannot be read, AKV_EFORMAT (logged with the line)
 * for anything else; *out is written only on success. */
akv_status akv_gate_rates_load(const char *path, akv_gate_rates *out);

/* Writes them (AKV_EIO, logged, when the file cannot be written). */
akv_status akv_gate_rates_save(const char *path, const akv_gate_rates *r);

/* The placements the gate weighs, most exact first: resident exact, resident with a q8 tier,
 * with a q4 tier, staged exact, staged with a q8 tier, with a q4 tier. */
enum { AKV_GATE_PLACEMENTS = 6 };
typedef struct akv_gate_placement {
    akv_route_kind kind;
    akv_repr tier;
} akv_gate_placement;
akv_gate_placement akv_gate_placement_at(uint32_t i); /* i < AKV_GATE_PLACEMENTS */

/* One placement, as the gate saw it. */
typedef struct akv_gate_option {
    akv_route_kind kind;
    akv_repr tier;
    uint32_t seqs;        /* sequences the memory plan admits at once (0: it does not fit) */
    double weight_bytes;  /* weight bytes a step reads (once, for every sequence) */
    double device_bytes;  /* K/V bytes a step reads on the device, every admitted sequence */
    double bus_bytes;     /* bytes a step copies across the bus (staged) */
    double step_s;        /* predicted step: max(bus, device reads: weights and K/V) */
    double token_s;       /* step_s / seqs: what a token costs the batch */
    bool chosen;
} akv_gate_option;

/* The prediction for one placement of seqs sequences of n_tokens each, over weights of
 * weight_bytes (read at the copy rate): compact pages are those older than exact_recent (a
 * placement with a tier); staged pages are those beyond window_tokens (staged exact), or the
 * compact pages beyond window_tokens of them (staged with a tier: its compact window). Fills
 * every field but chosen; seqs 0 gives an option that does not fit. */
akv_gate_option akv_gate_predict(const akv_gate_rates *r, const akv_geom *g, akv_route_kind kind,
                                 akv_repr tier, uint32_t seqs, uint64_t n_tokens,
                                 uint64_t exact_recent, uint64_t window_tokens,
                                 double weight_bytes);

/* Marks the option of least token_s chosen (a more exact one within 5 % of it wins: the list
 * is in order of exactness, most exact first) and returns its index; -1 when none fits. */
int akv_gate_choose(akv_gate_option *opts, uint32_t n);

/* The options as a table with its arithmetic (one line each), NUL-terminated in buf. Returns
 * the length it needed. */
size_t akv_gate_format(const akv_gate_rates *r, const akv_gate_option *opts, uint32_t n,
                       uint64_t n_tokens, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* AKV_GATE_H */
