/* test_gate.c (unit) — the economic gate's transfer model (akv/gate.h): its arithmetic against
 * hand-computed figures, its choice, its calibration file and what the file refuses. */
#define _POSIX_C_SOURCE 200809L /* mkstemp, strdup */
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "akv/gate.h"
#include "akv/log.h"

static akv_geom llama3(void) {
    akv_geom g;
    if (akv_geom_init(&g, 32, 8, 128, AKV_DTYPE_BF16, 64) != AKV_OK) abort();
    return g;
}

/* Rates that make the arithmetic round: 50 GB/s bus at every page size, 2 TB/s copy, reads at
 * 1.0 / 0.8 / 0.5 at every batch, nothing lost to sharing. */
static akv_gate_rates round_rates(void) {
    akv_gate_rates r = {.bus_bps = 50e9, .copy_bps = 2e12, .bus_shared = 1, .read_shared = 1};
    const double read[AKV_REPR_COUNT] = {1.0, 0.8, 0.5};
    for (int i = 0; i < AKV_GATE_PAGE_SIZES; i++) r.bus_page[i] = 1;
    for (int f = 0; f < AKV_REPR_COUNT; f++)
        for (int b = 0; b < AKV_GATE_BATCHES; b++) r.read_frac[f][b] = read[f];
    snprintf(r.source, sizeof r.source, "test");
    return r;
}

/* Every batch's read rate of form f at v. */
static void set_read(akv_gate_rates *r, akv_repr f, double v) {
    for (int b = 0; b < AKV_GATE_BATCHES; b++) r->read_frac[f][b] = v;
}

static void test_arithmetic(void) {
    const akv_geom g = llama3();
    const akv_gate_rates r = round_rates();
    const double tok = 32.0 * 2 * 8 * 128 * 2; /* 131072 bytes a token */
    /* resident exact: 4 x 32768 tokens read at the copy rate */
    akv_gate_option o = akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_EXACT, 4, 32768, 256, 0, 0);
    CHECK_NEAR(o.device_bytes, 4 * 32768 * tok, 1);
    CHECK_NEAR(o.bus_bytes, 0, 0);
    CHECK_NEAR(o.step_s, 4 * 32768 * tok / 2e12, 1e-12);
    CHECK_NEAR(o.token_s, o.step_s / 4, 1e-15);
    /* q4: the last 256 tokens exact, the rest at 4.5 bits read at half the rate */
    o = akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_Q4, 4, 32768, 256, 0, 0);
    const double q4 = (32768 - 256) * tok * 4.5 / 16;
    CHECK_NEAR(o.device_bytes, 4 * (256 * tok + q4), 1);
    CHECK_NEAR(o.step_s, 4 * (256 * tok / 2e12 + q4 / 1e12), 1e-12);
    /* staged: the pages beyond a window of 1024 tokens over the bus, the larger of the two */
    o = akv_gate_predict(&r, &g, AKV_ROUTE_STAGED, AKV_REPR_EXACT, 4, 32768, 256, 1024, 0);
    CHECK_NEAR(o.bus_bytes, 4 * (32768 - 1024) * tok, 1);
    CHECK_NEAR(o.step_s, 4 * (32768 - 1024) * tok / 50e9, 1e-9);
    /* staged q4: its compact pages beyond a compact window of 8192 tokens over the bus, in
     * their form; the device reads the exact part and every compact page */
    o = akv_gate_predict(&r, &g, AKV_ROUTE_STAGED, AKV_REPR_Q4, 1, 131072, 256, 8192, 0);
    CHECK_NEAR(o.bus_bytes, (131072 - 256 - 8192) * tok * 4.5 / 16, 1);
    CHECK_NEAR(o.device_bytes, 256 * tok + (131072 - 256) * tok * 4.5 / 16, 1);
    CHECK_NEAR(o.step_s, o.bus_bytes / 50e9, 1e-9);
    /* a compact window that holds them all: nothing over the bus */
    o = akv_gate_predict(&r, &g, AKV_ROUTE_STAGED, AKV_REPR_Q8, 1, 4096, 256, 8192, 0);
    CHECK_NEAR(o.bus_bytes, 0, 0);
    /* a history shorter than the exact window has nothing compact */
    o = akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_Q8, 1, 100, 256, 0, 0);
    CHECK_NEAR(o.device_bytes, 100 * tok, 1);
    /* the weights, read once a step at the copy rate, are shared by the step's sequences */
    o = akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_EXACT, 4, 32768, 256, 0, 16e9);
    CHECK_NEAR(o.weight_bytes, 16e9, 0);
    CHECK_NEAR(o.step_s, 16e9 / 2e12 + 4 * 32768 * tok / 2e12, 1e-12);
    CHECK_NEAR(o.token_s, o.step_s / 4, 1e-15);
    /* staged: the bus against the device's reads, weights among them */
    o = akv_gate_predict(&r, &g, AKV_ROUTE_STAGED, AKV_REPR_EXACT, 1, 4096, 256, 2048, 400e9);
    CHECK_NEAR(o.step_s, 400e9 / 2e12 + 4096 * tok / 2e12, 1e-12); /* 0.2 s of weights > 5 ms of bus */
    /* a placement that admits nothing costs nothing and is never chosen */
    o = akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_EXACT, 0, 32768, 256, 0, 0);
    CHECK_EQ_INT(o.seqs, 0);
    CHECK_NEAR(o.step_s, 0, 0);
}

