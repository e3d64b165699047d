/* tok_gguf.c — a tokenizer from a GGUF file's tokenizer.ggml.* metadata (see akv/tok.h). */
#include <string.h>

#include "akv/gguf.h"
#include "akv/tok.h"
#include "core/alloc.h"
#include "core/log.h"

/* The names akv_tok_pre_from_name takes, for the refusals. */
#define TOK_PRE_NAMES "gpt2, smollm, starcoder, llama-bpe, qwen2"

/* A string array of the GGUF as pointer and length arrays (pointing into the file). */
typedef struct tok_strs {
    const char **ptr;
    size_t *len;
    size_t n;
} tok_strs;

static void tok_strs_free(tok_strs *s) {
    akv__free((void *)s->ptr);
    akv__free(s->len);
}

/* Reads the string array `key`: AKV_ENOTFOUND when absent (not logged), AKV_EFORMAT when it
 * is not an array of strings. */
static akv_status tok_gguf_strs(const akv_gguf *g, const char *key, tok_strs *out) {
    akv_gguf_arr a;
    akv_status st = akv_gguf_get_arr(g, key, &a);
    if (st) return st;
    if (a.type != AKV_GGUF_VTYPE_STRING) {
        AKV_LOG_E("tokenizer: %s is an array of %s; expected strings", key,
                  akv_gguf_vtype_name(a.type));
        return AKV_EFORMAT;
    }
    if (a.n > INT32_MAX) {
        AKV_LOG_E("tokenizer: %s has %llu entries; at most %d", key, (unsigned long long)a.n,
                  INT32_MAX);
        return AKV_EFORMAT;
    }
    out->n = (size_t)a.n;
    out->ptr = a.n ? akv__calloc(out->n, sizeof *out->ptr) : NULL;
    out->len = a.n ? akv__calloc(out->n, sizeof *out->len) : NULL;
    if (a.n && (!out->ptr || !out->len)) {
        tok_strs_free(out);
        return AKV_ENOMEM;
    }
    for (size_t i = 0; i < out->n; i++) {
        akv_gguf_str s = akv_gguf_arr_str(g, &a, i);
        out->ptr[i] = s.ptr;
        out->len[i] = s.len;
    }
    return AKV_OK;
}

/* An optional token id `key` into *id (left alone when absent): it must be < n_tokens. */
static akv_status tok_gguf_id(const akv_gguf *g, const char *key, size_t n_tokens, int32_t *id) {
    uint32_t v;
    akv_status st = akv_gguf_get_u32(g, key, &v);
    if (st == AKV_ENOTFOUND) return AKV_OK;
    if (st) return st;
    if (v >= n_tokens) {
        AKV_LOG_E("tokenizer: %s = %u is not a token id (the vocabulary has %zu)", key, v,
                  n_tokens);
        return AKV_EFORMAT;
    }
    *id = (int32_t)v;
    return AKV_OK;
}

static akv_status tok_gguf_bool(const akv_gguf *g, const char *key, bool *b) {
    akv_status st = akv_gguf_get_bool(g, key, b);
    return st == AKV_ENOTFOUND ? AKV_OK : st;
}

/* The end-of-turn token when the file names none: the first of the texts chat models end a
 * turn with (as llama.cpp looks them up). */
static int32_t tok_gguf_guess_eot(const tok_strs *tokens) {
    static const char *const texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                        "<|endoftext|>"};
    for (size_t t = 0; t < AKV_ARRAY_LEN(texts); t++) {
        size_t n = strlen(texts[t]);
        for (size_t i = 0; i < tokens->n; i++)
            if (tokens->len[i] == n && memcmp(tokens->ptr[i], texts[t], n) == 0) return (int32_t)i;
    }
    return -1;
}

