/* mask.c — a constrained answer's token mask (mask.h). */
#include "engine/mask.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

typedef struct vocab_entry {
    const uint8_t *p;
    size_t n;
    int32_t id;
} vocab_entry;

static int vocab_cmp(const void *a, const void *b) {
    const vocab_entry *x = a, *y = b;
    const size_t n = x->n < y->n ? x->n : y->n;
    const int c = n ? memcmp(x->p, y->p, n) : 0;
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1; /* a prefix first */
    return x->id < y->id ? -1 : x->id > y->id;
}

static const uint8_t *vocab_piece(const akv__vocab *v, int32_t id, size_t *n) {
    *n = 0;
    const uint8_t *p = v->piece(v->user, id, n);
    if (!p) *n = 0;
    return p;
}

/* Trie levels walked with a state copy per node; below them each piece is fed its rest from
 * its node's state (a copy a piece, as the reference does, but the walk has already refused
 * every piece under a refused prefix). */
enum { MASK_TRIE_DEPTH = 3 };

/* Appends the children of node k (at depth d) and, below MASK_TRIE_DEPTH, theirs. */
static akv_status vocab_children(akv__vocab *v, uint32_t k, uint32_t d, uint32_t *cap) {
    akv__vocab_node nd = v->nodes[k];
    uint32_t i = nd.lo;
    while (i < nd.hi && v->len[i] <= d) i++;
    nd.end = i;
    nd.child = v->n_nodes, nd.n_child = 0;
    while (i < nd.hi) {
        const uint8_t c = v->bytes[i][d];
        uint32_t j = i + 1;
        while (j < nd.hi && v->bytes[j][d] == c) j++;
        if (v->n_nodes == *cap) {
            size_t c2 = *cap;
            akv_status st = akv__array_reserve((void **)&v->nodes, &c2, (size_t)*cap * 2, sizeof *v->nodes);
            if (st) return st;
            *cap = (uint32_t)c2;
        }
        v->nodes[v->n_nodes++] = (akv__vocab_node){.lo = i, .end = i, .hi = j, .byte = c};
        nd.n_child++;
        i = j;
    }
    v->nodes[k] = nd;
    for (uint32_t c = 0; d + 1 < MASK_TRIE_DEPTH && c < nd.n_child; c++) {
        akv_status st = vocab_children(v, nd.child + c, d + 1, cap);
        if (st) return st;
    }
    if (d + 1 == MASK_TRIE_DEPTH) /* the deepest level: only where its pieces end */
        for (uint32_t c = 0; c < nd.n_child; c++) {
            akv__vocab_node *ch = &v->nodes[nd.child + c];
            uint32_t e = ch->lo;
            while (e < ch->hi && v->len[e] <= d + 1) e++;
            ch->end = e;
        }
    return AKV_OK;
}

akv_status akv__vocab_order(akv__vocab *v) {
    vocab_entry *e = akv__malloc((size_t)v->n_vocab * sizeof *e);
    v->order = akv__malloc((size_t)v->n_vocab * sizeof *v->order);
    v->bytes = akv__malloc((size_t)v->n_vocab * sizeof *v->bytes);
    v->len = akv__malloc((size_t)v->n_vocab * sizeof *v->len);
    uint32_t cap = 1024;
    v->nodes = akv__malloc(cap * sizeof *v->nodes);
    v->n_nodes = 0;
    akv_status st = e && v->order && v->bytes && v->len && v->nodes ? AKV_OK : AKV_ENOMEM;
    for (uint32_t i = 0; !st && i < v->n_vocab; i++) {
        e[i].id = (int32_t)i;
        e[i].p = vocab_piece(v, (int32_t)i, &e[i].n);
        if (e[i].n > UINT32_MAX) e[i].n = 0; /* never a piece */
    }
    if (!st) {
        qsort(e, v->n_vocab, sizeof *e, vocab_cmp);
        for (uint32_t i = 0; i < v->n_vocab; i++)
            v->order[i] = e[i].id, v->bytes[i] = e[i].p, v->len[i] = (uint32_t)e[i].n;
        v->nodes[v->n_nodes++] = (akv__vocab_node){.lo = 0, .end = 0, .hi = v->n_vocab};
        st = vocab_children(v, 0, 0, &cap);
    }
    akv__free(e);
    if (st) akv__vocab_free(v);
    return st;
}

void akv__vocab_free(akv__vocab *v) {
    akv__free(v->order), akv__free(v->bytes), akv__free(v->len), akv__free(v->nodes);
    v->order = NULL, v->bytes = NULL, v->len = NULL, v->nodes = NULL, v->n_nodes = 0;
}