static void test_choice(void) {
    const akv_geom g = llama3();
    const akv_gate_rates r = round_rates();
    /* everything fits: exact, q8 and q4 read a history in 1.0, 0.66, 0.56 of exact's time;
     * q4 wins by more than 5 % */
    akv_gate_option opts[4] = {
        akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_EXACT, 4, 32768, 256, 0, 0),
        akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_Q8, 4, 32768, 256, 0, 0),
        akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_Q4, 4, 32768, 256, 0, 0),
        akv_gate_predict(&r, &g, AKV_ROUTE_STAGED, AKV_REPR_EXACT, 4, 32768, 256, 32768, 0)};
    CHECK_EQ_INT(akv_gate_choose(opts, 4), 2);
    CHECK(opts[2].chosen && !opts[0].chosen && !opts[1].chosen && !opts[3].chosen);
    /* a compact form that reads no faster than exact does (its decoding as slow as its bytes
     * are few) is not taken: the more exact wins a tie within 5 % */
    akv_gate_rates slow = r;
    set_read(&slow, AKV_REPR_Q8, 8.125 / 16 * 1.02), set_read(&slow, AKV_REPR_Q4, 4.5 / 16 * 1.03);
    opts[1] = akv_gate_predict(&slow, &g, AKV_ROUTE_RESIDENT, AKV_REPR_Q8, 4, 32768, 256, 0, 0);
    opts[2] = akv_gate_predict(&slow, &g, AKV_ROUTE_RESIDENT, AKV_REPR_Q4, 4, 32768, 256, 0, 0);
    CHECK_EQ_INT(akv_gate_choose(opts, 4), 0);
    /* a pool that holds one exact history: resident exact admits 1, staged exact 4 (at the bus's
     * rate), q4 4: per token q4 is cheapest */
    opts[0] = akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_EXACT, 1, 32768, 256, 0, 0);
    opts[1] = akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_Q8, 0, 32768, 256, 0, 0);
    opts[2] = akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_Q4, 4, 32768, 256, 0, 0);
    opts[3] = akv_gate_predict(&r, &g, AKV_ROUTE_STAGED, AKV_REPR_EXACT, 4, 32768, 256, 8192, 0);
    CHECK_EQ_INT(akv_gate_choose(opts, 4), 2);
    /* without q4, staged against one resident sequence: per token the resident one costs
     * 2.1 ms, staged 4 x 3.2 GiB / 50 GB/s / 4 = 64 ms */
    opts[2].seqs = 0;
    CHECK_EQ_INT(akv_gate_choose(opts, 4), 0);
    for (int i = 0; i < 4; i++) opts[i].seqs = 0;
    CHECK_EQ_INT(akv_gate_choose(opts, 4), -1);
    char buf[2048];
    opts[0] = akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_EXACT, 2, 32768, 256, 0, 0);
    akv_gate_choose(opts, 4);
    const size_t n = akv_gate_format(&r, opts, 4, 32768, buf, sizeof buf);
    CHECK(n > 0 && n < sizeof buf);
    CHECK(strstr(buf, "* resident  exact 2 sequence(s)") != NULL);
    CHECK(strstr(buf, "staged    exact does not fit") != NULL);
    printf("%s", buf);
    /* short histories under 16 GB of weights: q4 reads the K/V in 0.56 of exact's time, but
     * the step is mostly weights, so it saves 1.4 % a token and the exact placement keeps it;
     * without the weights q4 would win */
    for (int w = 0; w < 2; w++) {
        const double wb = w ? 16e9 : 0;
        opts[0] = akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_EXACT, 2, 4096, 256, 0, wb);
        opts[1] = akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_Q8, 2, 4096, 256, 0, wb);
        opts[2] = akv_gate_predict(&r, &g, AKV_ROUTE_RESIDENT, AKV_REPR_Q4, 2, 4096, 256, 0, wb);
        opts[3] = akv_gate_predict(&r, &g, AKV_ROUTE_STAGED, AKV_REPR_EXACT, 0, 4096, 256, 0, wb);
        CHECK_EQ_INT(akv_gate_choose(opts, 4), w ? 0 : 2);
    }
}

