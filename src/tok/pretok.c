/* pretok.c — the pre-tokenizers' expressions and the PCRE2 splitting loop (see pretok.h). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tok/pretok.h"

#include <pcre2.h>

#include <string.h>

#include "core/alloc.h"
#include "core/assert.h"
#include "core/log.h"

/* Unicode White_Space, spelled out. Hugging Face's Oniguruma \s is exactly this set; PCRE2's
 * \s under UCP also takes U+180E (via \h), so \s and \S are never used directly. */
#define WS                                                                                         \
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"       \
    "\\x{202F}\\x{205F}\\x{3000}"

/* GPT-2's expression, as in HF's ByteLevel pre-tokenizer (llama.cpp drops the final \s+,
 * which only changes how a stretch it leaves unmatched is named, not the split). */
#define PAT_GPT2                                                                                   \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS       \
    "])|[" WS "]+"

/* Every number character alone: HF's Digits(individual_digits=true), which splits on
 * Rust's char::is_numeric (Nd, Nl, No), i.e. \p{N}. */
#define PAT_DIGIT "\\p{N}"

/* Llama 3's expression from its tokenizer.json (Split, Isolated), unchanged but for \s, with
 * its numbers' alternative: up to three digits (Llama 3), every digit alone (Qwen2's and
 * Qwen3's tokenizer.json, otherwise the same). */
#define PAT_LLAMA3_WITH(numbers)                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" numbers "| ?[^" WS               \
    "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
#define PAT_LLAMA3 PAT_LLAMA3_WITH("\\p{N}{1,3}")
#define PAT_QWEN2 PAT_LLAMA3_WITH("\\p{N}")

enum { PRETOK_MAX_STEPS = 2 };

struct akv__pretok {
    int n_steps;
    pcre2_code *code[PRETOK_MAX_STEPS];
    pcre2_general_context *gctx; /* routes PCRE2's allocations through core/alloc.h */
};

/* One split in progress: the match data of every step. */
typedef struct pretok_run {
    const akv__pretok *p;
    pcre2_match_data *md[PRETOK_MAX_STEPS];
    akv__pretok_fn fn;
    void *ctx;
} pretok_run;

const char *akv__pretok_pattern(akv_tok_pre pre, int step) {
    switch (pre) {
    case AKV_TOK_PRE_GPT2:
        return step == 0 ? PAT_GPT2 : NULL;
    case AKV_TOK_PRE_SMOLLM:
        return step == 0 ? PAT_DIGIT : step == 1 ? PAT_GPT2 : NULL;
    case AKV_TOK_PRE_LLAMA3:
        return step == 0 ? PAT_LLAMA3 : NULL;
    case AKV_TOK_PRE_QWEN2:
        return step == 0 ? PAT_QWEN2 : NULL;
    }
    return NULL;
}

static void *pretok_malloc(size_t n_bytes, void *user) {
    (void)user;
    return akv__malloc(n_bytes);
}

static void pretok_free(void *p, void *user) {
    (void)user;
    akv__free(p);
}

akv_status akv__pretok_create(akv_tok_pre pre, akv__pretok **out) {
    AKV_ASSERT(akv__pretok_pattern(pre, 0) != NULL);
    akv__pretok *p = akv__calloc(1, sizeof *p);
    if (!p) return AKV_ENOMEM;
    akv_status st = AKV_ENOMEM;
    pcre2_compile_context *cctx = NULL;
    p->gctx = pcre2_general_context_create(pretok_malloc, pretok_free, NULL);
    if (!p->gctx) goto fail;
    cctx = pcre2_compile_context_create(p->gctx);
    if (!cctx) goto fail;
    for (const char *pat; (pat = akv__pretok_pattern(pre, p->n_steps)) != NULL; p->n_steps++) {
        int err;
        PCRE2_SIZE err_at;
        p->code[p->n_steps] = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                            PCRE2_UTF | PCRE2_UCP, &err, &err_at, cctx);
        if (!p->code[p->n_steps]) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            if (err == PCRE2_ERROR_NOMEMORY || err == PCRE2_ERROR_HEAP_FAILED) goto fail;
            AKV_LOG_E("tokenizer: pre-tokenizer %s, step %d: PCRE2 cannot compile its "
                      "expression at offset %zu: %s (is PCRE2 built with Unicode support?)",
                      akv_tok_pre_name(pre), p->n_steps, (size_t)err_at, (const char *)msg);
            st = AKV_EUNSUPPORTED;
            goto fail;
        }
        /* JIT is an optimisation: where this PCRE2 has none the interpreter gives the same
         * matches, so only running out of memory is an error. */
        if (pcre2_jit_compile(p->code[p->n_steps], PCRE2_JIT_COMPLETE) == PCRE2_ERROR_NOMEMORY) {
            p->n_steps++; /* so that destroy frees this step's code */
            goto fail;
        }
    }
    pcre2_compile_context_free(cctx);
    *out = p;
    return AKV_OK;
