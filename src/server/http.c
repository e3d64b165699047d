/* http.c — the server's HTTP/1.1 connections (server/http.h): the I/O thread's accept, read,
 * frame and write loop over epoll, the deadlines, the connection limits, and a handler
 * thread's calls on the connection it owns. */
#define _GNU_SOURCE
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"

enum {
    READ_PIECE = 65536, /* bytes asked of one recv */
    MAX_EVENTS = 64,
};
static const double LINGER_S = 2.0;              /* an ending connection's late bytes are dropped */
static const double OVERFLOW_HEAD_S = 2.0;       /* an overflow connection's head, at most */
static const char STATUS_PREFIX[] = "HTTP/1.1 "; /* every answer starts so: the probe */

/* A connection's state: who owns it and what it waits for. */
enum {
    C_READ = 0, /* I/O thread: reading a request (or idle between two) */
    C_WRITE,    /* I/O thread: writing an answer */
    C_LINGER,   /* I/O thread: answer sent, writing side shut, dropping late bytes */
    C_HANDLER,  /* a handler thread owns it */
    C_CLOSED,   /* closed; freed at the end of the I/O thread's batch (callers up the stack may
                   still hold it: every loop over a connection stops on this state) */
};

struct akv_http_conn {
    akv_http *h;
    int fd;
    int state;
    int overflow;        /* 0, or the status it is refused with (503 full, 429 its address) */
    uint8_t addr[17];    /* its client address: a family byte, then 4 or 16 bytes */
    double deadline;     /* when the current state times out (akv_clock_s) */
    double req_deadline; /* C_READ: when the request under way must be in */
    bool fresh;          /* no request has started on it yet */
    bool got_byte;       /* a byte of the current request has arrived */
    bool unparsed;       /* c->in holds bytes of a next request not yet framed */
    /* the request being read: its head, its body */
    char *in; /* received bytes not yet taken: the head, body bytes, the next
                 request's first bytes (pipelining) */
    size_t n_in, cap_in, scan;
    bool have_head;
    akv_http_head head;
    char *strs; /* method, path and authorization, NUL-terminated, one block */
    char *body;
    size_t n_body, cap_body;
    uint64_t body_left; /* Content-Length bytes still to come */
    akv_http_chunked chunked;
    akv_http_request rq;
    bool peer_eof;    /* the client shut its writing side */
    bool close_after; /* the connection ends after the answer */
    /* an answer the I/O thread writes */
    char *out;
    size_t n_out, off_out;
    /* a handler thread's answer */
    size_t prefix_sent; /* bytes of STATUS_PREFIX a probe sent already */
    bool started, streaming, chunked_out, answered, failed;
    const char *probe;
    /* under h->mu: what akv_http_stop reads from its own thread */
    bool handled;               /* a handler thread owns it (state C_HANDLER) */
    akv_http_conn *prev, *next; /* every connection */
    akv_http_conn *ret_next;    /* handed back by a handler; the dead list, once closed */
};

typedef struct addr_slot {
    uint8_t key[17];
    uint32_t count; /* 0 = empty */
} addr_slot;

struct akv_http {
    akv_http_params p;
    int lfd, epfd, wakefd;
    uint16_t port;
    pthread_t io;
    bool io_started;
    uint32_t overflow_cap; /* overflow connections at once; past it, a 503 and close */
    /* I/O thread only */
    uint32_t n_normal, n_overflow;
    addr_slot *tally; /* connections per client address (normal ones) */
    size_t tally_mask;
    double next_check;    /* no deadline is due before this */
    double accept_resume; /* accept paused until then (out of file descriptors); 0 = not */
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    akv_http_conn *conns;
    akv_http_conn *returned;
    akv_http_conn *dead; /* closed this batch, to free (I/O thread only) */
    uint32_t n_handlers;
    bool close_listener_req, listener_closed, exit_req, stopped;
    akv_http_stats st;
};

/* ---- small things ------------------------------------------------------------------------- */

static void wake(akv_http *h) {
    uint64_t one = 1;
    ssize_t k = write(h->wakefd, &one, sizeof one);
    (void)k; /* a full counter still wakes the loop */
}

static void set_deadline(akv_http *h, akv_http_conn *c, double t) {
    c->deadline = t;
    if (t < h->next_check) h->next_check = t;
}

static void epoll_set(akv_http *h, akv_http_conn *c, uint32_t events, int op) {
    struct epoll_event ev = {.events = events, .data.ptr = c};
    if (epoll_ctl(h->epfd, op, c->fd, &ev) != 0 && op != EPOLL_CTL_DEL)
        AKV_LOG_W("server: epoll_ctl on a connection: %s", strerror(errno));
}

/* ---- the per-address tally (linear probing, backward-shift deletion) ---------------------- */

static size_t addr_hash(const uint8_t *k) {
    uint64_t x = 1469598103934665603ull;
    for (int i = 0; i < 17; i++)
        x = (x ^ k[i]) * 1099511628211ull;
    return (size_t)(x ^ (x >> 29));
}