/* The bus by page size, the reads by batch (log2 interpolation, held at the ends), and the
 * overlap of the two under sharing. */
static void test_rates_by_size_batch_and_sharing(void) {
    akv_gate_rates r = round_rates();
    const double page[AKV_GATE_PAGE_SIZES] = {0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0};
    memcpy(r.bus_page, page, sizeof page);
    CHECK_NEAR(akv_gate_bus_rate(&r, 16384), 25e9, 1);
    CHECK_NEAR(akv_gate_bus_rate(&r, 4096), 25e9, 1);             /* held below */
    CHECK_NEAR(akv_gate_bus_rate(&r, 65536), 35e9, 1);
    CHECK_NEAR(akv_gate_bus_rate(&r, 65536 * sqrt(2.0)), 37.5e9, 1); /* halfway in log2 */
    CHECK_NEAR(akv_gate_bus_rate(&r, 256 << 20), 50e9, 1);        /* held above */
    const double q4[AKV_GATE_BATCHES] = {0.3, 0.4, 0.5, 0.6, 0.6, 0.7};
    memcpy(r.read_frac[AKV_REPR_Q4], q4, sizeof q4);
    CHECK_NEAR(akv_gate_read_rate(&r, AKV_REPR_Q4, 1), 0.6e12, 1);
    CHECK_NEAR(akv_gate_read_rate(&r, AKV_REPR_Q4, 4), 1.0e12, 1);
    CHECK_NEAR(akv_gate_read_rate(&r, AKV_REPR_Q4, 3), 2e12 * (0.4 + 0.1 * (log2(3) - 1)), 1);
    CHECK_NEAR(akv_gate_read_rate(&r, AKV_REPR_Q4, 64), 1.4e12, 1);
    CHECK_NEAR(akv_gate_read_rate(&r, AKV_REPR_EXACT, 7), 2e12, 1);
    /* overlap: nothing lost gives the larger; each at half while both run (one resource)
     * gives the sum; the bus at half beside reads that keep their rate: the reads end first,
     * the bus has done half their time's worth, the rest alone */
    CHECK_NEAR(akv_gate_overlap(&r, 10, 4), 10, 1e-12);
    CHECK_NEAR(akv_gate_overlap(&r, 0, 4), 4, 0);
    CHECK_NEAR(akv_gate_overlap(&r, 3, 0), 3, 0);
    r.bus_shared = 0.5, r.read_shared = 0.5;
    CHECK_NEAR(akv_gate_overlap(&r, 10, 4), 14, 1e-12);
    CHECK_NEAR(akv_gate_overlap(&r, 4, 10), 14, 1e-12);
    r.bus_shared = 0.5, r.read_shared = 1;
    CHECK_NEAR(akv_gate_overlap(&r, 10, 4), 12, 1e-12);
    CHECK_NEAR(akv_gate_overlap(&r, 2, 10), 10, 1e-12); /* the bus ends first (4 < 10) */
    r.bus_shared = 1, r.read_shared = 0.5;
    CHECK_NEAR(akv_gate_overlap(&r, 4, 10), 12, 1e-12);
    /* a staged prediction at its pages' size: exact pages of 256 KiB at 0.9 of the bus, q4 pages
     * of 72 KiB at 0.7 + 0.1 x log2(72/64); the step, the bus at half beside the reads */
    const akv_geom g = llama3();
    CHECK_EQ_INT((int)akv_geom_repr_page_bytes(&g, AKV_REPR_EXACT), 262144);
    akv_gate_option o = akv_gate_predict(&r, &g, AKV_ROUTE_STAGED, AKV_REPR_EXACT, 1, 32768, 256, 1024, 0);
    CHECK_NEAR(o.page_bytes, 262144, 0);
    CHECK_NEAR(o.bus_s, o.bus_bytes / 45e9, 1e-12);
    o = akv_gate_predict(&r, &g, AKV_ROUTE_STAGED, AKV_REPR_Q4, 1, 131072, 256, 8192, 0);
    CHECK_NEAR(o.page_bytes, 73728, 0);
    CHECK_NEAR(o.bus_s, o.bus_bytes / (50e9 * (0.7 + 0.1 * log2(73728.0 / 65536))), 1e-12);
    const double tok = 131072, cq4 = (131072 - 256) * tok * 4.5 / 16;
    CHECK_NEAR(o.device_s, 256 * tok / 2e12 + cq4 / 0.6e12, 1e-12);
    r.bus_shared = 0.5, r.read_shared = 1;
    o = akv_gate_predict(&r, &g, AKV_ROUTE_STAGED, AKV_REPR_Q4, 1, 131072, 256, 8192, 0);
    CHECK_NEAR(o.step_s, akv_gate_overlap(&r, o.bus_s, o.device_s), 0);
    CHECK(o.step_s > fmax(o.bus_s, o.device_s) && o.step_s < o.bus_s + o.device_s);
}

