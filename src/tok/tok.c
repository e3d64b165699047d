/* tok.c — the vocabulary, encode, decode and streaming decode (see akv/tok.h). */
#include "akv/tok.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "tok/bpe.h"
#include "tok/pretok.h"
#include "tok/spm.h"
#include "tok/tok_impl.h"
#include "tok/utf8.h"

/* ---- byte-level alphabet --------------------------------------------------------------- */

/* GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for themselves, the other 68
 * bytes take U+0100.. in byte order. */
static bool tok_byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static void tok_byte_alphabet(uint32_t byte_cp[256]) {
    uint32_t next = 256;
    for (unsigned b = 0; b < 256; b++)
        byte_cp[b] = tok_byte_is_printable(b) ? b : next++;
}

/* ---- text -> id map ---------------------------------------------------------------------- */

static uint64_t tok_hash(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static const char *tok_text(const akv_tok *tok, int32_t id, size_t *n_bytes) {
    size_t off = tok->text_off[id];
    *n_bytes = tok->text_off[id + 1] - off - 1; /* minus the NUL */
    return tok->text + off;
}

int32_t akv_tok_find(const akv_tok *tok, const char *text, size_t n_bytes) {
    for (size_t i = tok_hash(text, n_bytes) & tok->map_mask;; i = (i + 1) & tok->map_mask) {
        int32_t id = tok->map[i];
        if (id < 0) return -1;
        size_t n;
        const char *t = tok_text(tok, id, &n);
        if (n == n_bytes && memcmp(t, text, n) == 0) return id;
    }
}

/* Inserts id unless its text is already there; false on a duplicate. */
static bool tok_map_insert(akv_tok *tok, int32_t id) {
    size_t n;
    const char *t = tok_text(tok, id, &n);
    for (size_t i = tok_hash(t, n) & tok->map_mask;; i = (i + 1) & tok->map_mask) {
        if (tok->map[i] < 0) {
            tok->map[i] = id;
            return true;
        }
        size_t n2;
        const char *t2 = tok_text(tok, tok->map[i], &n2);
        if (n2 == n && memcmp(t2, t, n) == 0) return false;
    }
}

/* ---- creation ---------------------------------------------------------------------------- */

akv_tok_params akv_tok_default_params(void) {
    return (akv_tok_params){
        .pre = AKV_TOK_PRE_GPT2,
        .bos_id = -1,
        .eos_id = -1,
        .eot_id = -1,
        .unk_id = -1,
        .pad_id = -1,
    };
}

static bool tok_is_special_type(uint8_t type) {
    return type == AKV_TOK_TYPE_CONTROL || type == AKV_TOK_TYPE_USER_DEFINED ||
           type == AKV_TOK_TYPE_UNKNOWN;
}

static size_t tok_param_len(const char *const *strs, const size_t *lens, size_t i) {
    return lens ? lens[i] : strlen(strs[i]);
}

static akv_status tok_check_params(const akv_tok_params *p) {
    if (p->n_tokens == 0 || p->n_tokens > INT32_MAX || !p->tokens) {
        AKV_LOG_E("tokenizer: %zu tokens%s; need 1 .. %d", p->n_tokens,
                  p->tokens ? "" : " (tokens array missing)", INT32_MAX);
        return AKV_EINVAL;
    }
    if (p->n_merges > 0 && !p->merges) {
        AKV_LOG_E("tokenizer: %zu merges but no merges array", p->n_merges);
        return AKV_EINVAL;
    }
    if (p->n_merges > INT32_MAX) {
        AKV_LOG_E("tokenizer: %zu merges; at most %d", p->n_merges, INT32_MAX);
        return AKV_EINVAL;
    }
    if (p->model != AKV_TOK_MODEL_BPE && p->model != AKV_TOK_MODEL_SPM) {
        AKV_LOG_E("tokenizer: model %d is not one of akv_tok_model", (int)p->model);
        return AKV_EINVAL;
    }
    if (p->model == AKV_TOK_MODEL_SPM) {
        if (!p->scores || p->n_merges) {
            AKV_LOG_E("tokenizer: an SPM vocabulary takes scores%s", p->n_merges ? " and no merges" : "");
            return AKV_EINVAL;
        }
        for (size_t i = 0; i < p->n_tokens; i++)
            if (!isfinite(p->scores[i])) {
                AKV_LOG_E("tokenizer: token %zu's score is not finite", i);
                return AKV_EFORMAT;
            }
    }
    if (!akv__pretok_pattern(p->pre, 0)) { /* a pre-tokenizer has at least one step */
        AKV_LOG_E("tokenizer: pre-tokenizer %d is not one of akv_tok_pre", (int)p->pre);
        return AKV_EINVAL;
    }
    const struct {
        const char *name;
        int32_t id;
    } ids[] = {{"bos", p->bos_id},
               {"eos", p->eos_id},
               {"eot", p->eot_id},
               {"unknown", p->unk_id},
               {"padding", p->pad_id}};
    for (size_t i = 0; i < AKV_ARRAY_LEN(ids); i++) {
        if (ids[i].id < -1 || ids[i].id >= (int64_t)p->n_tokens) {
            AKV_LOG_E("tokenizer: %s token id %d is not in [0, %zu) (or -1 for none)", ids[i].name,
                      ids[i].id, p->n_tokens);
            return AKV_EINVAL;
        }
    }
    if ((p->add_bos && p->bos_id < 0) || (p->add_eos && p->eos_id < 0)) {
        AKV_LOG_E("tokenizer: add_%s is set but there is no %s token id",
                  p->add_bos && p->bos_id < 0 ? "bos" : "eos",
                  p->add_bos && p->bos_id < 0 ? "bos" : "eos");
        return AKV_EINVAL;
    }
    return AKV_OK;
}

/* Copies the texts and types. */
static akv_status tok_load_texts(akv_tok *tok, const akv_tok_params *p) {
    size_t n = p->n_tokens, total = 0;
    if (!(tok->text_off = akv__calloc(n + 1, sizeof *tok->text_off)) ||
        !(tok->piece_off = akv__calloc(n + 1, sizeof *tok->piece_off)) ||
        !(tok->type = akv__calloc(n, 1)))
        return AKV_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (!p->tokens[i]) {
            AKV_LOG_E("tokenizer: token %zu has no text (NULL)", i);
            return AKV_EINVAL;
        }
        size_t len = tok_param_len(p->tokens, p->token_bytes, i);
        if (!akv__size_add(total, len + 1, &total)) return AKV_EOVERFLOW;
        if (len > tok->max_text_bytes) tok->max_text_bytes = len;
        int32_t type = p->token_types ? p->token_types[i] : AKV_TOK_TYPE_NORMAL;
        if (type < AKV_TOK_TYPE_UNDEFINED || type > AKV_TOK_TYPE_BYTE) {
            AKV_LOG_E("tokenizer: token %zu has type %d, which is not a GGUF token type (0..6)", i,
                      (int)type);
            return AKV_EFORMAT;
        }
        tok->type[i] = (uint8_t)type;
    }
    if (!(tok->text = akv__malloc(total)) || !(tok->piece = akv__malloc(total))) return AKV_ENOMEM;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = tok_param_len(p->tokens, p->token_bytes, i);
        tok->text_off[i] = off;
        memcpy(tok->text + off, p->tokens[i], len);
        tok->text[off + len] = '\0';
        off += len + 1;
    }
    tok->text_off[n] = off;
    return AKV_OK;
}

