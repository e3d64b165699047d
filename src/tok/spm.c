/* spm.c — the SentencePiece-style loop (tok/spm.h). */
#include "tok/spm.h"

#include <string.h>

#include "core/alloc.h"
#include "tok/tok_impl.h"

typedef struct akv__spm_sym {
    uint32_t off, n;     /* bytes of the escaped text; n = 0: joined into its left neighbour */
    int32_t prev, next;  /* neighbours alive, -1 at the ends */
} spm_sym;

typedef struct akv__spm_pair {
    float score;         /* the joined text's token's */
    int32_t left, right; /* symbols */
    uint32_t size;       /* bytes of the joined text when pushed (stale when it differs) */
} spm_pair;

void akv__spm_scratch_free(akv__spm_scratch *sc) {
    akv__free(sc->text);
    akv__free(sc->sym);
    akv__free(sc->heap);
    memset(sc, 0, sizeof *sc);
}

/* a before b: higher score, then the leftmost */
static bool pair_first(const spm_pair *a, const spm_pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static akv_status heap_push(akv__spm_scratch *sc, spm_pair p) {
    akv_status st = akv__array_reserve((void **)&sc->heap, &sc->cap_heap, sc->n_heap + 1, sizeof *sc->heap);
    if (st) return st;
    size_t i = sc->n_heap++;
    while (i > 0) {
        const size_t up = (i - 1) / 2;
        if (!pair_first(&p, &sc->heap[up])) break;
        sc->heap[i] = sc->heap[up];
        i = up;
    }
    sc->heap[i] = p;
    return AKV_OK;
}

static spm_pair heap_pop(akv__spm_scratch *sc) {
    const spm_pair top = sc->heap[0], last = sc->heap[--sc->n_heap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= sc->n_heap) break;
        if (c + 1 < sc->n_heap && pair_first(&sc->heap[c + 1], &sc->heap[c])) c++;
        if (!pair_first(&sc->heap[c], &last)) break;
        sc->heap[i] = sc->heap[c];
        i = c;
    }
    if (sc->n_heap) sc->heap[i] = last;
    return top;
}

/* Pushes (l, r) when their joined text is a token. */
static akv_status try_pair(const akv_tok *tok, akv__spm_scratch *sc, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return AKV_OK;
    const spm_sym *a = &sc->sym[l], *b = &sc->sym[r];
    const size_t n = (size_t)a->n + b->n;
    if (n > tok->max_text_bytes) return AKV_OK;
    const int32_t id = akv_tok_find(tok, (const char *)sc->text + a->off, n);
    if (id < 0) return AKV_OK;
    return heap_push(sc, (spm_pair){tok->scores[id], l, r, (uint32_t)n});
}

/* Bytes of the UTF-8 character led by byte b (valid input: its real length). */
static uint32_t lead_len(uint8_t b) {
    return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

akv_status akv__spm_encode(const akv_tok *tok, const uint8_t *s, size_t n, bool space_prefix,
                           akv__spm_scratch *sc, akv__spm_emit_fn emit, void *ctx) {
    static const uint8_t space[3] = {0xE2, 0x96, 0x81}; /* U+2581 */
    if (n == 0) return AKV_OK;
    size_t cap;
    if (!akv__size_mul(n + 1, 3, &cap) || cap > UINT32_MAX) return AKV_EOVERFLOW;
    akv_status st = akv__array_reserve((void **)&sc->text, &sc->cap_text, cap, 1);
    if (st) return st;
    size_t m = 0;
    if (space_prefix) memcpy(sc->text, space, 3), m = 3;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') memcpy(sc->text + m, space, 3), m += 3;
        else sc->text[m++] = s[i];
    }
    /* one symbol a character */
    if ((st = akv__array_reserve((void **)&sc->sym, &sc->cap_sym, m, sizeof *sc->sym))) return st;
    int32_t k = 0;
    for (size_t i = 0; i < m; k++) {
        uint32_t len = lead_len(sc->text[i]);
        if (len > m - i) len = (uint32_t)(m - i);
        sc->sym[k] = (spm_sym){(uint32_t)i, len, k - 1, -1};
        if (k > 0) sc->sym[k - 1].next = k;
        i += len;
    }
    sc->n_heap = 0;
    for (int32_t i = 1; i < k; i++)
        if ((st = try_pair(tok, sc, i - 1, i))) return st;
    while (sc->n_heap) {
        const spm_pair p = heap_pop(sc);
        spm_sym *l = &sc->sym[p.left], *r = &sc->sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sc->sym[r->next].prev = p.left;
        if ((st = try_pair(tok, sc, l->prev, p.left)) || (st = try_pair(tok, sc, p.left, l->next)))
            return st;
    }
    for (int32_t i = 0; i != -1; i = sc->sym[i].next) {
        const spm_sym *y = &sc->sym[i];
        const int32_t id = akv_tok_find(tok, (const char *)sc->text + y->off, y->n);
        if (id >= 0) {
            if ((st = emit(ctx, id))) return st;
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++) { /* byte fallback; a byte without a token is dropped */
            const int32_t b = tok->byte_token[sc->text[y->off + j]];
            if (b >= 0 && (st = emit(ctx, b))) return st;
        }
    }
    return AKV_OK;
}