/* A file of `text` in a fresh temporary path (freed by the caller). */
static char *temp_file(const char *text) {
    char *path = strdup("/tmp/akv_gate_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) abort();
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) abort();
    close(fd);
    return path;
}

/* A good file's text, with line `drop` left out and `extra` appended. */
static char *rates_text(const akv_gate_rates *r, int drop, const char *extra) {
    char *path = temp_file("");
    if (akv_gate_rates_save(path, r) != AKV_OK) abort();
    FILE *f = fopen(path, "r");
    static char text[8192];
    size_t at = 0;
    char line[256];
    for (int no = 0; f && fgets(line, sizeof line, f); no++)
        if (no != drop) at += (size_t)snprintf(text + at, sizeof text - at, "%s", line);
    if (f) fclose(f);
    snprintf(text + at, sizeof text - at, "%s", extra);
    unlink(path), free(path);
    return text;
}

static void test_file(void) {
    akv_gate_rates r = round_rates(), back;
    r.read_frac[AKV_REPR_Q4][3] = 0.675, r.bus_page[2] = 0.92, r.bus_shared = 0.8, r.read_shared = 0.9;
    char *path = temp_file("");
    CHECK_OK(akv_gate_rates_save(path, &r));
    CHECK_OK(akv_gate_rates_load(path, &back));
    CHECK_NEAR(back.bus_bps, r.bus_bps, 0);
    CHECK_NEAR(back.copy_bps, r.copy_bps, 0);
    for (int i = 0; i < AKV_GATE_PAGE_SIZES; i++) CHECK_NEAR(back.bus_page[i], r.bus_page[i], 0);
    for (int f = 0; f < AKV_REPR_COUNT; f++)
        for (int b = 0; b < AKV_GATE_BATCHES; b++) CHECK_NEAR(back.read_frac[f][b], r.read_frac[f][b], 0);
    CHECK_NEAR(back.bus_shared, 0.8, 0);
    CHECK_NEAR(back.read_shared, 0.9, 0);
    CHECK(strstr(back.source, path) != NULL);
    unlink(path), free(path);
    /* line 0 is the comment; 1 bus_bps, 3 bus_page_16k, 10 read_exact_b1, 28 bus_shared */
    struct { int drop; const char *extra; } bad[] = {
        {28, ""},                       /* no bus_shared */
        {10, ""},                       /* no read_exact_b1 */
        {3, ""},                        /* no bus_page_16k */
        {-1, "bus_bps 5e10\n"},         /* twice */
        {1, "bus_bps -5\n"},            /* negative */
        {1, "bus_bps fast\n"},          /* not a number */
        {1, "bus_bps 5e10 GB\n"},       /* trailing */
        {-1, "bus 5e10\n"},             /* unknown key */
        {-1, "read_q4_b64 0.5\n"},      /* a batch not measured */
        {1, "bus_bps nan\n"},           /* not finite */
        {29, "read_shared 0\n"},        /* not positive */
    };
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *p = temp_file(rates_text(&r, bad[i].drop, bad[i].extra));
        back.bus_bps = 7;
        CHECK_STATUS(akv_gate_rates_load(p, &back), AKV_EFORMAT);
        CHECK_NEAR(back.bus_bps, 7, 0); /* nothing written */
        unlink(p), free(p);
    }
    /* the file of the earlier akv calibrate (five keys) is refused, naming what it lacks */
    char *p = temp_file("bus_bps 5e10\ncopy_bps 2e12\nread_exact 1\nread_q8 0.9\nread_q4 0.5\n");
    CHECK_STATUS(akv_gate_rates_load(p, &back), AKV_EFORMAT);
    unlink(p), free(p);
    /* comments and blank lines are fine */
    p = temp_file(rates_text(&r, -1, "# more\n\n   # and more\n"));
    CHECK_OK(akv_gate_rates_load(p, &back));
    CHECK_NEAR(back.read_frac[AKV_REPR_Q4][3], 0.675, 0);
    unlink(p), free(p);
    CHECK_STATUS(akv_gate_rates_load("/nonexistent/akv.rates", &back), AKV_EIO);
    CHECK_STATUS(akv_gate_rates_save("/nonexistent/akv.rates", &r), AKV_EIO);
    akv_log_set(NULL, NULL, AKV_LOG_WARN);
    const akv_gate_rates d = akv_gate_default_rates();
    CHECK(d.bus_bps > 0 && d.copy_bps > d.bus_bps && strstr(d.source, "H100") != NULL);
    CHECK(d.bus_shared > 0 && d.bus_shared <= 1 && d.read_shared > 0 && d.read_shared <= 1);
}

