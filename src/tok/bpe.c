/* bpe.c — merge table and merge loop (see bpe.h). */
#include "tok/bpe.h"

#include <string.h>

#include "core/alloc.h"
#include "core/assert.h"

/* A symbol of the word being merged: a doubly linked list over the word's original byte
 * positions. Merged-away symbols are unlinked; a byte without a token stays as id -1 and
 * never merges. */
typedef struct akv__bpe_sym {
    int32_t id;   /* token id; -1: a byte without a token, or merged into its left neighbour */
    int32_t prev; /* index of the previous live symbol, -1 at the start */
    int32_t next; /* index of the next live symbol, -1 at the end */
} akv__bpe_sym;

/* A candidate merge of live neighbours left/right, valid while their ids are still a/b. */
typedef struct akv__bpe_pair {
    int32_t rank;
    int32_t left, right; /* symbol indices */
    int32_t a, b;        /* their ids when the pair was pushed */
    int32_t result;
} akv__bpe_pair;

static size_t bpe_hash(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

akv_status akv__bpe_merges_init(akv__bpe_merges *m, size_t n_max) {
    size_t cap = 16, want;
    if (!akv__size_mul(n_max, 2, &want)) return AKV_EOVERFLOW;
    while (cap < want) {
        if (!akv__size_mul(cap, 2, &cap)) return AKV_EOVERFLOW;
    }
    size_t n_bytes;
    if (!akv__size_mul(cap, sizeof(akv__bpe_slot), &n_bytes)) return AKV_EOVERFLOW;
    akv__bpe_slot *slots = akv__malloc(n_bytes);
    if (!slots) return AKV_ENOMEM;
    for (size_t i = 0; i < cap; i++)
        slots[i].key = UINT64_MAX;
    m->slots = slots;
    m->mask = cap - 1;
    m->n = 0;
    return AKV_OK;
}

void akv__bpe_merges_deinit(akv__bpe_merges *m) {
    akv__free(m->slots);
    memset(m, 0, sizeof *m);
}

bool akv__bpe_merges_add(akv__bpe_merges *m, int32_t a, int32_t b, int32_t rank, int32_t result) {
    AKV_ASSERT(a >= 0 && b >= 0 && m->n < m->mask);
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = bpe_hash(key, m->mask);; i = (i + 1) & m->mask) {
        if (m->slots[i].key == key) return false;
        if (m->slots[i].key == UINT64_MAX) {
            m->slots[i] = (akv__bpe_slot){.key = key, .rank = rank, .result = result};
            m->n++;
            return true;
        }
    }
}

bool akv__bpe_merges_find(const akv__bpe_merges *m, int32_t a, int32_t b, int32_t *rank,
                          int32_t *result) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = bpe_hash(key, m->mask);; i = (i + 1) & m->mask) {
        const akv__bpe_slot *s = &m->slots[i];
        if (s->key == key) {
            *rank = s->rank;
            *result = s->result;
            return true;
        }
        if (s->key == UINT64_MAX) return false;
    }
}

void akv__bpe_scratch_free(akv__bpe_scratch *sc) {
    akv__free(sc->syms);
    akv__free(sc->heap);
    memset(sc, 0, sizeof *sc);
}

/* Heap order: lower rank first, then the leftmost pair. */
static bool bpe_before(const akv__bpe_pair *x, const akv__bpe_pair *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

static void bpe_heap_push(akv__bpe_pair *h, size_t *n, akv__bpe_pair p) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bpe_before(&p, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = p;
}

static akv__bpe_pair bpe_heap_pop(akv__bpe_pair *h, size_t *n) {
    akv__bpe_pair top = h[0], last = h[--*n];
    size_t i = 0, len = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= len) break;
        if (c + 1 < len && bpe_before(&h[c + 1], &h[c])) c++;
        if (!bpe_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (len > 0) h[i] = last;
    return top;
}

/* Pushes the pair (left, right) when both exist, are tokens and have a merge. */
static void bpe_consider(const akv__bpe_merges *m, const akv__bpe_sym *syms, int32_t left,
                         int32_t right, akv__bpe_pair *heap, size_t *n_heap) {
    if (left < 0 || right < 0 || syms[left].id < 0 || syms[right].id < 0) return;
    akv__bpe_pair p = {.left = left, .right = right, .a = syms[left].id, .b = syms[right].id};
    if (akv__bpe_merges_find(m, p.a, p.b, &p.rank, &p.result)) bpe_heap_push(heap, n_heap, p);
}

akv_status akv__bpe_word(const akv__bpe_merges *m, const int32_t byte_token[256], const uint8_t *w,
                         size_t n, akv__bpe_scratch *sc, akv_tok_ids *out) {
    AKV_ASSERT(n >= 1);
    akv_status st;
    if (n > INT32_MAX) return AKV_EOVERFLOW;
    /* The heap never holds more than one pair per merge performed plus the initial n - 1:
     * each merge pushes at most two and pops at least one, so 2n bounds it. */
    if ((st = akv__array_reserve((void **)&sc->syms, &sc->cap_syms, n, sizeof *sc->syms)) ||
        (st = akv__array_reserve((void **)&sc->heap, &sc->cap_heap, 2 * n, sizeof *sc->heap)))
        return st;
    akv__bpe_sym *syms = sc->syms;
    akv__bpe_pair *heap = sc->heap;
    size_t n_heap = 0;

    /* 1. One symbol per byte. */
    for (size_t i = 0; i < n; i++) {
        syms[i] = (akv__bpe_sym){.id = byte_token[w[i]],
                                 .prev = (int32_t)i - 1,
                                 .next = i + 1 < n ? (int32_t)i + 1 : -1};
    }
    /* 2. Every adjacent pair that has a merge. */
    for (size_t i = 0; i + 1 < n; i++)
        bpe_consider(m, syms, (int32_t)i, (int32_t)i + 1, heap, &n_heap);

    /* 3. Merge best-first; stale pairs are recognised by their ids and links. */
    while (n_heap > 0) {
        akv__bpe_pair p = bpe_heap_pop(heap, &n_heap);
        akv__bpe_sym *l = &syms[p.left], *r = &syms[p.right];
        if (l->id != p.a || l->next != p.right || r->id != p.b) continue;
        l->id = p.result;
        l->next = r->next;
        if (r->next >= 0) syms[r->next].prev = p.left;
        r->id = -1; /* unlinked: no pair can name it again */
        AKV_ASSERT(n_heap + 2 <= sc->cap_heap);
        bpe_consider(m, syms, l->prev, p.left, heap, &n_heap);
        bpe_consider(m, syms, p.left, l->next, heap, &n_heap);
    }

    /* 4. The live symbols, in order (a byte without a token is dropped). */
    size_t n_out = 0;
    for (int32_t i = 0; i >= 0; i = syms[i].next)
        n_out += syms[i].id >= 0;
    size_t need;
    if (!akv__size_add(out->n_ids, n_out, &need)) return AKV_EOVERFLOW;
    if ((st = akv__array_reserve((void **)&out->ids, &out->cap, need, sizeof *out->ids))) return st;
    for (int32_t i = 0; i >= 0; i = syms[i].next)
        if (syms[i].id >= 0) out->ids[out->n_ids++] = syms[i].id;
    return AKV_OK;
}