static addr_slot *tally_find(akv_http *h, const uint8_t *key) {
    for (size_t i = addr_hash(key) & h->tally_mask;; i = (i + 1) & h->tally_mask)
        if (!h->tally[i].count || !memcmp(h->tally[i].key, key, 17)) return &h->tally[i];
}

static uint32_t tally_count(akv_http *h, const uint8_t *key) {
    return tally_find(h, key)->count;
}

static void tally_add(akv_http *h, const uint8_t *key) {
    addr_slot *s = tally_find(h, key);
    if (!s->count) memcpy(s->key, key, 17);
    s->count++;
}

static void tally_remove(akv_http *h, const uint8_t *key) {
    addr_slot *s = tally_find(h, key);
    if (!s->count || --s->count) return;
    /* the slot is empty now: shift later members of its cluster back over it */
    size_t hole = (size_t)(s - h->tally);
    for (size_t j = (hole + 1) & h->tally_mask; h->tally[j].count; j = (j + 1) & h->tally_mask) {
        size_t home = addr_hash(h->tally[j].key) & h->tally_mask;
        /* j's entry may move to the hole when its home is not inside (hole, j] */
        bool stays = hole < j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (stays) continue;
        h->tally[hole] = h->tally[j];
        h->tally[j].count = 0;
        hole = j;
    }
}

static void addr_key(const struct sockaddr_storage *ss, uint8_t key[17]) {
    memset(key, 0, 17);
    if (ss->ss_family == AF_INET) {
        key[0] = 4;
        memcpy(key + 1, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    } else if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) {
            key[0] = 4;
            memcpy(key + 1, a->s6_addr + 12, 4);
        } else {
            key[0] = 6;
            memcpy(key + 1, a->s6_addr, 16);
        }
    }
}

/* ---- answers ---------------------------------------------------------------------------- */

/* The status line and headers of an answer into buf[cap]; its length. length < 0: no
 * Content-Length (a stream: chunked when `chunked`, else closed at its end). */
static size_t head_format(char *buf, size_t cap, int status, const char *ctype, long long length,
                          bool chunked, bool close, bool keep_alive_10,
                          const akv_http_response *r) {
    int n = snprintf(buf, cap, "%s%d %s\r\nContent-Type: %s\r\n", STATUS_PREFIX, status,
                     akv_http_reason(status), ctype ? ctype : "application/json");
    size_t k = (size_t)n;
#define PUT(...) (k += (size_t)snprintf(buf + k, k < cap ? cap - k : 0, __VA_ARGS__))
    if (length >= 0)
        PUT("Content-Length: %lld\r\n", length);
    else if (chunked)
        PUT("Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n");
    else
        PUT("Cache-Control: no-cache\r\n");
    if (close)
        PUT("Connection: close\r\n");
    else if (keep_alive_10)
        PUT("Connection: keep-alive\r\n");
    if (r && r->retry_after_s) PUT("Retry-After: %u\r\n", r->retry_after_s);
    if (r && r->www_authenticate) PUT("WWW-Authenticate: Bearer\r\n");
    if (r && r->allow) PUT("Allow: %s\r\n", r->allow);
    PUT("\r\n");
#undef PUT
    AKV_ASSERT(k < cap);
    return k;
}

/* Whether the connection ends after this answer. */
static bool ends_after(const akv_http_conn *c, const akv_http_response *r) {
    return (r && r->close) || !c->have_head || !c->head.keep_alive || c->overflow || c->peer_eof;
}

/* The whole answer as bytes (the body dropped for HEAD); takes r->body. NULL: no memory. */
static char *answer_bytes(akv_http_conn *c, akv_http_response *r, bool close, size_t *n) {
    char head[640];
    const bool keep_10 = !close && c->have_head && c->head.minor == 0;
    size_t nh = head_format(head, sizeof head, r->status, r->content_type, (long long)r->n_body,
                            false, close, keep_10, r);
    const bool body = !(c->have_head && c->head.method == AKV_HTTP_HEAD);
    char *b = akv__malloc(nh + (body ? r->n_body : 0) + 1);
    if (b) {
        memcpy(b, head, nh);
        if (body && r->n_body) memcpy(b + nh, r->body, r->n_body);
        *n = nh + (body ? r->n_body : 0);
    }
    akv__free(r->body);
    r->body = NULL;
    return b;
}

/* ---- closing ------------------------------------------------------------------------------- */

static void request_reset(akv_http_conn *c) {
    akv__free(c->strs);
    akv__free(c->body);
    c->strs = c->body = NULL;
    c->n_body = c->cap_body = 0;
    c->have_head = false;
    c->scan = 0;
    c->body_left = 0;
    memset(&c->chunked, 0, sizeof c->chunked);
    memset(&c->rq, 0, sizeof c->rq);
    c->got_byte = c->n_in > 0;
    c->prefix_sent = 0;
    c->started = c->streaming = c->chunked_out = c->answered = c->failed = false;
    c->probe = NULL;
    c->fresh = false;
}

