/*
 * fuzz_http.c — libFuzzer target for the server's HTTP/1.1 framing (src/server/http_parse.c):
 * byte 0 picks the head limit and the piece sizes, the rest is the message. Checks: no crash or
 * sanitizer report; a refusal is one of the statuses the framing gives, with a message; an
 * accepted head lies inside the bytes given, its spans inside the head, its path a path, its
 * framing consistent with its version; every shorter prefix of an accepted head is "not yet";
 * the head's end is found the same way scanned at once or a byte at a time; and a chunked body
 * decodes to the same bytes, the same end and the same verdict whatever the pieces it arrives in.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/http_parse.h"

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_http: check failed: %s (line %d)\n", #c, __LINE__);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Decodes in[0..n) in pieces of `step`: the verdict, the bytes consumed and the body. */
static int dechunk(const char *in, size_t n, size_t step, char *out, size_t *n_out,
                   size_t *consumed) {
    akv_http_chunked c = {0};
    *n_out = 0;
    for (size_t at = 0; at < n;) {
        const size_t k = n - at < step ? n - at : step;
        for (size_t off = 0; off < k;) {
            size_t used, n_data;
            const char *data;
            akv_http_fault f;
            akv_http_chunk_result r =
                akv_http_chunked_feed(&c, in + at + off, k - off, &used, &data, &n_data, &f);
            CHECK(used <= k - off);
            off += used;
            if (r == AKV_HTTP_CHUNK_ERROR) {
                CHECK(f.status == 400 && f.message[0]);
                *consumed = at + off;
                return -1;
            }
            if (r == AKV_HTTP_CHUNK_DATA) {
                CHECK(data >= in && data + n_data <= in + n && n_data > 0);
                memcpy(out + *n_out, data, n_data);
                *n_out += n_data;
            }
            if (r == AKV_HTTP_CHUNK_DONE) {
                *consumed = at + off;
                return 1;
            }
            if (r == AKV_HTTP_CHUNK_MORE) CHECK(off == k);
        }
        at += k;
    }
    *consumed = n;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const size_t max_head = data[0] & 1 ? 64 : 4096;
    const size_t step = 1 + (data[0] >> 1) % 13;
    const char *b = (const char *)data + 1;
    const size_t n = size - 1;

    akv_http_head h;
    akv_http_fault f = {0};
    const int r = akv_http_parse_head(b, n, max_head, &h, &f);
    CHECK(r >= -1 && r <= 1);
    if (r == -1) {
        static const int ok[] = {400, 413, 414, 417, 431, 501, 505};
        int known = 0;
        for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
            known |= f.status == ok[i];
        CHECK(known && f.message[0]);
    }
    if (r == 1) {
        CHECK(h.n_bytes <= n && h.n_bytes <= max_head);
        CHECK(h.method_name.len > 0 && h.method_name.off + h.method_name.len <= h.n_bytes);
        CHECK(h.path.len > 0 && h.path.off + h.path.len <= h.n_bytes);
        CHECK(b[h.path.off] == '/' || (h.path.len == 1 && b[h.path.off] == '*'));
        /* the query: inside the head, after the path's '?' when it has bytes, without a '#' */
        CHECK(h.query.off + h.query.len <= h.n_bytes);
        CHECK(h.query.len == 0 || (h.query.off == h.path.off + h.path.len + 1 && b[h.query.off - 1] == '?'));
        CHECK(!memchr(b + h.query.off, '#', h.query.len));
        CHECK(h.minor == 0 || h.minor == 1);
        CHECK(h.framing != AKV_HTTP_BODY_CHUNKED || h.minor == 1);
        CHECK(!h.has_authorization || h.authorization.off + h.authorization.len <= h.n_bytes);
        for (size_t k = 0; k < h.n_bytes; k++) {
            akv_http_head h2;
            CHECK(akv_http_parse_head(b, k, max_head, &h2, &f) == 0);
        }
    }
    /* the end scan: at once, and resumed a byte at a time */
    size_t from = 0, end_once = akv_http_head_end(b, n, 0, &from), end_steps = 0;
    from = 0;
    for (size_t k = 0; k <= n && !end_steps; k++)
        end_steps = akv_http_head_end(b, k, from, &from);
    CHECK(end_once == end_steps);
    if (r == 1) CHECK(end_once == h.n_bytes);

    /* the chunked decoder: the same outcome in pieces of 1, of `step`, and whole */
    char *o1 = malloc(n + 1), *o2 = malloc(n + 1), *o3 = malloc(n + 1);
    CHECK(o1 && o2 && o3);
    size_t n1, n2, n3, c1, c2, c3;
    const int v1 = dechunk(b, n, 1, o1, &n1, &c1);
    const int v2 = dechunk(b, n, step, o2, &n2, &c2);
    const int v3 = dechunk(b, n, n ? n : 1, o3, &n3, &c3);
    CHECK(v1 == v2 && v2 == v3);
    if (v1 >= 0) CHECK(c1 == c2 && c2 == c3);
    if (v1 >= 0) CHECK(n1 == n2 && n2 == n3 && !memcmp(o1, o2, n1) && !memcmp(o2, o3, n1));
    free(o1);
    free(o2);
    free(o3);
    return 0;
}