fail:
    pcre2_compile_context_free(cctx);
    akv__pretok_destroy(p);
    return st;
}

void akv__pretok_destroy(akv__pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n_steps; i++)
        pcre2_code_free(p->code[i]);
    pcre2_general_context_free(p->gctx);
    akv__free(p);
}

/* Length of the UTF-8 sequence led by byte b (input is well-formed). */
static size_t pretok_char_len(uint8_t b) {
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

static akv_status pretok_step(const pretok_run *run, int step, const uint8_t *s, size_t n);

/* Hands s[0..n) to the next step, or to the callback after the last one. */
static akv_status pretok_emit(const pretok_run *run, int next, const uint8_t *s, size_t n) {
    if (n == 0) return AKV_OK;
    if (next == run->p->n_steps) return run->fn(run->ctx, s, n);
    return pretok_step(run, next, s, n);
}

static akv_status pretok_step(const pretok_run *run, int step, const uint8_t *s, size_t n) {
    pcre2_match_data *md = run->md[step];
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t done = 0;   /* s[0..done) has been handed on */
    size_t search = 0; /* where the next match attempt starts */
    akv_status st;
    while (search < n) {
        int rc = pcre2_match(run->p->code[step], s, n, search, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            if (rc == PCRE2_ERROR_NOMEMORY) return AKV_ENOMEM;
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            AKV_LOG_E("tokenizer: pre-tokenizer gave up at byte %zu of a %zu-byte piece: %s",
                      search, n, (const char *)msg);
            return AKV_EUNSUPPORTED;
        }
        size_t m0 = ov[0], m1 = ov[1];
        if (m1 == m0) { /* an empty match (none of our expressions has one): skip a char */
            search = m0 + pretok_char_len(s[m0]);
            continue;
        }
        if ((st = pretok_emit(run, step + 1, s + done, m0 - done)) != AKV_OK) return st;
        if ((st = pretok_emit(run, step + 1, s + m0, m1 - m0)) != AKV_OK) return st;
        done = search = m1;
    }
    return pretok_emit(run, step + 1, s + done, n - done);
}

akv_status akv__pretok_split(const akv__pretok *p, const uint8_t *s, size_t n, akv__pretok_fn fn,
                             void *ctx) {
    if (n == 0) return AKV_OK;
    pretok_run run = {.p = p, .fn = fn, .ctx = ctx};
    akv_status st = AKV_ENOMEM;
    for (int i = 0; i < p->n_steps; i++) {
        run.md[i] = pcre2_match_data_create_from_pattern(p->code[i], p->gctx);
        if (!run.md[i]) goto done;
    }
    st = pretok_step(&run, 0, s, n);
done:
    for (int i = 0; i < p->n_steps; i++)
        pcre2_match_data_free(run.md[i]);
    return st;
}

/* ---- names (akv/tok.h) ------------------------------------------------------------------ */

const char *akv_tok_pre_name(akv_tok_pre pre) {
    switch (pre) {
    case AKV_TOK_PRE_GPT2:
        return "gpt2";
    case AKV_TOK_PRE_SMOLLM:
        return "smollm";
    case AKV_TOK_PRE_LLAMA3:
        return "llama-bpe";
    case AKV_TOK_PRE_QWEN2:
        return "qwen2";
    }
    return "unknown";
}

akv_status akv_tok_pre_from_name(const char *name, akv_tok_pre *out) {
    static const struct {
        const char *name;
        akv_tok_pre pre;
    } names[] = {{"gpt2", AKV_TOK_PRE_GPT2},        {"smollm", AKV_TOK_PRE_SMOLLM},
                 {"starcoder", AKV_TOK_PRE_SMOLLM}, {"llama-bpe", AKV_TOK_PRE_LLAMA3},
                 {"llama3", AKV_TOK_PRE_LLAMA3},    {"llama-v3", AKV_TOK_PRE_LLAMA3},
                 {"qwen2", AKV_TOK_PRE_QWEN2}};
    for (size_t i = 0; name && i < AKV_ARRAY_LEN(names); i++) {
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].pre;
            return AKV_OK;
        }
    }
    return AKV_EUNSUPPORTED;
}