static void conn_free(akv_http_conn *c) {
    akv__free(c->in);
    akv__free(c->strs);
    akv__free(c->body);
    akv__free(c->out);
    akv__free(c);
}

/* I/O thread: closes a connection it owns; it is freed with the batch's dead. */
static void conn_close(akv_http *h, akv_http_conn *c) {
    AKV_ASSERT(c->state != C_CLOSED);
    epoll_set(h, c, 0, EPOLL_CTL_DEL);
    close(c->fd);
    if (c->overflow)
        h->n_overflow--;
    else
        h->n_normal--, tally_remove(h, c->addr);
    pthread_mutex_lock(&h->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    h->st.open--;
    c->state = C_CLOSED;
    c->handled = false;
    pthread_mutex_unlock(&h->mu);
    c->ret_next = h->dead;
    h->dead = c;
}

static void free_dead(akv_http *h) {
    for (akv_http_conn *c = h->dead, *n; c; c = n) {
        n = c->ret_next;
        conn_free(c);
    }
    h->dead = NULL;
}

/* ---- the I/O thread's answers ------------------------------------------------------------ */

static void conn_writable(akv_http *h, akv_http_conn *c);
static void conn_advance(akv_http *h, akv_http_conn *c);

/* Queues an answer (takes r->body) and starts writing it. */
static void conn_respond(akv_http *h, akv_http_conn *c, akv_http_response *r) {
    c->close_after = ends_after(c, r);
    akv__free(c->out);
    c->out = answer_bytes(c, r, c->close_after, &c->n_out);
    c->off_out = 0;
    if (!c->out) {
        conn_close(h, c);
        return;
    }
    c->state = C_WRITE;
    set_deadline(h, c, akv_clock_s() + h->p.idle_timeout_s);
    epoll_set(h, c, EPOLLOUT, EPOLL_CTL_MOD);
    conn_writable(h, c);
}

/* A refusal the layer decides: its body from on_fault; the connection closes after it. */
static void conn_fault(akv_http *h, akv_http_conn *c, int status, const char *message) {
    akv_http_response r = {.status = status, .close = true};
    h->p.h.on_fault(h->p.h.user, status, message, &r);
    conn_respond(h, c, &r);
}

static void conn_linger(akv_http *h, akv_http_conn *c) {
    shutdown(c->fd, SHUT_WR);
    c->state = C_LINGER;
    set_deadline(h, c, akv_clock_s() + LINGER_S);
    epoll_set(h, c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
}

/* Ready for the connection's next request. Bytes of it already in c->in (pipelined) are
 * framed by conn_readable's loop, not from here: answers never nest inside answers. */
static void conn_next_request(akv_http *h, akv_http_conn *c) {
    request_reset(c);
    c->state = C_READ;
    c->unparsed = c->n_in > 0;
    const double now = akv_clock_s();
    c->req_deadline = now + (c->got_byte ? h->p.read_timeout_s : h->p.idle_timeout_s);
    set_deadline(h, c,
                 c->got_byte ? fmin(c->req_deadline, now + h->p.idle_timeout_s) : c->req_deadline);
    epoll_set(h, c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
}

static void conn_writable(akv_http *h, akv_http_conn *c) {
    while (c->off_out < c->n_out) {
        ssize_t k = send(c->fd, c->out + c->off_out, c->n_out - c->off_out, MSG_NOSIGNAL);
        if (k > 0) {
            c->off_out += (size_t)k;
            set_deadline(h, c, akv_clock_s() + h->p.idle_timeout_s);
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        conn_close(h, c); /* the client is gone */
        return;
    }
    akv__free(c->out);
    c->out = NULL;
    c->n_out = c->off_out = 0;
    if (c->close_after)
        conn_linger(h, c);
    else
        conn_next_request(h, c);
}

/* ---- reading a request ------------------------------------------------------------------- */

static void *handler_main(void *arg);

/* The whole request is in: answered here or handed to a thread. */
static void conn_dispatch(akv_http *h, akv_http_conn *c) {
    c->rq.body = c->body, c->rq.n_body = c->n_body;
    akv_http_response r = {0};
    if (h->p.h.on_request(h->p.h.user, &c->rq, &r) != AKV_HTTP_DETACH) {
        conn_respond(h, c, &r);
        return;
    }
    epoll_set(h, c, 0, EPOLL_CTL_DEL);
    pthread_mutex_lock(&h->mu);
    c->state = C_HANDLER;
    c->handled = true;
    h->n_handlers++;
    pthread_mutex_unlock(&h->mu);
    pthread_attr_t attr;
    pthread_t t;
    int e = pthread_attr_init(&attr);
    if (!e) e = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (!e) e = pthread_create(&t, &attr, handler_main, c);
    pthread_attr_destroy(&attr);
    if (!e) return;
    AKV_LOG_W("server: no thread for a request (error %d): answered 503", e);
    pthread_mutex_lock(&h->mu);
    c->state = C_WRITE;
    c->handled = false;
    h->n_handlers--;
    pthread_mutex_unlock(&h->mu);
    epoll_set(h, c, EPOLLOUT, EPOLL_CTL_ADD);
    conn_fault(h, c, 503, "the server has no thread for this request now; retry");
}

/* A body over max_body_bytes: 413, and the connection closes (the rest is not read). */
static void conn_too_large(akv_http *h, akv_http_conn *c) {
    char msg[96];
    snprintf(msg, sizeof msg, "the body is over the server's limit of %zu bytes ({=max_body_bytes})",
             h->p.max_body_bytes);
    conn_fault(h, c, 413, msg);
}

/* A message the framing rules refuse: counted, answered, closed. */
static void conn_bad_framing(akv_http *h, akv_http_conn *c, const akv_http_fault *f) {
    pthread_mutex_lock(&h->mu);
    h->st.bad_framing++;
    pthread_mutex_unlock(&h->mu);
    conn_fault(h, c, f->status, f->message);
}

/* The head is in c->in[0..head.n_bytes): its strings, the handlers' first word, the body.
 * true: read the body; false: the request was answered (the connection may already be on to
 * its next request, or closed) and the caller must not touch it further. */
static bool conn_take_head(akv_http *h, akv_http_conn *c) {
    const akv_http_head *hd = &c->head;
    const size_t auth = hd->has_authorization ? hd->authorization.len + 1 : 0;
    char *s = akv__malloc(hd->method_name.len + 1 + hd->path.len + 1 + hd->query.len + 1 + auth);
    if (!s) {
        conn_close(h, c);
        return false;
    }
    c->strs = s;
    memcpy(s, c->in + hd->method_name.off, hd->method_name.len);
    s[hd->method_name.len] = '\0';
    char *path = s + hd->method_name.len + 1;
    memcpy(path, c->in + hd->path.off, hd->path.len);
    path[hd->path.len] = '\0';
    char *query = path + hd->path.len + 1;
    memcpy(query, c->in + hd->query.off, hd->query.len);
    query[hd->query.len] = '\0';
    char *a = NULL;
    if (auth) {
        a = query + hd->query.len + 1;
        memcpy(a, c->in + hd->authorization.off, hd->authorization.len);
        a[hd->authorization.len] = '\0';
    }
    c->rq = (akv_http_request){.method = hd->method,
                               .method_name = s,
                               .path = path,
                               .query = query,
                               .authorization = a,
                               .minor = hd->minor,
                               .overflow = c->overflow};
    c->n_in -= hd->n_bytes;
    memmove(c->in, c->in + hd->n_bytes, c->n_in);
    c->have_head = true; /* the answers below know its method and whether it keeps alive */
    akv_http_response r = {0};
    if (h->p.h.on_head(h->p.h.user, &c->rq, &r) == AKV_HTTP_ANSWER) {
        if (hd->framing != AKV_HTTP_BODY_NONE) r.close = true; /* its body is not read */
        conn_respond(h, c, &r);
        return false;
    }
    if (hd->framing == AKV_HTTP_BODY_LENGTH && hd->content_length > h->p.max_body_bytes) {
        conn_too_large(h, c);
        return false;
    }
    if (hd->framing == AKV_HTTP_BODY_LENGTH) {
        c->body_left = hd->content_length;
        c->cap_body = (size_t)hd->content_length + 1;
        if (!(c->body = akv__malloc(c->cap_body))) {
            conn_fault(h, c, 503, "out of memory for the body");
            return false;
        }
    }
    if (hd->expect_continue && hd->framing != AKV_HTTP_BODY_NONE && !c->n_in) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        ssize_t k = send(c->fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)k; /* a client that does not read it sends its body after a wait anyway */
    }
    return true;
}

/* Appends body bytes; false (answered 413 or 503) when the body cannot take them. */
static bool body_append(akv_http *h, akv_http_conn *c, const char *p, size_t n) {
    if (c->n_body + n > h->p.max_body_bytes) {
        conn_too_large(h, c);
        return false;
    }
    if (akv__array_reserve((void **)&c->body, &c->cap_body, c->n_body + n + 1, 1)) {
        conn_fault(h, c, 503, "out of memory for the body");
        return false;
    }
    memcpy(c->body + c->n_body, p, n);
    c->n_body += n;
    c->body[c->n_body] = '\0';
    return true;
}

/* Frames what c->in holds: the head, then the body; dispatches a whole request. */
static void conn_advance(akv_http *h, akv_http_conn *c) {
    if (!c->have_head) {
        const size_t end = akv_http_head_end(c->in, c->n_in, c->scan, &c->scan);
        if (!end && c->n_in <= h->p.max_head_bytes) return;
        akv_http_fault f;
        int r = akv_http_parse_head(c->in, c->n_in, h->p.max_head_bytes, &c->head, &f);
        if (r == 0) return;
        if (r < 0) {
            conn_bad_framing(h, c, &f);
            return;
        }
        if (!conn_take_head(h, c)) return; /* answered, or closed */
    }
    size_t used = 0;
    bool done = false;
    switch (c->head.framing) {
    case AKV_HTTP_BODY_NONE:
        done = true;
        break;
    case AKV_HTTP_BODY_LENGTH: {
        used = c->n_in < c->body_left ? c->n_in : (size_t)c->body_left;
        memcpy(c->body + c->n_body, c->in, used);
        c->n_body += used;
        c->body[c->n_body] = '\0';
        c->body_left -= used;
        done = c->body_left == 0;
        break;
    }
    case AKV_HTTP_BODY_CHUNKED:
        while (used < c->n_in && !done) {
            size_t k, n_data;
            const char *data;
            akv_http_fault f;
            akv_http_chunk_result r = akv_http_chunked_feed(&c->chunked, c->in + used,
                                                            c->n_in - used, &k, &data, &n_data, &f);
            used += k;
            if (r == AKV_HTTP_CHUNK_ERROR) {
                conn_bad_framing(h, c, &f);
                return;
            }
            if (r == AKV_HTTP_CHUNK_DATA && !body_append(h, c, data, n_data)) return;
            done = r == AKV_HTTP_CHUNK_DONE;
        }
        break;
    }
    c->n_in -= used;
    memmove(c->in, c->in + used, c->n_in);
    if (done) conn_dispatch(h, c);
}

static void conn_readable(akv_http *h, akv_http_conn *c) {
    while (c->state == C_READ || c->state == C_LINGER) {
        if (c->state == C_READ && c->unparsed) { /* a pipelined request's bytes first */
            c->unparsed = false;
            conn_advance(h, c);
            continue;
        }
        if (c->state == C_LINGER) { /* drop late bytes until the client closes */
            char sink[4096];
            ssize_t k = recv(c->fd, sink, sizeof sink, 0);
            if (k > 0) continue;
            if (k < 0 && errno == EINTR) continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            conn_close(h, c);
            return;
        }
        if (akv__array_reserve((void **)&c->in, &c->cap_in, c->n_in + READ_PIECE, 1)) {
            conn_close(h, c);
            return;
        }
        ssize_t k = recv(c->fd, c->in + c->n_in, READ_PIECE, 0);
        if (k > 0) {
            /* the request must be in by req_deadline, and bytes must keep coming */
            const double now = akv_clock_s();
            if (!c->got_byte && !c->fresh) /* a kept-alive connection's next request */
                c->req_deadline = now + h->p.read_timeout_s;
            c->got_byte = true;
            set_deadline(h, c, fmin(c->req_deadline, now + h->p.idle_timeout_s));
            c->n_in += (size_t)k;
            conn_advance(h, c);
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        /* the client closed or reset before a whole request: nothing to answer */
        conn_close(h, c);
        return;
    }
}

/* ---- accepting ----------------------------------------------------------------------------- */

/* A connection past the overflow cap: a 503 sent once without waiting, then closed. */
static void refuse_at_once(akv_http *h, int fd) {
    akv_http_response r = {.status = 503, .retry_after_s = 1, .close = true};
    h->p.h.on_fault(h->p.h.user, 503, "the server is full ({=max_connections}); retry", &r);
    char head[640];
    size_t nh = head_format(head, sizeof head, 503, r.content_type, (long long)r.n_body, false,
                            true, false, &r);
    struct iovec iov[2] = {{head, nh}, {r.body, r.n_body}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = r.body ? 2 : 1};
    ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)k;
    akv__free(r.body);
    shutdown(fd, SHUT_WR);
    close(fd);
    pthread_mutex_lock(&h->mu);
    h->st.refused++;
    pthread_mutex_unlock(&h->mu);
}

static void accept_all(akv_http *h) {
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(h->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* no descriptor for it: stop accepting for a moment (the backlog waits) */
                AKV_LOG_W("server: accept: %s; pausing new connections for 0.1 s", strerror(errno));
                epoll_ctl(h->epfd, EPOLL_CTL_DEL, h->lfd, NULL);
                h->accept_resume = akv_clock_s() + 0.1;
                if (h->accept_resume < h->next_check) h->next_check = h->accept_resume;
            }
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* streamed tokens */
        uint8_t key[17];
        addr_key(&ss, key);
        const double now = akv_clock_s();
        int overflow = 0;
        if (h->n_normal >= h->p.max_connections)
            overflow = 503;
        else if (tally_count(h, key) >= h->p.max_per_client)
            overflow = 429;
        if (overflow && h->n_overflow >= h->overflow_cap) {
            refuse_at_once(h, fd);
            continue;
        }
        akv_http_conn *c = akv__calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->h = h, c->fd = fd, c->state = C_READ, c->overflow = overflow, c->fresh = true;
        memcpy(c->addr, key, 17);
        if (overflow)
            h->n_overflow++;
        else
            h->n_normal++, tally_add(h, key);
        pthread_mutex_lock(&h->mu);
        c->next = h->conns;
        if (h->conns) h->conns->prev = c;
        h->conns = c;
        h->st.accepted++;
        h->st.open++;
        if (overflow) h->st.overflow++;
        pthread_mutex_unlock(&h->mu);
        const double limit =
            overflow ? fmin(h->p.read_timeout_s, OVERFLOW_HEAD_S) : h->p.read_timeout_s;
        c->req_deadline = now + limit;
        set_deadline(h, c, fmin(c->req_deadline, now + h->p.idle_timeout_s));
        epoll_set(h, c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
    }
}

/* ---- deadlines ----------------------------------------------------------------------------- */

static void conn_expire(akv_http *h, akv_http_conn *c, double now) {
    if (c->state == C_READ && c->got_byte && !c->overflow) {
        pthread_mutex_lock(&h->mu);
        h->st.read_timeouts++;
        pthread_mutex_unlock(&h->mu);
        char msg[128];
        if (now >= c->req_deadline)
            snprintf(msg, sizeof msg, "the request did not arrive within %g s ({=read_timeout_s})",
                     h->p.read_timeout_s);
        else
            snprintf(msg, sizeof msg, "no byte of the request came for %g s ({=idle_timeout_s})",
                     h->p.idle_timeout_s);
        conn_fault(h, c, 408, msg);
        return;
    }
    conn_close(h, c); /* idle, silent, overflow past its moment, a stalled reader, linger over */
}

static void check_deadlines(akv_http *h, double now) {
    if (now < h->next_check) return;
    if (h->accept_resume && now >= h->accept_resume && h->lfd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &h->lfd};
        epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->lfd, &ev);
        h->accept_resume = 0;
    }
    double next = now + 3600;
    for (akv_http_conn *c = h->conns, *n; c; c = n) {
        n = c->next; /* the I/O thread alone changes the list, so no lock to read it */
        if (c->state == C_HANDLER) continue;
        if (c->deadline <= now) {
            conn_expire(h, c, now);
            continue;
        }
        if (c->deadline < next) next = c->deadline;
    }
    /* conn_expire may have set deadlines (a 408 to write): keep the earliest */
    for (akv_http_conn *c = h->conns; c; c = c->next)
        if (c->state != C_HANDLER && c->deadline < next) next = c->deadline;
    if (h->accept_resume && h->accept_resume < next) next = h->accept_resume;
    h->next_check = next;
}

/* ---- handed back by a handler -------------------------------------------------------------- */

static void conn_returned(akv_http *h, akv_http_conn *c) {
    pthread_mutex_lock(&h->mu);
    c->state = C_WRITE; /* the I/O thread's again */
    c->handled = false;
    pthread_mutex_unlock(&h->mu);
    const bool whole = c->answered && !c->failed;
    if (!whole) {
        conn_close(h, c);
        return;
    }
    epoll_set(h, c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
    if (c->close_after) {
        conn_linger(h, c);
        return;
    }
    conn_next_request(h, c);
    if (c->unparsed) conn_readable(h, c);
}

static void *handler_main(void *arg) {
    akv_http_conn *c = arg;
    akv_http *h = c->h;
    h->p.h.on_run(h->p.h.user, c, &c->rq);
    pthread_mutex_lock(&h->mu);
    c->ret_next = h->returned;
    h->returned = c;
    wake(h);
    h->n_handlers--;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---- the I/O thread ------------------------------------------------------------------------ */

static void *io_main(void *arg) {
    akv_http *h = arg;
    struct epoll_event ev[MAX_EVENTS];
    for (;;) {
        double now = akv_clock_s();
        double wait = h->next_check - now;
        int ms = wait <= 0 ? 0 : wait > 1.0 ? 1000 : (int)ceil(wait * 1e3);
        int n = epoll_wait(h->epfd, ev, MAX_EVENTS, ms);
        if (n < 0 && errno != EINTR) {
            AKV_LOG_E("server: epoll_wait: %s", strerror(errno));
            break;
        }
        bool exit_now = false;
        for (int i = 0; i < n; i++) {
            void *tag = ev[i].data.ptr;
            if (tag == &h->lfd) {
                accept_all(h);
            } else if (tag == &h->wakefd) {
                uint64_t v;
                ssize_t k = read(h->wakefd, &v, sizeof v);
                (void)k;
                pthread_mutex_lock(&h->mu);
                akv_http_conn *back = h->returned;
                h->returned = NULL;
                if (h->close_listener_req && h->lfd >= 0) {
                    epoll_ctl(h->epfd, EPOLL_CTL_DEL, h->lfd, NULL);
                    close(h->lfd);
                    h->lfd = -1;
                    h->accept_resume = 0;
                    h->listener_closed = true;
                    pthread_cond_broadcast(&h->cv);
                }
                exit_now = h->exit_req;
                pthread_mutex_unlock(&h->mu);
                for (akv_http_conn *c = back, *nx; c; c = nx) {
                    nx = c->ret_next;
                    conn_returned(h, c);
                }
            } else {
                /* a connection is freed only while its own event is handled (or, at the wake,
                 * one a handler returned, which was outside the epoll set), and a batch holds
                 * one event per connection: no event of this batch names a freed one */
                akv_http_conn *c = tag;
                if (c->state == C_WRITE && (ev[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
                    conn_writable(h, c); /* done: C_READ, maybe with a pipelined request */
                if (c->state == C_READ || c->state == C_LINGER) conn_readable(h, c);
            }
        }
        check_deadlines(h, akv_clock_s());
        free_dead(h);
        if (exit_now) break;
    }
    return NULL;
}

/* ---- start and stop ------------------------------------------------------------------------ */

akv_status akv_http_start(const akv_http_params *p, akv_http **out) {
    akv_http *h = akv__calloc(1, sizeof *h);
    if (!h) return AKV_ENOMEM;
    h->p = *p;
    h->lfd = h->epfd = h->wakefd = -1;
    h->overflow_cap = p->max_connections / 4 > 16 ? p->max_connections / 4 : 16;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    akv_status st = AKV_ENOMEM;
    /* the tally: at least twice the connections it counts, a power of two */
    size_t slots = 64;
    while (slots < 2 * (size_t)p->max_connections + 2)
        slots *= 2;
    if (!(h->tally = akv__calloc(slots, sizeof *h->tally))) goto fail;
    h->tally_mask = slots - 1;
    char port[8];
    snprintf(port, sizeof port, "%u", (unsigned)p->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    int gai = getaddrinfo(p->host, port, &hints, &ai);
    if (gai || !ai) {
        AKV_LOG_E("server: the address '%s' (host): %s", p->host, gai_strerror(gai));
        st = AKV_EINVAL;
        goto fail;
    }
    h->lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (h->lfd >= 0) setsockopt(h->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (h->lfd < 0 || bind(h->lfd, ai->ai_addr, ai->ai_addrlen) || listen(h->lfd, 1024)) {
        AKV_LOG_E("server: cannot listen on %s:%u: %s", p->host, (unsigned)p->port,
                  strerror(errno));
        freeaddrinfo(ai);
        st = AKV_EIO;
        goto fail;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(h->lfd, (struct sockaddr *)&ss, &sl);
    h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    h->epfd = epoll_create1(EPOLL_CLOEXEC);
    h->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (h->epfd < 0 || h->wakefd < 0) {
        AKV_LOG_E("server: epoll or eventfd: %s", strerror(errno));
        st = AKV_EIO;
        goto fail;
    }
    struct epoll_event le = {.events = EPOLLIN, .data.ptr = &h->lfd};
    struct epoll_event we = {.events = EPOLLIN, .data.ptr = &h->wakefd};
    if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->lfd, &le) ||
        epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->wakefd, &we)) {
        AKV_LOG_E("server: epoll_ctl: %s", strerror(errno));
        st = AKV_EIO;
        goto fail;
    }
    h->next_check = akv_clock_s() + 3600;
    if (pthread_create(&h->io, NULL, io_main, h)) {
        AKV_LOG_E("server: cannot start the I/O thread");
        goto fail;
    }
    h->io_started = true;
    *out = h;
    return AKV_OK;
fail:
    akv_http_destroy(h);
    return st;
}

uint16_t akv_http_port(const akv_http *h) {
    return h->port;
}

void akv_http_get_stats(akv_http *h, akv_http_stats *out) {
    pthread_mutex_lock(&h->mu);
    *out = h->st;
    pthread_mutex_unlock(&h->mu);
}

void akv_http_close_listener(akv_http *h) {
    pthread_mutex_lock(&h->mu);
    if (!h->io_started) {
        if (h->lfd >= 0) close(h->lfd);
        h->lfd = -1;
    } else {
        h->close_listener_req = true;
        wake(h);
        while (!h->listener_closed)
            pthread_cond_wait(&h->cv, &h->mu);
    }
    pthread_mutex_unlock(&h->mu);
}

void akv_http_stop(akv_http *h, double flush_s) {
    if (!h || h->stopped) return;
    h->stopped = true;
    if (!h->io_started) return;
    akv_http_close_listener(h);
    const struct timespec until = akv_clock_deadline(flush_s);
    pthread_mutex_lock(&h->mu);
    while (h->n_handlers && pthread_cond_timedwait(&h->cv, &h->mu, &until) != ETIMEDOUT) {
    }
    /* the rest write to clients that do not read, or wait on them: cut their sockets, so
     * every send and wait of theirs fails at once */
    for (akv_http_conn *c = h->conns; c; c = c->next)
        if (c->handled) shutdown(c->fd, SHUT_RDWR);
    while (h->n_handlers)
        pthread_cond_wait(&h->cv, &h->mu);
    h->exit_req = true;
    wake(h);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->io, NULL);
    h->io_started = false;
    /* the I/O thread is gone: the connections are ours to close */
    for (akv_http_conn *c = h->returned, *n; c; c = n) {
        n = c->ret_next;
        c->state = C_WRITE, c->handled = false;
    }
    h->returned = NULL;
    while (h->conns)
        conn_close(h, h->conns);
    free_dead(h);
}

void akv_http_destroy(akv_http *h) {
    if (!h) return;
    akv_http_stop(h, 0);
    if (h->lfd >= 0) close(h->lfd);
    if (h->epfd >= 0) close(h->epfd);
    if (h->wakefd >= 0) close(h->wakefd);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    akv__free(h->tally);
    akv__free(h);
}

/* ---- a handler thread's calls ---------------------------------------------------------------- */

/* Sends every byte or fails: the client gone, or no progress for idle_timeout_s. */
static int conn_send_all(akv_http_conn *c, const char *p, size_t n) {
    if (c->failed) return -1;
    const int stall_ms = (int)ceil(c->h->p.idle_timeout_s * 1e3);
    while (n) {
        ssize_t k = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p += k, n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
            int r = poll(&pf, 1, stall_ms);
            if (r < 0 && errno == EINTR) continue;
            if (r > 0 && !(pf.revents & (POLLERR | POLLHUP | POLLNVAL))) continue;
        }
        c->failed = true;
        return -1;
    }
    return 0;
}

/* The answer's head, less what a probe sent of it already. */
static int conn_send_head(akv_http_conn *c, const char *head, size_t n) {
    const size_t skip = c->prefix_sent;
    c->started = true;
    return conn_send_all(c, head + skip, n - skip);
}

int akv_http_conn_send(akv_http_conn *c, akv_http_response *r) {
    c->close_after = ends_after(c, r);
    size_t n;
    char *b = answer_bytes(c, r, c->close_after, &n);
    if (!b) {
        c->failed = true;
        return -1;
    }
    int rc = conn_send_head(c, b, n);
    akv__free(b);
    c->answered = rc == 0;
    return rc;
}

int akv_http_conn_stream_begin(akv_http_conn *c, int status, const char *content_type,
                               const char *probe) {
    c->chunked_out = c->head.minor == 1;
    c->close_after = ends_after(c, NULL) || !c->chunked_out;
    c->streaming = true;
    c->probe = probe;
    char head[640];
    size_t n = head_format(head, sizeof head, status, content_type, -1, c->chunked_out,
                           c->close_after, false, NULL);
    return conn_send_head(c, head, n);
}

int akv_http_conn_stream_write(akv_http_conn *c, const char *data, size_t n) {
    if (!n) return c->failed ? -1 : 0;
    if (!c->chunked_out) return conn_send_all(c, data, n);
    char small[4096], size[24];
    int ns = snprintf(size, sizeof size, "%zx\r\n", n);
    const size_t total = (size_t)ns + n + 2;
    char *b = total <= sizeof small ? small : akv__malloc(total);
    if (!b) {
        c->failed = true;
        return -1;
    }
    memcpy(b, size, (size_t)ns);
    memcpy(b + ns, data, n);
    memcpy(b + ns + n, "\r\n", 2);
    int rc = conn_send_all(c, b, total);
    if (b != small) akv__free(b);
    return rc;
}

int akv_http_conn_stream_end(akv_http_conn *c) {
    int rc = c->chunked_out ? conn_send_all(c, "0\r\n\r\n", 5) : (c->failed ? -1 : 0);
    c->answered = rc == 0;
    return rc;
}

/* The client shut its writing side: sends the first bytes of the answer (see server/http.h),
 * which a client that has gone altogether answers with a reset. */
static int conn_probe(akv_http_conn *c) {
    if (!c->started) {
        if (c->prefix_sent) return 0;
        if (conn_send_all(c, STATUS_PREFIX, sizeof STATUS_PREFIX - 1)) return -1;
        c->prefix_sent = sizeof STATUS_PREFIX - 1;
        return 0;
    }
    if (c->streaming && c->probe) return akv_http_conn_stream_write(c, c->probe, strlen(c->probe));
    return 0;
}

int akv_http_conn_wait(akv_http_conn *c, int efd, double deadline) {
    for (;;) {
        if (c->failed) return -1;
        double left = deadline - akv_clock_s();
        if (left <= 0) return 0;
        struct pollfd fds[2] = {{.fd = efd, .events = POLLIN},
                                {.fd = c->fd, .events = c->peer_eof ? 0 : POLLRDHUP}};
        int ms = left > 3600 ? 3600000 : (int)ceil(left * 1e3);
        int k = poll(fds, 2, ms);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (fds[1].revents & (POLLERR | POLLHUP | POLLNVAL)) {
            c->failed = true;
            return -1;
        }
        if (fds[1].revents & POLLRDHUP) {
            c->peer_eof = true;
            if (conn_probe(c)) return -1;
        }
        if (fds[0].revents & POLLIN) {
            uint64_t v;
            ssize_t n = read(efd, &v, sizeof v);
            (void)n;
            return 1;
        }
    }
}
