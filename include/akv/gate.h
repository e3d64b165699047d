/*
 * akv/gate.h — the economic gate: which route and which K/V representation serve a workload
 * best on this machine, by a transfer model measured on it.
 *
 * Glossary
 *   rates      what the machine does, measured (akv calibrate) or its defaults:
 *                bus        the host-to-device large-copy rate, and the rate of the stage's
 *                           copies (one batch of scattered pages) by page size, 16 KiB to 1 MiB,
 *                           as fractions of it;
 *                copy       the device-copy rate (bytes read + written);
 *                read       for each representation and batch (1 to 32 sequences), the rate at
 *                           which the decode reads its pages, a fraction of the copy rate (1.0:
 *                           the exact kernel at long context reads at the copy rate; a compact
 *                           form that its decoding slows reads at less);
 *                shared     what each keeps of its rate while the other runs: the bus while the
 *                           device reads, the device's reads while the bus copies.
 *   placement  a route kind and a representation of the older history: resident exact,
 *              resident with a q8 or q4 tier (the hybrid kind: the last exact_recent tokens
 *              exact), staged exact, staged with a q8 or q4 tier.
 *   step       a decode step of the admitted sequences: reading the weights and every
 *              history's K/V once on the device (device time), and, staged, copying what the
 *              window lacks across the bus at its form's page rate (bus time). The two run at
 *              once, each slowed by the other while both run: the step is the longer, plus the
 *              shorter's part the sharing cost (akv_gate_overlap). The weights are read once a
 *              step however many sequences share it, so a placement that admits more sequences
 *              spreads them thinner.
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

enum { AKV_GATE_PAGE_SIZES = 7 }; /* the bus by page size: 16 KiB << i, i < 7 (to 1 MiB) */
enum { AKV_GATE_BATCHES = 6 };    /* the reads by batch: 1 << i sequences, i < 6 (to 32) */

typedef struct akv_gate_rates {
    double bus_bps;                      /* host -> device, large copies from pinned memory */
    double bus_page[AKV_GATE_PAGE_SIZES]; /* one batch of scattered pages of 16 KiB << i each:
                                            its rate, a fraction of bus_bps */
    double copy_bps;                     /* device to device, bytes read + written per second */
    double read_frac[AKV_REPR_COUNT][AKV_GATE_BATCHES]; /* the decode's read rate of a form's
                                            pages at 1 << i sequences of 32K keys, a fraction
                                            of copy_bps */
    double bus_shared;  /* the bus's page rate while the device reads at its rate, a fraction
                           of the rate alone */
    double read_shared; /* the device's read rate while the bus copies, a fraction */
    char source[96];    /* where they come from (a file, or the defaults) */
} akv_gate_rates;

/* The defaults: an NVIDIA H100 80GB HBM3 (docs/benchmarks.md, "akv calibrate"). */
akv_gate_rates akv_gate_default_rates(void);

/* Reads rates written by akv_gate_rates_save: lines `key value` ('#' starts a comment): bus_bps,
 * copy_bps, bus_page_16k .. bus_page_1024k, read_FORM_bB (FORM exact, q8, q4; B 1, 2, 4, 8, 16,
 * 32), bus_shared, read_shared; every key once, every value a finite positive number. AKV_EIO
 * when the file cannot be read, AKV_EFORMAT (logged with the line or the key missing) for
 * anything else; *out is written only on success. */
akv_status akv_gate_rates_load(const char *path, akv_gate_rates *out);

/* Writes them (AKV_EIO, logged, when the file cannot be written). */
akv_status akv_gate_rates_save(const char *path, const akv_gate_rates *r);

/* The bus's rate (bytes/s) for the stage's copies of pages of page_bytes: bus_page
 * interpolated in log2 of the size between the measured sizes, held at the ends. */
double akv_gate_bus_rate(const akv_gate_rates *r, double page_bytes);

/* The decode's read rate (bytes/s) of form's pages at a batch of seqs sequences: read_frac
 * interpolated in log2 of the batch, held at the ends, times copy_bps. */
double akv_gate_read_rate(const akv_gate_rates *r, akv_repr form, uint32_t seqs);

/* A step whose bus alone takes bus_s and whose device work alone takes device_s, the two
 * started together: while both run, each goes at its shared fraction; the one left goes at
 * its own rate. The longer + the shorter x (1 - the longer's shared fraction) / the shorter's
 * (max(bus_s, device_s) when nothing is lost to the sharing). */
double akv_gate_overlap(const akv_gate_rates *r, double bus_s, double device_s);

/* The host-attended route's split (akv_route_params.host_share): the share of the pages
 * outside the windows that the host's cores attend so that they and the bus finish together,
 * x / host_bps = (1 - x) / bus: x = host_bps / (host_bps + bus), the bus at the pages' size
 * (akv_gate_bus_rate). Both rates are each alone: where the cores and the bus share the host's
 * memory, each goes slower. 0 for a host rate that is not positive. */
float akv_gate_host_share(const akv_gate_rates *r, double page_bytes, double host_bps);

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
    double page_bytes;    /* the size of each copy (a staged page of its form); 0: none */
    double device_s;      /* the device's reads alone: weights and K/V at their read rates */
    double bus_s;         /* the bus alone: bus_bytes at the page rate */
    double step_s;        /* predicted step: the two overlapped (akv_gate_overlap) */
    double token_s;       /* step_s / seqs: what a token costs the batch */
    bool chosen;
} akv_gate_option;

/* The prediction for one placement of seqs sequences of n_tokens each, over weights of
 * weight_bytes (read at the copy rate; the K/V at each form's rate at a batch of seqs): compact
 * pages are those older than exact_recent (a
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

/* The gate per context, for a placement with a compact tier: the longest history (at most
 * max_tokens) that stays exact, because compacting its older pages would save less than 5 % of
 * what its token costs (akv_gate_predict's token_s at seqs sequences of that length, tier
 * against exact: the same tie rule as akv_gate_choose). Longer histories save more, so every
 * history up to the answer stays exact and every longer one is compacted. 0 when none stays,
 * and on a staged placement (not decided per context there yet); max_tokens without a tier. */
uint64_t akv_gate_exact_below(const akv_gate_rates *r, const akv_geom *g, akv_gate_placement pl,
                              uint32_t seqs, uint64_t exact_recent, double weight_bytes,
                              uint64_t max_tokens);

/* The options as a table with its arithmetic (one line each), NUL-terminated in buf. Returns
 * the length it needed. */
size_t akv_gate_format(const akv_gate_rates *r, const akv_gate_option *opts, uint32_t n,
                       uint64_t n_tokens, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* AKV_GATE_H */