akv_status akv_tok_create_from_gguf(const akv_gguf *g, const char *pre, akv_tok **out) {
    AKV_ASSERT(g && out);
    akv_tok_params p = akv_tok_default_params();
    tok_strs tokens = {0}, merges = {0};
    int32_t *types = NULL;
    float *scores = NULL;
    akv_gguf_str s;
    akv_status st;

    /* The model: byte-level BPE ("gpt2", the pre-tokenizer by name) or SPM ("llama"). */
    if ((st = akv_gguf_get_str(g, "tokenizer.ggml.model", &s))) {
        if (st == AKV_ENOTFOUND) AKV_LOG_E("tokenizer: the file has no tokenizer.ggml.model");
        return st == AKV_ENOTFOUND ? AKV_EFORMAT : st;
    }
    if (s.len == 5 && memcmp(s.ptr, "llama", 5) == 0) {
        p.model = AKV_TOK_MODEL_SPM;
        p.add_space_prefix = p.add_bos = true; /* llama.cpp's defaults for SPM; and its ids,
                                                  unk 0, bos 1, eos 2, once the size is known */
        if ((st = tok_gguf_bool(g, "tokenizer.ggml.add_space_prefix", &p.add_space_prefix))) return st;
    } else if (s.len != 4 || memcmp(s.ptr, "gpt2", 4) != 0) {
        AKV_LOG_E("tokenizer: tokenizer.ggml.model is '%.*s'; byte-level BPE ('gpt2') and "
                  "SentencePiece ('llama') are supported",
                  (int)(s.len > 64 ? 64 : s.len), s.ptr);
        return AKV_EUNSUPPORTED;
    }
    if (p.model == AKV_TOK_MODEL_SPM) {
        /* no pre-tokenizer: tokenizer.ggml.pre ("default") and `pre` play no part */
    } else if (pre) { /* the caller names it */
        if (akv_tok_pre_from_name(pre, &p.pre) != AKV_OK) {
            AKV_LOG_E("tokenizer: pre-tokenizer '%s' is not supported (supported: %s)", pre,
                      TOK_PRE_NAMES);
            return AKV_EINVAL;
        }
    } else if ((st = akv_gguf_get_str(g, "tokenizer.ggml.pre", &s))) {
        if (st == AKV_ENOTFOUND)
            AKV_LOG_E("tokenizer: the file has no tokenizer.ggml.pre, so its pre-tokenizer is "
                      "unknown (name one: %s)", TOK_PRE_NAMES);
        return st == AKV_ENOTFOUND ? AKV_EUNSUPPORTED : st;
    } else {
        char pre_name[32] = {0};
        memcpy(pre_name, s.ptr, s.len < sizeof pre_name - 1 ? s.len : sizeof pre_name - 1);
        if (s.len >= sizeof pre_name || akv_tok_pre_from_name(pre_name, &p.pre) != AKV_OK) {
            AKV_LOG_E("tokenizer: tokenizer.ggml.pre '%.*s' is not supported (supported: %s)",
                      (int)(s.len > 64 ? 64 : s.len), s.ptr, TOK_PRE_NAMES);
            return AKV_EUNSUPPORTED;
        }
    }

    /* The vocabulary and its merges (BPE) or scores (SPM). */
    if ((st = tok_gguf_strs(g, "tokenizer.ggml.tokens", &tokens)) ||
        (p.model == AKV_TOK_MODEL_BPE && (st = tok_gguf_strs(g, "tokenizer.ggml.merges", &merges)))) {
        if (st == AKV_ENOTFOUND) {
            AKV_LOG_E("tokenizer: the file has no tokenizer.ggml.%s",
                      tokens.n ? "merges" : "tokens");
            st = AKV_EFORMAT;
        }
        goto done;
    }
    if (tokens.n == 0) {
        AKV_LOG_E("tokenizer: tokenizer.ggml.tokens is empty");
        st = AKV_EFORMAT;
        goto done;
    }
    if (p.model == AKV_TOK_MODEL_SPM) {
        akv_gguf_arr sa;
        if ((st = akv_gguf_get_arr(g, "tokenizer.ggml.scores", &sa)) || sa.type != AKV_GGUF_VTYPE_F32 ||
            sa.n != tokens.n) {
            if (st == AKV_OK || st == AKV_ENOTFOUND) {
                AKV_LOG_E("tokenizer: a SentencePiece vocabulary needs tokenizer.ggml.scores: %zu "
                          "f32 values%s", tokens.n, st == AKV_ENOTFOUND ? " (absent)" : "");
                st = AKV_EFORMAT;
            }
            goto done;
        }
        if (!(scores = akv__malloc(tokens.n * sizeof *scores))) {
            st = AKV_ENOMEM;
            goto done;
        }
        for (size_t i = 0; i < tokens.n; i++) scores[i] = (float)akv_gguf_arr_float(&sa, i);
    }
    akv_gguf_arr ta;
    if ((st = akv_gguf_get_arr(g, "tokenizer.ggml.token_type", &ta)) == AKV_OK) {
        bool is_int = ta.type != AKV_GGUF_VTYPE_STRING && ta.type != AKV_GGUF_VTYPE_F32 &&
                      ta.type != AKV_GGUF_VTYPE_F64 && ta.type != AKV_GGUF_VTYPE_BOOL;
        if (!is_int || ta.n != tokens.n) {
            AKV_LOG_E("tokenizer: tokenizer.ggml.token_type is %llu %s; expected %zu integers",
                      (unsigned long long)ta.n, akv_gguf_vtype_name(ta.type), tokens.n);
            st = AKV_EFORMAT;
            goto done;
        }
        if (!(types = akv__calloc(tokens.n, sizeof *types))) {
            st = AKV_ENOMEM;
            goto done;
        }
        for (size_t i = 0; i < tokens.n; i++) {
            int64_t v = akv_gguf_arr_int(&ta, i);
            if (v < AKV_TOK_TYPE_UNDEFINED || v > AKV_TOK_TYPE_BYTE) {
                AKV_LOG_E("tokenizer: tokenizer.ggml.token_type[%zu] = %lld is not a token "
                          "type (0..6)",
                          i, (long long)v);
                st = AKV_EFORMAT;
                goto done;
            }
            types[i] = (int32_t)v;
        }
    } else if (st != AKV_ENOTFOUND) {
        goto done;
    }

    /* Special ids and flags (SPM: llama.cpp's defaults where the keys are absent). */
    if (p.model == AKV_TOK_MODEL_SPM && tokens.n > 2) p.unk_id = 0, p.bos_id = 1, p.eos_id = 2;
    if (p.model == AKV_TOK_MODEL_SPM && tokens.n <= 2) p.add_bos = false;
    if ((st = tok_gguf_id(g, "tokenizer.ggml.bos_token_id", tokens.n, &p.bos_id)) ||
        (st = tok_gguf_id(g, "tokenizer.ggml.eos_token_id", tokens.n, &p.eos_id)) ||
        (st = tok_gguf_id(g, "tokenizer.ggml.eot_token_id", tokens.n, &p.eot_id)) ||
        (st = tok_gguf_id(g, "tokenizer.ggml.unknown_token_id", tokens.n, &p.unk_id)) ||
        (st = tok_gguf_id(g, "tokenizer.ggml.padding_token_id", tokens.n, &p.pad_id)) ||
        (st = tok_gguf_bool(g, "tokenizer.ggml.add_bos_token", &p.add_bos)) ||
        (st = tok_gguf_bool(g, "tokenizer.ggml.add_eos_token", &p.add_eos)))
        goto done;
    if (p.eot_id < 0) p.eot_id = tok_gguf_guess_eot(&tokens);
    if ((p.add_bos && p.bos_id < 0) || (p.add_eos && p.eos_id < 0)) {
        AKV_LOG_E("tokenizer: tokenizer.ggml.add_%s_token is true but the file names no %s "
                  "token id",
                  p.add_bos && p.bos_id < 0 ? "bos" : "eos",
                  p.add_bos && p.bos_id < 0 ? "bos" : "eos");
        st = AKV_EFORMAT;
        goto done;
    }

    p.n_tokens = tokens.n;
    p.tokens = tokens.ptr;
    p.token_bytes = tokens.len;
    p.token_types = types;
    p.n_merges = merges.n;
    p.merges = merges.ptr;
    p.merge_bytes = merges.len;
    p.scores = scores;
    st = akv_tok_create(&p, out);
done:
    tok_strs_free(&tokens);
    tok_strs_free(&merges);
    akv__free(types);
    akv__free(scores);
    return st;
}