/* SPM pieces: U+2581 back to ' ' in normal tokens, a BYTE token <0xNN> its byte, special
 * tokens (and a BYTE token of another text) their text as it is. */
static int tok_hex(uint8_t c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static void tok_load_pieces_spm(akv_tok *tok) {
    size_t off = 0;
    for (size_t i = 0; i < tok->n_tokens; i++) {
        size_t n, len = 0;
        const uint8_t *t = (const uint8_t *)tok_text(tok, (int32_t)i, &n);
        uint8_t *dst = tok->piece + off;
        const uint8_t type = tok->type[i];
        if (type == AKV_TOK_TYPE_BYTE && n == 6 && !memcmp(t, "<0x", 3) && t[5] == '>' &&
            tok_hex(t[3]) >= 0 && tok_hex(t[4]) >= 0) {
            dst[len++] = (uint8_t)(tok_hex(t[3]) << 4 | tok_hex(t[4]));
        } else if (tok_is_special_type(type) || type == AKV_TOK_TYPE_BYTE) {
            memcpy(dst, t, n), len = n;
        } else {
            for (size_t j = 0; j < n;) {
                if (j + 3 <= n && t[j] == 0xE2 && t[j + 1] == 0x96 && t[j + 2] == 0x81)
                    dst[len++] = ' ', j += 3;
                else
                    dst[len++] = t[j++];
            }
        }
        tok->piece_off[i] = off;
        off += len;
        if (len > tok->max_piece_bytes) tok->max_piece_bytes = len;
    }
    tok->piece_off[tok->n_tokens] = off;
}

/* SPM byte fallback: the token whose text is <0xNN> whatever its type, else the one-byte text
 * (llama.cpp's byte_to_token); a byte with neither is dropped from the input. */
static void tok_load_bytes_spm(akv_tok *tok) {
    size_t n_missing = 0;
    for (unsigned b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        const char one = (char)b;
        int32_t id = akv_tok_find(tok, hex, 6);
        if (id < 0) id = akv_tok_find(tok, &one, 1);
        tok->byte_token[b] = id;
        n_missing += id < 0;
    }
    if (n_missing)
        AKV_LOG_I("tokenizer: %zu bytes have no byte-fallback token (<0xNN>) and are dropped "
                  "where no token covers them", n_missing);
}

/* Pieces: normal tokens map their byte-level characters back to bytes (never longer than
 * the text); special tokens, and a normal token that is not byte-level text, keep their
 * text as it is. */
static void tok_load_pieces(akv_tok *tok, const int16_t cp_byte[324]) {
    size_t off = 0, n_literal = 0;
    int32_t first_literal = -1;
    for (size_t i = 0; i < tok->n_tokens; i++) {
        size_t n;
        const uint8_t *t = (const uint8_t *)tok_text(tok, (int32_t)i, &n);
        uint8_t *dst = tok->piece + off;
        size_t len = 0;
        bool literal = tok_is_special_type(tok->type[i]);
        for (size_t j = 0; !literal && j < n;) {
            size_t cl;
            uint32_t cp;
            if (akv__utf8_next(t + j, n - j, &cl, &cp) != AKV__UTF8_VALID || cp >= 324 ||
                cp_byte[cp] < 0) {
                literal = true;
                if (first_literal < 0) first_literal = (int32_t)i;
                n_literal++;
                break;
            }
            dst[len++] = (uint8_t)cp_byte[cp];
            j += cl;
        }
        if (literal) {
            memcpy(dst, t, n);
            len = n;
        }
        tok->piece_off[i] = off;
        off += len;
        if (len > tok->max_piece_bytes) tok->max_piece_bytes = len;
    }
    tok->piece_off[tok->n_tokens] = off;
    if (n_literal > 0)
        AKV_LOG_W("tokenizer: %zu normal tokens are not byte-level text (the first is %d); "
                  "they decode to their text as written",
                  n_literal, first_literal);
}

static akv_status tok_load_map(akv_tok *tok) {
    size_t cap = 16;
    while (cap < 2 * tok->n_tokens)
        cap *= 2; /* n_tokens <= INT32_MAX: no overflow */
    if (!(tok->map = akv__malloc(cap * sizeof *tok->map))) return AKV_ENOMEM;
    memset(tok->map, 0xFF, cap * sizeof *tok->map); /* -1 everywhere */
    tok->map_mask = cap - 1;
    size_t n_dup = 0;
    int32_t first_dup = -1;
    for (size_t i = 0; i < tok->n_tokens; i++) {
        if (tok->text_off[i + 1] - tok->text_off[i] == 1) continue; /* empty text */
        if (!tok_map_insert(tok, (int32_t)i)) {
            if (first_dup < 0) first_dup = (int32_t)i;
            n_dup++;
        }
    }
    if (n_dup > 0)
        AKV_LOG_W("tokenizer: %zu tokens repeat an earlier token's text (the first is %d); "
                  "the text maps to the earlier id",
                  n_dup, first_dup);
    return AKV_OK;
}

/* Each byte's token. A vocabulary may lack some (SmolLM2 has none for 0x04, 0x06, 0x13, 0x14,
 * 0x16, 0x1D, nor for 0xF1, 0xF2 which lead code points U+40000..U+BFFFF): such a byte is
 * dropped from the input, as Hugging Face's BPE (with no unk_token) and llama.cpp do. The
 * unknown token is not used instead: for GGUF vocabularies it is often a control token such
 * as <|endoftext|>, which must not appear inside a prompt. */
static void tok_load_bytes(akv_tok *tok, const uint32_t byte_cp[256]) {
    char missing[256 * 5 + 1] = "";
    size_t n_missing = 0;
    for (unsigned b = 0; b < 256; b++) {
        uint8_t *bt = tok->byte_text[b];
        bt[0] = (uint8_t)akv__utf8_put(byte_cp[b], bt + 1);
        tok->byte_token[b] = akv_tok_find(tok, (const char *)bt + 1, bt[0]);
        if (tok->byte_token[b] < 0 && b != 0xC0 && b != 0xC1 && b < 0xF5) /* in valid UTF-8 */
            snprintf(missing + 5 * n_missing++, 6, " 0x%02X", b);
    }
    if (n_missing > 0)
        AKV_LOG_I("tokenizer: %zu bytes that UTF-8 text can hold have no token and are dropped "
                  "from the input:%s",
                  n_missing, missing);
}

static akv_status tok_load_merges(akv_tok *tok, const akv_tok_params *p) {
    akv_status st = akv__bpe_merges_init(&tok->merges, p->n_merges);
    if (st) return st;
    char *cat = akv__malloc(2 * tok->max_text_bytes + 1);
    if (!cat) return AKV_ENOMEM;
    for (size_t r = 0; r < p->n_merges; r++) {
        const char *m = p->merges[r];
        size_t len = m ? tok_param_len(p->merges, p->merge_bytes, r) : 0;
        /* "A B": the first space after the first byte splits it (a token may be a space). */
        const char *sp = len > 1 ? memchr(m + 1, ' ', len - 1) : NULL;
        int32_t a = -1, b = -1, ab = -1;
        size_t na = sp ? (size_t)(sp - m) : 0, nb = sp ? len - na - 1 : 0;
        if (sp && nb > 0) {
            a = akv_tok_find(tok, m, na);
            b = akv_tok_find(tok, sp + 1, nb);
        }
        if (a >= 0 && b >= 0) {
            memcpy(cat, m, na);
            memcpy(cat + na, sp + 1, nb);
            ab = akv_tok_find(tok, cat, na + nb);
        }
        if (ab < 0) {
            const char *why = !sp || nb == 0 ? "is not two token texts separated by a space"
                              : a < 0        ? "names a first token that is not in the vocabulary"
                              : b < 0        ? "names a second token that is not in the vocabulary"
                                             : "joins into a text that is not in the vocabulary";
            AKV_LOG_E("tokenizer: merge %zu '%.*s' %s", r, (int)(len > 80 ? 80 : len), m ? m : "",
                      why);
            akv__free(cat);
            return AKV_EFORMAT;
        }
        akv__bpe_merges_add(&tok->merges, a, b, (int32_t)r, ab); /* a repeat keeps rank */
    }
    akv__free(cat);
    return AKV_OK;
}

typedef struct tok_special_key {
    uint8_t first;
    size_t len;
    int32_t id;
} tok_special_key;

static int tok_special_cmp(const void *x, const void *y) {
    const tok_special_key *a = x, *b = y;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1; /* longest first */
    return a->id < b->id ? -1 : a->id > b->id;
}

/* The special tokens matched in the input, grouped by first byte, longest first. */
static akv_status tok_load_specials(akv_tok *tok) {
    size_t n = 0;
    for (size_t i = 0; i < tok->n_tokens; i++)
        n += tok_is_special_type(tok->type[i]);
    tok_special_key *keys = n ? akv__calloc(n, sizeof *keys) : NULL;
    if (n && (!keys || !(tok->special = akv__calloc(n, sizeof *tok->special)))) {
        akv__free(keys);
        return AKV_ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < tok->n_tokens; i++) {
        if (!tok_is_special_type(tok->type[i])) continue;
        size_t len;
        const char *t = tok_text(tok, (int32_t)i, &len);
        /* Matching only well-formed texts keeps every cut on a character boundary. */
        if (len == 0 || !akv__utf8_valid((const uint8_t *)t, len)) continue;
        keys[k++] = (tok_special_key){(uint8_t)t[0], len, (int32_t)i};
    }
    if (k) qsort(keys, k, sizeof *keys, tok_special_cmp);
    memset(tok->special_start, 0, sizeof tok->special_start);
    for (size_t i = 0; i < k; i++) {
        tok->special[i] = keys[i].id;
        tok->special_start[keys[i].first + 1]++;
    }
    for (int b = 0; b < 256; b++)
        tok->special_start[b + 1] += tok->special_start[b];
    tok->n_special = k;
    akv__free(keys);
    return AKV_OK;
}

akv_status akv_tok_create(const akv_tok_params *p, akv_tok **out) {
    AKV_ASSERT(p && out);
    akv_status st = tok_check_params(p);
    if (st) return st;
    akv_tok *tok = akv__calloc(1, sizeof *tok);
    if (!tok) return AKV_ENOMEM;
    tok->n_tokens = p->n_tokens;
    tok->pre = p->pre;
    tok->ignore_merges = p->pre == AKV_TOK_PRE_LLAMA3; /* Llama 3's "ignore_merges": true */
    tok->sp = (akv_tok_specials){.bos_id = p->bos_id,
                                 .eos_id = p->eos_id,
                                 .eot_id = p->eot_id,
                                 .unk_id = p->unk_id,
                                 .pad_id = p->pad_id,
                                 .add_bos = p->add_bos,
                                 .add_eos = p->add_eos};
    uint32_t byte_cp[256];
    int16_t cp_byte[324];
    tok_byte_alphabet(byte_cp);
    for (int c = 0; c < 324; c++)
        cp_byte[c] = -1;
    for (int b = 0; b < 256; b++)
        cp_byte[byte_cp[b]] = (int16_t)b;

    tok->model = p->model;
    tok->add_space_prefix = p->model == AKV_TOK_MODEL_SPM && p->add_space_prefix;
    if ((st = tok_load_texts(tok, p)) || (st = tok_load_map(tok))) goto fail;
    if (p->model == AKV_TOK_MODEL_SPM) {
        if (!(tok->scores = akv__malloc(p->n_tokens * sizeof *tok->scores))) {
            st = AKV_ENOMEM;
            goto fail;
        }
        memcpy(tok->scores, p->scores, p->n_tokens * sizeof *tok->scores);
        tok_load_pieces_spm(tok); /* byte_text stays empty: byte-level texts are BPE's */
        tok_load_bytes_spm(tok);
    } else {
        tok_load_pieces(tok, cp_byte);
        tok_load_bytes(tok, byte_cp);
    }
    if ((st = tok_load_merges(tok, p)) || (st = tok_load_specials(tok)) ||
        (st = akv__pretok_create(p->pre, &tok->pretok)))
        goto fail;
    AKV_ASSERT(akv__tok_check(tok));
    *out = tok;
    return AKV_OK;
fail:
    akv_tok_destroy(tok);
    return st;
}

void akv_tok_destroy(akv_tok *tok) {
    if (!tok) return;
    akv__pretok_destroy(tok->pretok);
    akv__bpe_merges_deinit(&tok->merges);
    akv__free(tok->special);
    akv__free(tok->map);
    akv__free(tok->piece);
    akv__free(tok->piece_off);
    akv__free(tok->text);
    akv__free(tok->text_off);
    akv__free(tok->type);
    akv__free(tok->scores);
    akv__free(tok);
}

bool akv__tok_check(const akv_tok *tok) {
    if (!tok || tok->n_tokens == 0 || tok->n_tokens > INT32_MAX) return false;
    /* A byte's token (if any) has that byte's text; every text maps to itself or to an
     * earlier duplicate. */
    for (int b = 0; b < 256; b++) {
        int32_t id = tok->byte_token[b];
        if (id < -1 || id >= (int32_t)tok->n_tokens) return false;
        size_t n;
        if (id >= 0 && tok->model == AKV_TOK_MODEL_BPE &&
            (tok_text(tok, id, &n), n != tok->byte_text[b][0]))
            return false;
        if (id >= 0 && tok->model == AKV_TOK_MODEL_SPM && tok->type[id] == AKV_TOK_TYPE_BYTE &&
            (tok->piece_off[id + 1] - tok->piece_off[id] != 1 || tok->piece[tok->piece_off[id]] != b))
            return false; /* SPM: a BYTE token's piece is its byte (a <0xNN> of another type
                             decodes as its text, as in llama.cpp) */
    }
    if ((tok->model == AKV_TOK_MODEL_SPM) != (tok->scores != NULL)) return false;
    for (size_t i = 0; i < tok->n_tokens; i++) {
        size_t n;
        const char *t = tok_text(tok, (int32_t)i, &n);
        if (t[n] != '\0' || tok->piece_off[i + 1] < tok->piece_off[i]) return false;
        if (n == 0) continue;
        int32_t id = akv_tok_find(tok, t, n);
        if (id < 0 || id > (int32_t)i) return false;
    }
    /* Every merge joins two tokens into the token of their joined text. */
    for (size_t i = 0; i <= tok->merges.mask; i++) {
        const akv__bpe_slot *s = &tok->merges.slots[i];
        if (s->key == UINT64_MAX) continue;
        int32_t a = (int32_t)(s->key >> 32), b = (int32_t)(s->key & 0xFFFFFFFFu);
        if ((size_t)a >= tok->n_tokens || (size_t)b >= tok->n_tokens || s->result < 0 ||
            (size_t)s->result >= tok->n_tokens)
            return false;
        size_t na, nb, nr;
        const char *ta = tok_text(tok, a, &na), *tb = tok_text(tok, b, &nb);
        const char *tr = tok_text(tok, s->result, &nr);
        if (nr != na + nb || memcmp(tr, ta, na) || memcmp(tr + na, tb, nb)) return false;
    }
    /* Specials are sorted by first byte, longest first. */
    for (size_t i = 0; i < tok->n_special; i++) {
        size_t n;
        const char *t = tok_text(tok, tok->special[i], &n);
        uint8_t first = (uint8_t)t[0];
        if (i < tok->special_start[first] || i >= tok->special_start[first + 1]) return false;
    }
    return true;
}

/* ---- getters ----------------------------------------------------------------------------- */

size_t akv_tok_n_tokens(const akv_tok *tok) {
    return tok->n_tokens;
}

akv_tok_pre akv_tok_get_pre(const akv_tok *tok) {
    return tok->pre;
}

akv_tok_specials akv_tok_get_specials(const akv_tok *tok) {
    return tok->sp;
}

akv_tok_model akv_tok_get_model(const akv_tok *tok) {
    return tok->model;
}

size_t akv_tok_max_piece_bytes(const akv_tok *tok) {
    return tok->max_piece_bytes;
}

static bool tok_id_ok(const akv_tok *tok, int32_t id) {
    return id >= 0 && (size_t)id < tok->n_tokens;
}

akv_tok_type akv_tok_token_type(const akv_tok *tok, int32_t id) {
    return tok_id_ok(tok, id) ? (akv_tok_type)tok->type[id] : AKV_TOK_TYPE_UNDEFINED;
}

const char *akv_tok_token_text(const akv_tok *tok, int32_t id, size_t *n_bytes) {
    if (!tok_id_ok(tok, id)) return NULL;
    size_t n;
    const char *t = tok_text(tok, id, &n);
    if (n_bytes) *n_bytes = n;
    return t;
}

const uint8_t *akv_tok_token_piece(const akv_tok *tok, int32_t id, size_t *n_bytes) {
    if (!tok_id_ok(tok, id)) return NULL;
    if (n_bytes) *n_bytes = tok->piece_off[id + 1] - tok->piece_off[id];
    return tok->piece + tok->piece_off[id];
}

/* ---- caller buffers ---------------------------------------------------------------------- */

static akv_status tok_text_reserve(akv_tok_text *t, size_t n_more) {
    size_t need;
    if (!akv__size_add(t->n_bytes, n_more, &need) || !akv__size_add(need, 1, &need))
        return AKV_EOVERFLOW;
    return akv__array_reserve((void **)&t->bytes, &t->cap, need, 1);
}

akv_status akv_tok_text_append(akv_tok_text *t, const void *bytes, size_t n_bytes) {
    if (!t || (!bytes && n_bytes)) {
        AKV_LOG_E("tok: text append of %zu bytes to %s from %s", n_bytes, t ? "a text" : "NULL",
                  bytes ? "bytes" : "NULL");
        return AKV_EINVAL;
    }
    akv_status st = tok_text_reserve(t, n_bytes);
    if (st) return st;
    if (n_bytes) memcpy(t->bytes + t->n_bytes, bytes, n_bytes);
    t->n_bytes += n_bytes;
    t->bytes[t->n_bytes] = '\0';
    return AKV_OK;
}

/* Drops what was appended since n0 (all-or-nothing on error). */
static void tok_text_truncate(akv_tok_text *t, size_t n0) {
    t->n_bytes = n0;
    if (t->bytes) t->bytes[n0] = '\0';
}

void akv_tok_text_free(akv_tok_text *t) {
    if (!t) return;
    akv__free(t->bytes);
    memset(t, 0, sizeof *t);
}

void akv_tok_ids_free(akv_tok_ids *ids) {
    if (!ids) return;
    akv__free(ids->ids);
    memset(ids, 0, sizeof *ids);
}

static akv_status tok_push(akv_tok_ids *out, int32_t id) {
    akv_status st =
        akv__array_reserve((void **)&out->ids, &out->cap, out->n_ids + 1, sizeof *out->ids);
    if (st) return st;
    out->ids[out->n_ids++] = id;
    return AKV_OK;
}

void akv_tok_spans_free(akv_tok_spans *spans) {
    if (!spans) return;
    akv__free(spans->spans);
    memset(spans, 0, sizeof *spans);
}

akv_status akv_tok_spans_push(akv_tok_spans *spans, size_t off, size_t n_bytes) {
    akv_status st = akv__array_reserve((void **)&spans->spans, &spans->cap, spans->n + 1,
                                       sizeof *spans->spans);
    if (st) return st;
    spans->spans[spans->n++] = (akv_tok_span){off, n_bytes};
    return AKV_OK;
}

/* ---- encode ------------------------------------------------------------------------------ */

/* One encode call's working memory. */
typedef struct tok_session {
    const akv_tok *tok;
    akv_tok_ids *out;
    size_t n0;                 /* ids out held before the call */
    size_t max_ids;            /* 0 = no limit */
    uint32_t flags;
    const akv_tok_span *plain; /* [n_plain] in the text being encoded, sorted */
    size_t n_plain;
    akv__bpe_scratch bpe;
    char *word;      /* a pre-token in byte-level text (ignore_merges look-ups) */
    size_t cap_word; /* bytes */
    akv__spm_scratch spm;
} tok_session;

/* AKV_EFULL once the call has appended more than max_ids ids. */
static akv_status tok_limit(const tok_session *ss) {
    return ss->max_ids && ss->out->n_ids - ss->n0 > ss->max_ids ? AKV_EFULL : AKV_OK;
}

static akv_status tok_emit(tok_session *ss, int32_t id) {
    akv_status st = tok_push(ss->out, id);
    return st ? st : tok_limit(ss);
}

/* BPE over a run of bytes that all have tokens, within the limit: the run gives at least
 * ceil(n / max_piece_bytes) ids (no token stands for more bytes), so a run that cannot fit
 * is refused before the merge loop allocates for it. */
static akv_status tok_bpe_run(tok_session *ss, const uint8_t *w, size_t n) {
    const akv_tok *tok = ss->tok;
    if (ss->max_ids) {
        const size_t have = ss->out->n_ids - ss->n0;
        const size_t least = (n + tok->max_piece_bytes - 1) / tok->max_piece_bytes;
        if (have + least > ss->max_ids) return AKV_EFULL;
    }
    akv_status st = akv__bpe_word(&tok->merges, tok->byte_token, w, n, &ss->bpe, ss->out);
    return st ? st : tok_limit(ss);
}

/* One pre-token: a single byte is its byte's token; with ignore_merges a pre-token that is a
 * token is taken whole; otherwise the merge loop, run by run between the bytes without a
 * token (which never merge, so cutting there changes nothing, and keeps the loop's memory
 * to the longest run). */
static akv_status tok_encode_word(void *ctx, const uint8_t *w, size_t n) {
    tok_session *ss = ctx;
    const akv_tok *tok = ss->tok;
    if (n == 1) return tok->byte_token[w[0]] < 0 ? AKV_OK : tok_emit(ss, tok->byte_token[w[0]]);
    if (tok->ignore_merges && n <= tok->max_text_bytes) {
        akv_status st = akv__array_reserve((void **)&ss->word, &ss->cap_word, 2 * n, 1);
        if (st) return st;
        size_t len = 0;
        for (size_t i = 0; i < n; i++) {
            const uint8_t *bt = tok->byte_text[w[i]];
            memcpy(ss->word + len, bt + 1, bt[0]);
            len += bt[0];
        }
        int32_t id = akv_tok_find(tok, ss->word, len);
        if (id >= 0) return tok_emit(ss, id);
    }
    for (size_t i = 0; i < n;) {
        while (i < n && tok->byte_token[w[i]] < 0) i++;
        size_t j = i;
        while (j < n && tok->byte_token[w[j]] >= 0) j++;
        if (j > i) {
            akv_status st = tok_bpe_run(ss, w + i, j - i);
            if (st) return st;
        }
        i = j;
    }
    return AKV_OK;
}

static akv_status tok_emit_cb(void *ctx, int32_t id) {
    return tok_emit(ctx, id);
}

/* A fragment between special tokens: BPE over its pre-tokens, or the SPM loop. */
static akv_status tok_encode_fragment(tok_session *ss, const uint8_t *s, size_t n) {
    const akv_tok *tok = ss->tok;
    if (tok->model == AKV_TOK_MODEL_SPM)
        return akv__spm_encode(tok, s, n, tok->add_space_prefix, &ss->spm, tok_emit_cb, ss);
    return akv__pretok_split(tok->pretok, s, n, tok_encode_word, ss);
}

/* The special token whose text starts s[0..n), longest first; -1 when none. CONTROL tokens
 * only with AKV_TOK_PARSE_SPECIAL and when they end at or before `control_end`. */
static int32_t tok_match_special(const akv_tok *tok, const uint8_t *s, size_t n, uint32_t flags,
                                 size_t control_end, size_t *len) {
    for (uint32_t i = tok->special_start[s[0]]; i < tok->special_start[s[0] + 1]; i++) {
        int32_t id = tok->special[i];
        size_t tn;
        const char *t = tok_text(tok, id, &tn);
        if (tok->type[id] != AKV_TOK_TYPE_USER_DEFINED &&
            (!(flags & AKV_TOK_PARSE_SPECIAL) || tn > control_end))
            continue;
        if (tn <= n && memcmp(t, s, tn) == 0) {
            *len = tn;
            return id;
        }
    }
    return -1;
}

static akv_status tok_encode_text(tok_session *ss, const uint8_t *s, size_t n) {
    const akv_tok *tok = ss->tok;
    akv_status st;
    size_t frag = 0; /* start of the text not yet encoded */
    size_t k = 0;    /* the first plain span that ends after i */
    for (size_t i = 0; i < n && tok->n_special > 0; i++) {
        /* Special texts are well-formed, so they can only start on a character boundary. */
        if ((s[i] & 0xC0) == 0x80) continue;
        /* a CONTROL text may not reach into a plain span (it is not matched inside one) */
        while (k < ss->n_plain && ss->plain[k].off + ss->plain[k].n_bytes <= i) k++;
        size_t control_end = SIZE_MAX;
        if (k < ss->n_plain) control_end = ss->plain[k].off <= i ? 0 : ss->plain[k].off - i;
        size_t len;
        int32_t id = tok_match_special(tok, s + i, n - i, ss->flags, control_end, &len);
        if (id < 0) continue;
        if ((st = tok_encode_fragment(ss, s + frag, i - frag)) || (st = tok_emit(ss, id)))
            return st;
        frag = i + len;
        i = frag - 1;
    }
    return tok_encode_fragment(ss, s + frag, n - frag);
}

/* Whether spans[0..n) are sorted, disjoint and inside [0, n_bytes). */
static bool tok_spans_ok(const akv_tok_span *sp, size_t n, size_t n_bytes) {
    size_t end = 0;
    for (size_t i = 0; i < n; i++) {
        if (sp[i].off < end || sp[i].off > n_bytes || sp[i].n_bytes > n_bytes - sp[i].off)
            return false;
        end = sp[i].off + sp[i].n_bytes;
    }
    return true;
}

/* Step 1 for a text with plain spans: each stretch between span edges is made valid alone,
 * so the spans' edges stay edges; *plain_out gets the spans' offsets in the clean text. */
static size_t tok_sanitize_spans(const uint8_t *s, size_t n, const akv_tok_span *sp, size_t n_sp,
                                 uint8_t *clean, akv_tok_span *plain_out) {
    size_t at = 0, o = 0;
    for (size_t i = 0; i < n_sp; i++) {
        o += akv__utf8_sanitize(s + at, sp[i].off - at, clean + o);
        const size_t o0 = o;
        o += akv__utf8_sanitize(s + sp[i].off, sp[i].n_bytes, clean + o);
        plain_out[i] = (akv_tok_span){o0, o - o0};
        at = sp[i].off + sp[i].n_bytes;
    }
    return o + akv__utf8_sanitize(s + at, n - at, clean + o);
}

akv_status akv_tok_encode_with(const akv_tok *tok, const char *text, size_t n_bytes,
                               const akv_tok_encode_opts *o, akv_tok_ids *out) {
    AKV_ASSERT(tok && o && out && (text || n_bytes == 0) && (o->plain || o->n_plain == 0));
    if (!tok_spans_ok(o->plain, o->n_plain, n_bytes)) {
        AKV_LOG_E("tokenizer: encode: the plain spans are not sorted, disjoint stretches of the "
                  "%zu-byte text", n_bytes);
        return AKV_EINVAL;
    }
    const size_t n0 = out->n_ids;
    const uint8_t *s = (const uint8_t *)text;
    uint8_t *clean = NULL;
    akv_tok_span *plain = NULL;
    akv_status st = AKV_OK;
    tok_session ss = {.tok = tok, .out = out, .n0 = n0, .max_ids = o->max_ids, .flags = o->flags,
                      .plain = o->plain, .n_plain = o->n_plain};

    /* 1. Invalid UTF-8 becomes U+FFFD (at most 3 output bytes per input byte). */
    if (!akv__utf8_valid(s, n_bytes)) {
        size_t cap;
        if (!akv__size_mul(n_bytes, 3, &cap)) return AKV_EOVERFLOW;
        if (!(clean = akv__malloc(cap ? cap : 1))) return AKV_ENOMEM;
        if (o->n_plain && !(plain = akv__calloc(o->n_plain, sizeof *plain))) {
            akv__free(clean);
            return AKV_ENOMEM;
        }
        n_bytes = o->n_plain ? tok_sanitize_spans(s, n_bytes, o->plain, o->n_plain, clean, plain)
                             : akv__utf8_sanitize(s, n_bytes, clean);
        if (plain) ss.plain = plain;
        s = clean;
    }
    /* 2..4. Specials, pre-tokens, merges; 5. BOS/EOS. */
    const bool add = o->flags & AKV_TOK_ADD_SPECIAL;
    if (add && tok->sp.add_bos && (st = tok_emit(&ss, tok->sp.bos_id))) goto done;
    if ((st = tok_encode_text(&ss, s, n_bytes))) goto done;
    if (add && tok->sp.add_eos && (st = tok_emit(&ss, tok->sp.eos_id))) goto done;
done:
    if (st) out->n_ids = n0;
    akv__bpe_scratch_free(&ss.bpe);
    akv__spm_scratch_free(&ss.spm);
    akv__free(ss.word);
    akv__free(clean);
    akv__free(plain);
    return st;
}

akv_status akv_tok_encode(const akv_tok *tok, const char *text, size_t n_bytes, uint32_t flags,
                          akv_tok_ids *out) {
    const akv_tok_encode_opts o = {.flags = flags};
    return akv_tok_encode_with(tok, text, n_bytes, &o, out);
}

/* ---- decode ------------------------------------------------------------------------------ */

/* The bytes token `id` contributes to a decode with `flags` (length 0 for a hidden special). */
static const uint8_t *tok_decode_piece(const akv_tok *tok, int32_t id, uint32_t flags, size_t *n) {
    uint8_t type = tok->type[id];
    if ((type == AKV_TOK_TYPE_CONTROL || type == AKV_TOK_TYPE_UNKNOWN) &&
        !(flags & AKV_TOK_DECODE_SPECIAL)) {
        *n = 0;
        return tok->piece;
    }
    *n = tok->piece_off[id + 1] - tok->piece_off[id];
    return tok->piece + tok->piece_off[id];
}

static akv_status tok_bad_id(const akv_tok *tok, const char *what, int32_t id, size_t pos) {
    AKV_LOG_E("tokenizer: %s: id %d at position %zu is not in [0, %zu)", what, (int)id, pos,
              tok->n_tokens);
    return AKV_EINVAL;
}

akv_status akv_tok_decode(const akv_tok *tok, const int32_t *ids, size_t n_ids, uint32_t flags,
                          akv_tok_text *out) {
    AKV_ASSERT(tok && out && (ids || n_ids == 0));
    const size_t n0 = out->n_bytes;
    size_t total = 0, n;
    for (size_t i = 0; i < n_ids; i++) {
        if (!tok_id_ok(tok, ids[i])) return tok_bad_id(tok, "decode", ids[i], i);
        tok_decode_piece(tok, ids[i], flags, &n);
        if (!akv__size_add(total, n, &total)) return AKV_EOVERFLOW;
    }
    akv_status st = akv_tok_text_append(out, NULL, 0); /* NUL even for nothing */
    if (!st) st = tok_text_reserve(out, total);
    if (st) return st;
    for (size_t i = 0; i < n_ids; i++) {
        const uint8_t *p = tok_decode_piece(tok, ids[i], flags, &n);
        memcpy(out->bytes + out->n_bytes, p, n);
        out->n_bytes += n;
    }
    out->bytes[out->n_bytes] = '\0';
    uint8_t *got = (uint8_t *)out->bytes + n0;
    if ((flags & AKV_TOK_DECODE_LOSSY) && !akv__utf8_valid(got, total)) {
        /* Sanitise from a copy: the result may be up to three times longer. */
        uint8_t *raw = akv__malloc(total);
        size_t grow;
        st = raw ? AKV_OK : AKV_ENOMEM;
        if (!st && !akv__size_mul(total, 2, &grow)) st = AKV_EOVERFLOW;
        if (!st) st = tok_text_reserve(out, grow);
        if (st) {
            akv__free(raw);
            tok_text_truncate(out, n0);
            return st;
        }
        memcpy(raw, out->bytes + n0, total);
        out->n_bytes = n0 + akv__utf8_sanitize(raw, total, (uint8_t *)out->bytes + n0);
        out->bytes[out->n_bytes] = '\0';
        akv__free(raw);
    }
    return AKV_OK;
}

/* ---- streaming decode -------------------------------------------------------------------- */

void akv_tok_stream_reset(akv_tok_stream *stream) {
    memset(stream, 0, sizeof *stream);
}

/* Writes p[0..n) to dst as valid UTF-8 (invalid subparts become U+FFFD) except a truncated
 * tail, which goes to tail[] (*n_tail bytes, at most 3). dst has room for 3 * n. */
static size_t tok_stream_emit(const uint8_t *p, size_t n, uint8_t *dst, uint8_t *tail,
                              uint8_t *n_tail) {
    size_t i = 0, o = 0, len;
    uint32_t cp;
    *n_tail = 0;
    while (i < n) {
        akv__utf8_kind k = akv__utf8_next(p + i, n - i, &len, &cp);
        if (k == AKV__UTF8_TRUNCATED) {
            memcpy(tail, p + i, len);
            *n_tail = (uint8_t)len;
            break;
        }
        if (k == AKV__UTF8_VALID)
            memcpy(dst + o, p + i, len), o += len;
        else
            memcpy(dst + o, AKV__UTF8_REPLACEMENT, 3), o += 3;
        i += len;
    }
    return o;
}

akv_status akv_tok_stream_push(const akv_tok *tok, akv_tok_stream *stream, int32_t id,
                               uint32_t flags, akv_tok_text *out) {
    AKV_ASSERT(tok && stream && out && stream->n_pending < 4);
    if (!tok_id_ok(tok, id)) return tok_bad_id(tok, "stream decode", id, 0);
    size_t n;
    const uint8_t *p = tok_decode_piece(tok, id, flags, &n);
    /* The held-back bytes complete (or fail) within the first 3 bytes of this piece; run
     * those through a small joint buffer, the rest straight from the piece. */
    uint8_t head[7];
    size_t n_head = stream->n_pending, from_piece = n < 3 ? n : 3;
    memcpy(head, stream->pending, n_head);
    memcpy(head + n_head, p, from_piece);
    n_head += from_piece;
    size_t room;
    if (!akv__size_mul(n + 4, 3, &room)) return AKV_EOVERFLOW;
    akv_status st = tok_text_reserve(out, room);
    if (st) return st;
    uint8_t *dst = (uint8_t *)out->bytes + out->n_bytes, tail[4];
    uint8_t n_tail;
    size_t o = 0;
    if (n_head > 0 && stream->n_pending > 0) {
        /* Emit the joint buffer up to the last sequence that starts within the pending bytes
         * (later ones are re-read from the piece). */
        size_t i = 0, len;
        uint32_t cp;
        while (i < stream->n_pending) {
            akv__utf8_kind k = akv__utf8_next(head + i, n_head - i, &len, &cp);
            if (k == AKV__UTF8_TRUNCATED) break;
            if (k == AKV__UTF8_VALID)
                memcpy(dst + o, head + i, len), o += len;
            else
                memcpy(dst + o, AKV__UTF8_REPLACEMENT, 3), o += 3;
            i += len;
        }
        if (i < stream->n_pending) { /* still incomplete: the whole piece was too short */
            AKV_ASSERT(n_head - i <= 3);
            memmove(stream->pending, head + i, n_head - i);
            stream->n_pending = (uint8_t)(n_head - i);
            out->n_bytes += o;
            out->bytes[out->n_bytes] = '\0';
            return AKV_OK;
        }
        size_t used = i - stream->n_pending; /* bytes of the piece consumed */
        p += used;
        n -= used;
    }
    o += tok_stream_emit(p, n, dst + o, tail, &n_tail);
    memcpy(stream->pending, tail, n_tail);
    stream->n_pending = n_tail;
    out->n_bytes += o;
    out->bytes[out->n_bytes] = '\0';
    return AKV_OK;
}

akv_status akv_tok_stream_flush(akv_tok_stream *stream, akv_tok_text *out) {
    AKV_ASSERT(stream && out);
    akv_status st = stream->n_pending ? akv_tok_text_append(out, AKV__UTF8_REPLACEMENT, 3)
                                      : akv_tok_text_append(out, NULL, 0);
    if (st) return st;
    stream->n_pending = 0;
    return AKV_OK;
}