/* The gate per context against a hand figure: with the round rates q4 reads a token's 4.5/16
 * of the bytes at half the rate (0.5625 of exact's time), so at 8 sequences over weights W a
 * history of n tokens stays exact while W/8 + 256 t + 0.5625 (n - 256) t >= 0.95 (W/8 + n t):
 * n <= (0.05 W/8 + 0.4375 x 256 t) / (0.3875 t); 2257.9 for W = 16 GB, 289.0 for none. */
static void test_per_context(void) {
    const akv_geom g = llama3();
    const akv_gate_rates r = round_rates();
    const double t = 131072;
    const akv_gate_placement q4 = {AKV_ROUTE_RESIDENT, AKV_REPR_Q4};
    const uint64_t w16 = akv_gate_exact_below(&r, &g, q4, 8, 256, 16e9, 1u << 20),
                   w0 = akv_gate_exact_below(&r, &g, q4, 8, 256, 0, 1u << 20);
    CHECK_EQ_U64(w16, (uint64_t)((0.05 * 16e9 / 8 + 0.4375 * 256 * t) / (0.3875 * t)));
    CHECK_EQ_U64(w0, 289);
    CHECK_EQ_U64(akv_gate_exact_below(&r, &g, q4, 8, 256, 16e9, 1000), 1000); /* all of it */
    CHECK_EQ_U64(akv_gate_exact_below(&r, &g, (akv_gate_placement){AKV_ROUTE_RESIDENT, AKV_REPR_EXACT}, 8, 256, 0, 5000), 5000);
    CHECK_EQ_U64(akv_gate_exact_below(&r, &g, (akv_gate_placement){AKV_ROUTE_STAGED, AKV_REPR_Q4}, 8, 256, 0, 5000), 0);
    akv_gate_rates slow = r; /* a form that reads too slowly never pays: everything stays exact */
    set_read(&slow, AKV_REPR_Q4, 0.2);
    CHECK_EQ_U64(akv_gate_exact_below(&slow, &g, q4, 8, 256, 0, 1u << 20), 1u << 20);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    TEST_CASE(arithmetic_against_hand_figures) test_arithmetic();
    TEST_CASE(the_least_cost_a_token_more_exact_on_a_tie) test_choice();
    TEST_CASE(rates_by_page_size_batch_and_sharing) test_rates_by_size_batch_and_sharing();
    TEST_CASE(calibration_file_and_its_refusals) test_file();
    TEST_CASE(per_context_exact_below_a_length) test_per_context();
    return test_finish();
}