uint32_t akv__mask_ref(const akv__mask_machine *m, const void *state, const akv__vocab *v,
                       uint64_t *bits) {
    memset(bits, 0, (size_t)(v->n_vocab + 63) / 64 * sizeof *bits);
    uint8_t *q = akv__malloc(m->size);
    if (!q) return 0;
    uint32_t n_set = 0;
    for (uint32_t id = 0; id < v->n_vocab; id++) {
        size_t n;
        const uint8_t *p = vocab_piece(v, (int32_t)id, &n);
        if (!n) continue;
        memcpy(q, state, m->size);
        if (m->feed(q, p, n)) bits[id / 64] |= 1ull << (id % 64), n_set++;
    }
    akv__free(q);
    return n_set;
}

typedef struct mask_walk {
    const akv__mask_machine *m;
    const akv__vocab *v;
    uint64_t *bits;
    uint8_t *states; /* [MASK_TRIE_DEPTH + 2][m->size]: one per level, and the per-piece copy */
    uint32_t n_set;
} mask_walk;

static void mask_set(mask_walk *w, uint32_t at) {
    const uint32_t id = (uint32_t)w->v->order[at];
    w->bits[id / 64] |= 1ull << (id % 64);
    w->n_set++;
}

/* Node k at depth d, whose path took the machine to level d's state. */
static void mask_node(mask_walk *w, uint32_t k, uint32_t d) {
    const akv__vocab *v = w->v;
    const akv__vocab_node *nd = &v->nodes[k];
    const size_t S = w->m->size;
    const uint8_t *state = w->states + d * S;
    for (uint32_t i = nd->lo; d && i < nd->end; i++)
        if (v->len[i]) mask_set(w, i); /* its bytes were all fed */
    uint8_t *next = w->states + (d + 1) * S;
    if (d == MASK_TRIE_DEPTH) {
        for (uint32_t i = nd->end; i < nd->hi; i++) {
            memcpy(next, state, S);
            if (w->m->feed(next, v->bytes[i] + d, v->len[i] - d)) mask_set(w, i);
        }
        return;
    }
    for (uint32_t c = 0; c < nd->n_child; c++) {
        const akv__vocab_node *ch = &v->nodes[nd->child + c];
        memcpy(next, state, S);
        if (w->m->feed(next, &ch->byte, 1)) mask_node(w, nd->child + c, d + 1);
    }
}

uint32_t akv__mask_fill(const akv__mask_machine *m, const void *state, const akv__vocab *v,
                        uint64_t *bits) {
    memset(bits, 0, (size_t)(v->n_vocab + 63) / 64 * sizeof *bits);
    mask_walk w = {.m = m, .v = v, .bits = bits};
    if (!v->order || !(w.states = akv__malloc((MASK_TRIE_DEPTH + 2) * m->size)))
        return akv__mask_ref(m, state, v, bits);
    memcpy(w.states, state, m->size);
    mask_node(&w, 0, 0);
    akv__free(w.states);
    return w.n_set;
}

akv_status akv__mask_cache_init(akv__mask_cache *c, uint32_t n_vocab, size_t key_bytes) {
    memset(c, 0, sizeof *c);
    c->n_words = (n_vocab + 63) / 64, c->key_bytes = key_bytes;
    c->keys = akv__calloc(AKV__MASK_CACHE, key_bytes);
    c->bits = akv__calloc((size_t)AKV__MASK_CACHE * c->n_words, sizeof *c->bits);
    c->used = akv__calloc(AKV__MASK_CACHE, sizeof *c->used);
    if (c->keys && c->bits && c->used) return AKV_OK;
    akv__mask_cache_free(c);
    return AKV_ENOMEM;
}

void akv__mask_cache_free(akv__mask_cache *c) {
    akv__free(c->keys), akv__free(c->bits), akv__free(c->used);
    memset(c, 0, sizeof *c);
}

const uint64_t *akv__mask_get(akv__mask_cache *c, const akv__mask_machine *m, const void *state,
                              const akv__vocab *v) {
    uint32_t victim = 0;
    c->clock++;
    for (uint32_t k = 0; k < AKV__MASK_CACHE; k++) {
        if (c->used[k] && !memcmp(c->keys + k * c->key_bytes, state, c->key_bytes)) {
            c->used[k] = c->clock;
            c->hits++;
            return c->bits + (size_t)k * c->n_words;
        }
        if (c->used[k] < c->used[victim]) victim = k;
    }
    c->misses++;
    uint64_t *bits = c->bits + (size_t)victim * c->n_words;
    memcpy(c->keys + victim * c->key_bytes, state, c->key_bytes);
    akv__mask_fill(m, state, v, bits);
    c->used[victim] = c->clock;
    return bits;
}
