/*
 * server/http_parse.h — HTTP/1.1 request framing (RFC 9112), with no sockets: a request head's
 * bytes in, its method, target, framing and the few headers the server reads out, or the
 * status and reason that refuse it; and a chunked body decoder. Pure functions over caller
 * buffers, so both are fuzzed on their own (tests/fuzz/fuzz_http.c).
 *
 * The rules, where RFC 9112 lets a recipient choose, choose the strict side, because a
 * message that two parsers frame differently is how requests are smuggled past a proxy:
 *   - a line ends with CRLF or a bare LF (§2.2); a CR anywhere else, a NUL, or another
 *     control character in a line refuses the message (400);
 *   - the request line is `method SP target SP HTTP/1.x`; another version is 505; a target
 *     that is not origin-form ("/..."), absolute-form ("http://host/...") or "*" is 400;
 *   - a header line is `name ":" OWS value OWS`: whitespace before the colon and obsolete
 *     line folding (a line starting with SP or HTAB) are 400 (§5.1, §5.2);
 *   - Content-Length is 1*DIGIT; a second Content-Length header, or a list, even of equal
 *     values, is 400; Transfer-Encoding and Content-Length together are 400 (§6.3 allows
 *     the TE to win; refusing is the reading no proxy can disagree with);
 *   - Transfer-Encoding must be exactly "chunked" (any other coding is 501), once, and only
 *     in HTTP/1.1 (HTTP/1.0 with it is 400);
 *   - an HTTP/1.1 request has exactly one Host header (§3.2: 400 otherwise);
 *   - Expect is "100-continue" or refused (417);
 *   - the head is at most max_head_bytes (a request line that does not end by then is 414,
 *     the headers 431), with at most AKV_HTTP_MAX_HEADERS header lines (431).
 * After a refusal the connection's framing is unknown: the caller answers and closes.
 *
 * Chunked bodies (§7.1): `hex-size [; ext] CRLF data CRLF` ... `0 CRLF [trailer lines] CRLF`.
 * Sizes above 2^60, a chunk line or trailer section over 4 KiB, a missing CRLF after data
 * are 400; extensions and trailer fields are read and dropped.
 */
#ifndef AKV_SERVER_HTTP_PARSE_H
#define AKV_SERVER_HTTP_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    AKV_HTTP_MAX_HEADERS = 100,     /* header lines in one head */
    AKV_HTTP_MAX_CHUNK_LINE = 4096, /* a chunk-size line (with its extensions) */
    AKV_HTTP_MAX_TRAILER = 4096,    /* a chunked body's trailer section */
};

typedef enum akv_http_method {
    AKV_HTTP_GET = 0,
    AKV_HTTP_HEAD,
    AKV_HTTP_POST,
    AKV_HTTP_OTHER, /* any other token: the server answers 405 or 404 */
} akv_http_method;

typedef enum akv_http_framing {
    AKV_HTTP_BODY_NONE = 0, /* no Content-Length and no Transfer-Encoding: no body */
    AKV_HTTP_BODY_LENGTH,   /* Content-Length bytes */
    AKV_HTTP_BODY_CHUNKED,  /* Transfer-Encoding: chunked */
} akv_http_framing;

/* A stretch of the head's bytes. */
typedef struct akv_http_span {
    uint32_t off, len;
} akv_http_span;

/* A parsed request head. Spans point into the buffer given to akv_http_parse_head. */
typedef struct akv_http_head {
    akv_http_method method;
    akv_http_span method_name; /* the method token as sent */
    akv_http_span path;        /* the target's path: origin-form without its query, the
                                  path of an absolute-form target, or "*" */
    akv_http_span query;       /* what follows the path's '?', without it (empty: none) */
    int minor;                 /* HTTP/1.<minor>: 0 or 1 */
    akv_http_framing framing;
    uint64_t content_length; /* AKV_HTTP_BODY_LENGTH: the body's bytes */
    bool keep_alive;         /* the client may send another request after this one */
    bool expect_continue;    /* Expect: 100-continue (HTTP/1.1) */
    bool has_authorization;
    akv_http_span authorization; /* its value, OWS trimmed */
    uint32_t n_headers;
    size_t n_bytes; /* the head's length, its empty last line included */
} akv_http_head;

/* Why a message is refused: the status to answer and a sentence for the client. */
typedef struct akv_http_fault {
    int status; /* 400, 413, 414, 417, 431, 501, 505 */
    char message[160];
} akv_http_fault;

/* Where the head that starts buf[0..n) ends: the offset just past its empty line, or 0 when
 * it has not ended within buf. `from` is where an earlier call on the same (grown) buffer
 * stopped looking, so a head that arrives a byte at a time is scanned once overall; pass 0
 * the first time. *next_from gets where the next call should start. */
size_t akv_http_head_end(const char *buf, size_t n, size_t from, size_t *next_from);

/* Parses the request head at the start of buf[0..n). 1: a complete head, *head filled; 0: it
 * has not ended and n <= max_head_bytes (read more); -1: refused, *fault says why (a head
 * still unended past max_head_bytes is 414 or 431). Empty lines before the request line are
 * skipped (§2.2). */
int akv_http_parse_head(const char *buf, size_t n, size_t max_head_bytes, akv_http_head *head,
                        akv_http_fault *fault);

/* The chunked body decoder's state: zero it before the body's first byte. */
typedef struct akv_http_chunked {
    int state;
    uint64_t left;     /* data bytes left in the current chunk */
    uint32_t n_line;   /* bytes of the current chunk line or of the trailer section */
    uint32_t n_digits; /* hex digits of the size read */
} akv_http_chunked;

typedef enum akv_http_chunk_result {
    AKV_HTTP_CHUNK_MORE = 0, /* every byte given was consumed; more are needed */
    AKV_HTTP_CHUNK_DATA,     /* *data[0..*n_data) is body data (a slice of the input) */
    AKV_HTTP_CHUNK_DONE,     /* the body and its trailer ended (bytes after it are not ours) */
    AKV_HTTP_CHUNK_ERROR,    /* malformed: *fault says why */
} akv_http_chunk_result;

/* Decodes from in[0..n): consumes *used bytes (up to the end of one data slice, or to the end
 * of the body, or all of them; on an error, up to the offending byte) and says what they were.
 * Call again with the rest. */
akv_http_chunk_result akv_http_chunked_feed(akv_http_chunked *c, const char *in, size_t n,
                                            size_t *used, const char **data, size_t *n_data,
                                            akv_http_fault *fault);

/* The reason phrase of a status ("OK", "Not Found"; "Unknown" for others). */
const char *akv_http_reason(int status);

#endif
