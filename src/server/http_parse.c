/* http_parse.c — HTTP/1.1 request heads and chunked bodies (server/http_parse.h). */
#include "server/http_parse.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static int fault_set(akv_http_fault *f, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fault_set(akv_http_fault *f, int status, const char *fmt, ...) {
    f->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->message, sizeof f->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* RFC 9110 tchar: the characters of a token (methods, header names). */
static bool is_tchar(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* A field value's byte: VCHAR, obs-text, SP or HTAB. */
static bool is_field_byte(unsigned char c) {
    return c == ' ' || c == '\t' || (c >= 0x21 && c != 0x7F);
}

static bool is_ows(unsigned char c) {
    return c == ' ' || c == '\t';
}

/* Skips the empty lines a client may send before the request line (§2.2). */
static size_t skip_empty_lines(const char *b, size_t n) {
    size_t i = 0;
    for (;;) {
        if (i < n && b[i] == '\n')
            i += 1;
        else if (i + 1 < n && b[i] == '\r' && b[i + 1] == '\n')
            i += 2;
        else
            return i;
    }
}

size_t akv_http_head_end(const char *b, size_t n, size_t from, size_t *next_from) {
    const size_t start = skip_empty_lines(b, n);
    size_t i = from > start ? from : start; /* always a line start */
    while (i < n) {
        const char *lf = memchr(b + i, '\n', n - i);
        if (!lf) break;
        size_t len = (size_t)(lf - (b + i)); /* bytes before the LF */
        if (i > start && (len == 0 || (len == 1 && b[i] == '\r'))) {
            *next_from = i;
            return (size_t)(lf - b) + 1;
        }
        i = (size_t)(lf - b) + 1;
    }
    *next_from = i;
    return 0;
}

/* One line of the head from b[*at]: its content [*at, end) without the CR LF or LF; *at moves
 * past the line end. -1 with a fault for a CR that does not end the line, a NUL or another
 * control byte (HTAB is allowed where the caller allows it). */
static int head_line(const char *b, size_t n, size_t *at, size_t *end, akv_http_fault *f) {
    const char *lf = memchr(b + *at, '\n', n - *at);
    if (!lf) return fault_set(f, 400, "the request head is cut short");
    size_t e = (size_t)(lf - b);
    if (e > *at && b[e - 1] == '\r') e--;
    for (size_t i = *at; i < e; i++) {
        unsigned char c = (unsigned char)b[i];
        if (c == '\r') return fault_set(f, 400, "a bare CR inside a request line or header");
        if ((c < 0x20 && c != '\t') || c == 0x7F)
            return fault_set(f, 400, "a control byte (0x%02x) in the request head", c);
    }
    *end = e;
    *at = (size_t)(lf - b) + 1;
    return 0;
}

static bool span_is(const char *b, akv_http_span s, const char *lit) {
    size_t n = strlen(lit);
    return s.len == n && strncasecmp(b + s.off, lit, n) == 0;
}

static akv_http_span span_of(size_t off, size_t end) {
    return (akv_http_span){(uint32_t)off, (uint32_t)(end - off)};
}

/* The request line b[at, end): method SP target SP version. */
static int parse_request_line(const char *b, size_t at, size_t end, akv_http_head *h,
                              akv_http_fault *f) {
    size_t i = at;
    while (i < end && is_tchar((unsigned char)b[i]))
        i++;
    if (i == at || i >= end || b[i] != ' ')
        return fault_set(f, 400, "the request line is not 'METHOD /path HTTP/1.1'");
    h->method_name = span_of(at, i);
    static const struct {
        const char *name;
        akv_http_method m;
    } methods[] = {{"GET", AKV_HTTP_GET}, {"HEAD", AKV_HTTP_HEAD}, {"POST", AKV_HTTP_POST}};
    h->method = AKV_HTTP_OTHER;
    for (size_t k = 0; k < sizeof methods / sizeof *methods; k++) /* methods are case-sensitive */
        if (i - at == strlen(methods[k].name) && !memcmp(b + at, methods[k].name, i - at))
            h->method = methods[k].m;
    size_t t0 = ++i;
    while (i < end && (unsigned char)b[i] > 0x20 && (unsigned char)b[i] < 0x7F)
        i++;
    if (i == t0 || i >= end || b[i] != ' ')
        return fault_set(f, 400,
                         "the request target is missing or holds a space or a "
                         "non-ASCII byte");
    const size_t t1 = i++;
    /* the version: exactly "HTTP/" DIGIT "." DIGIT, and the line ends there */
    if (end - i != 8 || memcmp(b + i, "HTTP/", 5) || b[i + 5] < '0' || b[i + 5] > '9' ||
        b[i + 6] != '.' || b[i + 7] < '0' || b[i + 7] > '9')
        return fault_set(f, 400, "the request line does not end in HTTP/1.0 or HTTP/1.1");
    if (b[i + 5] != '1' || b[i + 7] > '1')
        return fault_set(f, 505, "HTTP/%c.%c is not supported (HTTP/1.1 and 1.0 are)", b[i + 5],
                         b[i + 7]);
    h->minor = b[i + 7] - '0';
    /* the target's path */
    size_t p0 = t0;
    if (b[t0] == '/') {
        /* origin-form */
    } else if (t1 - t0 == 1 && b[t0] == '*') {
        h->path = span_of(t0, t1);
        return 0;
    } else {
        size_t k = t0;
        if (t1 - t0 >= 7 && !strncasecmp(b + t0, "http://", 7))
            k += 7;
        else if (t1 - t0 >= 8 && !strncasecmp(b + t0, "https://", 8))
            k += 8;
        else
            return fault_set(f, 400, "the request target must be a path starting with '/'");
        while (k < t1 && b[k] != '/' && b[k] != '?')
            k++;
        if (k == t1 || b[k] != '/')
            return fault_set(f, 400, "the absolute request target has no path");
        p0 = k;
    }
    size_t p1 = p0;
    while (p1 < t1 && b[p1] != '?' && b[p1] != '#')
        p1++;
    size_t q1 = p1 < t1 ? p1 + 1 : t1; /* the query: after '?' to the end */
    while (q1 < t1 && b[q1] != '#')
        q1++;
    if ((p1 < t1 && b[p1] == '#') || q1 < t1)
        return fault_set(f, 400, "a request target cannot hold '#'");
    h->path = span_of(p0, p1);
    h->query = p1 < t1 ? span_of(p1 + 1, t1) : span_of(t1, t1);
    return 0;
}

/* What the header lines said so far. */
typedef struct head_seen {
    bool cl, te, close, keep_alive;
    int n_host;
} head_seen;

/* A header's value b[v0, v1) (OWS trimmed) for the fields the server reads. */
static int take_header(const char *b, akv_http_span name, size_t v0, size_t v1, akv_http_head *h,
                       head_seen *seen, akv_http_fault *f) {
    const akv_http_span val = span_of(v0, v1);
    if (span_is(b, name, "content-length")) {
        if (seen->cl) return fault_set(f, 400, "more than one Content-Length header");
        seen->cl = true;
        if (v1 == v0) return fault_set(f, 400, "an empty Content-Length");
        uint64_t x = 0;
        for (size_t i = v0; i < v1; i++) {
            if (b[i] < '0' || b[i] > '9')
                return fault_set(f, 400,
                                 "Content-Length must be digits only (a list or a "
                                 "sign is refused)");
            if (i - v0 >= 18) return fault_set(f, 413, "Content-Length is too large");
            x = x * 10 + (uint64_t)(b[i] - '0');
        }
        h->content_length = x;
    } else if (span_is(b, name, "transfer-encoding")) {
        if (seen->te) return fault_set(f, 400, "more than one Transfer-Encoding header");
        seen->te = true;
        if (!span_is(b, val, "chunked"))
            return fault_set(f, 501, "Transfer-Encoding '%.*s' is not supported (chunked only)",
                             (int)(val.len < 40 ? val.len : 40), b + val.off);
    } else if (span_is(b, name, "host")) {
        seen->n_host++;
    } else if (span_is(b, name, "connection")) {
        /* a list of tokens: close wins; keep-alive asks HTTP/1.0 to keep it */
        for (size_t i = v0; i < v1;) {
            while (i < v1 && (is_ows((unsigned char)b[i]) || b[i] == ','))
                i++;
            size_t j = i;
            while (j < v1 && b[j] != ',')
                j++;
            size_t e = j;
            while (e > i && is_ows((unsigned char)b[e - 1]))
                e--;
            akv_http_span tok = span_of(i, e);
            if (span_is(b, tok, "close"))
                seen->close = true;
            else if (span_is(b, tok, "keep-alive"))
                seen->keep_alive = true;
            i = j;
        }
    } else if (span_is(b, name, "expect")) {
        if (!span_is(b, val, "100-continue"))
            return fault_set(f, 417, "Expect: only 100-continue is understood");
        h->expect_continue = true;
    } else if (span_is(b, name, "authorization")) {
        if (h->has_authorization) return fault_set(f, 400, "more than one Authorization header");
        h->has_authorization = true;
        h->authorization = val;
    }
    return 0;
}

int akv_http_parse_head(const char *b, size_t n, size_t max_head_bytes, akv_http_head *h,
                        akv_http_fault *f) {
    memset(h, 0, sizeof *h);
    size_t scan = 0;
    size_t end = akv_http_head_end(b, n, 0, &scan);
    const size_t start = skip_empty_lines(b, n);
    if (!end || end > max_head_bytes) {
        if (!end && n <= max_head_bytes) return 0;
        /* too long: still on the request line, or among the headers */
        const size_t lim = n < max_head_bytes ? n : max_head_bytes;
        const char *lf = start < lim ? memchr(b + start, '\n', lim - start) : NULL;
        if (!lf)
            return fault_set(f, 414, "the request line is longer than %zu bytes", max_head_bytes);
        return fault_set(f, 431, "the request head is longer than %zu bytes", max_head_bytes);
    }
    size_t at = start, le;
    if (head_line(b, end, &at, &le, f) || parse_request_line(b, start, le, h, f)) return -1;
    head_seen seen = {0};
    for (;;) {
        const size_t l0 = at;
        if (head_line(b, end, &at, &le, f)) return -1;
        if (le == l0) break; /* the empty line: the head's end */
        if (is_ows((unsigned char)b[l0]))
            return fault_set(f, 400,
                             "obsolete line folding (a header line starting with a "
                             "space or a tab) is refused");
        if (++h->n_headers > AKV_HTTP_MAX_HEADERS)
            return fault_set(f, 431, "more than %d header lines", AKV_HTTP_MAX_HEADERS);
        size_t i = l0;
        while (i < le && is_tchar((unsigned char)b[i]))
            i++;
        if (i == l0 || i >= le || b[i] != ':') {
            if (i > l0 && i < le && is_ows((unsigned char)b[i]))
                return fault_set(f, 400, "whitespace between a header's name and its colon");
            return fault_set(f, 400, "a header line is not 'Name: value'");
        }
        const akv_http_span name = span_of(l0, i);
        size_t v0 = i + 1, v1 = le;
        while (v0 < v1 && is_ows((unsigned char)b[v0]))
            v0++;
        while (v1 > v0 && is_ows((unsigned char)b[v1 - 1]))
            v1--;
        for (size_t k = v0; k < v1; k++)
            if (!is_field_byte((unsigned char)b[k]))
                return fault_set(f, 400, "a header value holds a control byte");
        if (take_header(b, name, v0, v1, h, &seen, f)) return -1;
    }
    /* HTTP/1.1 keeps the connection unless told "close"; 1.0 closes it unless "keep-alive" */
    h->keep_alive = !seen.close && (h->minor == 1 || seen.keep_alive);
    if (seen.cl && seen.te)
        return fault_set(f, 400, "Content-Length and Transfer-Encoding together are refused");
    if (seen.te && h->minor == 0)
        return fault_set(f, 400, "Transfer-Encoding in an HTTP/1.0 request is refused");
    if (h->minor == 1 && seen.n_host != 1)
        return fault_set(f, 400,
                         seen.n_host ? "more than one Host header"
                                     : "an HTTP/1.1 request needs a Host header");
    if (h->minor == 0) h->expect_continue = false; /* HTTP/1.0 clients cannot expect it */
    h->framing = seen.te   ? AKV_HTTP_BODY_CHUNKED
                 : seen.cl ? AKV_HTTP_BODY_LENGTH
                           : AKV_HTTP_BODY_NONE;
    h->n_bytes = end;
    return 1;
}

/* ---- chunked bodies -------------------------------------------------------------------------- */

enum {
    CH_SIZE = 0, /* the size's hex digits (none read yet when n_digits == 0) */
    CH_EXT,      /* after the size: whitespace and extensions up to the line end */
    CH_SIZE_LF,  /* a CR ended the size line: its LF */
    CH_DATA,     /* `left` data bytes */
    CH_DATA_CR,  /* the CRLF after the data */
    CH_DATA_LF,
    CH_TRAILER,         /* the start of a trailer line, or of the final empty line */
    CH_TRAILER_LINE,    /* inside a trailer field line */
    CH_TRAILER_LINE_LF, /* a CR ended a trailer field line: its LF */
    CH_END_LF,          /* a CR began the final empty line: its LF */
};

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool is_ctl(unsigned char c) {
    return (c < 0x20 && c != '\t') || c == 0x7F;
}

static akv_http_chunk_result chunk_fault(akv_http_fault *f, const char *what) {
    fault_set(f, 400, "malformed chunked body: %s", what);
    return AKV_HTTP_CHUNK_ERROR;
}

/* The size line ended: the chunk's data next, or the trailer after the last chunk. */
static void chunk_size_line_end(akv_http_chunked *c) {
    c->n_digits = 0;
    c->n_line = 0;
    c->state = c->left ? CH_DATA : CH_TRAILER;
}

/* A malformed body at in[i]: what was consumed, and why (inside akv_http_chunked_feed). */
#define CHUNK_FAIL(what)                                                                           \
    do {                                                                                           \
        *used = i + 1;                                                                             \
        return chunk_fault(f, what);                                                               \
    } while (0)

akv_http_chunk_result akv_http_chunked_feed(akv_http_chunked *c, const char *in, size_t n,
                                            size_t *used, const char **data, size_t *n_data,
                                            akv_http_fault *f) {
    *data = NULL, *n_data = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char ch = (unsigned char)in[i];
        /* chunk lines and the trailer section are bounded (the data is the caller's to bound) */
        if (c->state != CH_DATA && c->state != CH_DATA_CR && c->state != CH_DATA_LF &&
            ++c->n_line > (c->state >= CH_TRAILER ? AKV_HTTP_MAX_TRAILER : AKV_HTTP_MAX_CHUNK_LINE))
            CHUNK_FAIL(c->state >= CH_TRAILER ? "a trailer section over 4096 bytes"
                                              : "a chunk line over 4096 bytes");
        switch (c->state) {
        case CH_SIZE: {
            const int v = hexval(ch);
            if (v >= 0) {
                if (c->n_digits == 15) CHUNK_FAIL("a chunk size over 2^60");
                c->left = c->left * 16 + (uint64_t)v;
                c->n_digits++;
            } else if (c->n_digits == 0) {
                CHUNK_FAIL("a chunk line without a hex size");
            } else if (ch == ';' || is_ows(ch)) {
                c->state = CH_EXT;
            } else if (ch == '\r') {
                c->state = CH_SIZE_LF;
            } else if (ch == '\n') {
                chunk_size_line_end(c);
            } else {
                CHUNK_FAIL("a byte after the chunk size that is not ';' or CRLF");
            }
            break;
        }
        case CH_EXT:
            if (ch == '\r')
                c->state = CH_SIZE_LF;
            else if (ch == '\n')
                chunk_size_line_end(c);
            else if (is_ctl(ch))
                CHUNK_FAIL("a control byte in a chunk extension");
            break;
        case CH_SIZE_LF:
            if (ch != '\n') CHUNK_FAIL("a CR not followed by LF in a chunk line");
            chunk_size_line_end(c);
            break;
        case CH_DATA: {
            const size_t k = n - i < c->left ? n - i : (size_t)c->left;
            c->left -= k;
            if (!c->left) c->state = CH_DATA_CR;
            *data = in + i, *n_data = k;
            *used = i + k;
            return AKV_HTTP_CHUNK_DATA;
        }
        case CH_DATA_CR:
            if (ch == '\r')
                c->state = CH_DATA_LF;
            else if (ch == '\n')
                c->state = CH_SIZE;
            else
                CHUNK_FAIL("chunk data not followed by CRLF");
            break;
        case CH_DATA_LF:
            if (ch != '\n') CHUNK_FAIL("chunk data not followed by CRLF");
            c->state = CH_SIZE;
            break;
        case CH_TRAILER:
            if (ch == '\n') {
                *used = i + 1;
                return AKV_HTTP_CHUNK_DONE;
            }
            if (ch == '\r')
                c->state = CH_END_LF;
            else if (is_ctl(ch))
                CHUNK_FAIL("a control byte in the trailer");
            else
                c->state = CH_TRAILER_LINE;
            break;
        case CH_TRAILER_LINE:
            if (ch == '\n')
                c->state = CH_TRAILER;
            else if (ch == '\r')
                c->state = CH_TRAILER_LINE_LF;
            else if (is_ctl(ch))
                CHUNK_FAIL("a control byte in the trailer");
            break;
        case CH_TRAILER_LINE_LF:
            if (ch != '\n') CHUNK_FAIL("a CR not followed by LF in the trailer");
            c->state = CH_TRAILER;
            break;
        case CH_END_LF:
            if (ch != '\n') CHUNK_FAIL("a CR not followed by LF in the trailer");
            *used = i + 1;
            return AKV_HTTP_CHUNK_DONE;
        default:
            CHUNK_FAIL("the decoder's state is corrupt");
        }
    }
    *used = n;
    return AKV_HTTP_CHUNK_MORE;
}
#undef CHUNK_FAIL

const char *akv_http_reason(int status) {
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 417:
        return "Expectation Failed";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Unknown";
    }
}
