/* config.c — a model's configuration from GGUF metadata (akv/model.h, akv_model_config_read). */
#include "akv/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "akv/attn.h"
#include "akv/geom.h"
#include "core/log.h"

/* Reads "<arch>.<suffix>" as a u32. Absent: *out = dflt when `required` is false, else
 * AKV_EFORMAT naming the key. A value of another type or out of range: the getter's
 * AKV_EFORMAT (logged by it). */
static akv_status cfg_u32(const akv_gguf *g, const char *arch, const char *suffix, bool required,
                          uint32_t dflt, uint32_t *out) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    akv_status st = akv_gguf_get_u32(g, key, out);
    if (st == AKV_ENOTFOUND) {
        if (required) {
            AKV_LOG_E("model: required key '%s' is missing", key);
            return AKV_EFORMAT;
        }
        *out = dflt;
        return AKV_OK;
    }
    return st;
}

/* As cfg_u32, for a float (F32 or F64 in the file). */
static akv_status cfg_f64(const akv_gguf *g, const char *arch, const char *suffix, bool required,
                          double dflt, double *out) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    akv_status st = akv_gguf_get_f64(g, key, out);
    if (st == AKV_ENOTFOUND) {
        if (required) {
            AKV_LOG_E("model: required key '%s' is missing", key);
            return AKV_EFORMAT;
        }
        *out = dflt;
        return AKV_OK;
    }
    return st;
}

static akv_status cfg_bad(const char *arch, const char *suffix, const char *why, double value) {
    AKV_LOG_E("model: key '%s.%s' = %g: %s", arch, suffix, value, why);
    return AKV_EFORMAT;
}

/* The RoPE scaling keys: none, or linear with a factor. */
static akv_status cfg_rope_scaling(const akv_gguf *g, const char *arch, double *freq_scale) {
    char key[96];
    akv_gguf_str type;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    akv_status st = akv_gguf_get_str(g, key, &type);
    *freq_scale = 1.0;
    if (st == AKV_ENOTFOUND) return AKV_OK;
    if (st) return st;
    if (type.len == 4 && !memcmp(type.ptr, "none", 4)) return AKV_OK;
    if (!(type.len == 6 && !memcmp(type.ptr, "linear", 6))) {
        AKV_LOG_E("model: key '%s' = '%.*s': only 'none' and 'linear' RoPE scaling are supported",
                  key, (int)type.len, type.ptr);
        return AKV_EUNSUPPORTED;
    }
    double factor;
    st = cfg_f64(g, arch, "rope.scaling.factor", true, 0, &factor);
    if (st) return st;
    if (!(factor >= 1) || isinf(factor))
        return cfg_bad(arch, "rope.scaling.factor", "must be finite and >= 1", factor);
    *freq_scale = 1.0 / factor;
    return AKV_OK;
}

/* Gemma 3's own keys (akv/model.h), as llama.cpp reads them. */
static akv_status cfg_gemma3(const akv_gguf *g, const char *arch, akv_model_config *c) {
    akv_status st;
    char key[96];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    akv_gguf_arr pat;
    if (akv_gguf_get_arr(g, key, &pat) == AKV_OK) {
        AKV_LOG_E("model: key '%s' is an array (a layer-by-layer pattern): not supported", key);
        return AKV_EUNSUPPORTED;
    }
    double cap;
    if ((st = cfg_u32(g, arch, "attention.sliding_window", false, 0, &c->n_swa)) ||
        (st = cfg_u32(g, arch, "attention.sliding_window_pattern", false, 6, &c->swa_pattern)) ||
        (st = cfg_f64(g, arch, "rope.freq_base_swa", false, 10000.0, &c->rope_base_swa)) ||
        (st = cfg_f64(g, arch, "final_logit_softcapping", false, 0.0, &cap)))
        return st;
    if (cap != 0.0) {
        AKV_LOG_E("model: key '%s.final_logit_softcapping' = %g: a soft-capped output is not "
                  "implemented (only 0)", arch, cap);
        return AKV_EUNSUPPORTED;
    }
    if (!(c->rope_base_swa > 1) || isinf(c->rope_base_swa))
        return cfg_bad(arch, "rope.freq_base_swa", "must be finite and > 1", c->rope_base_swa);
    if (c->n_swa && c->swa_pattern == 0)
        return cfg_bad(arch, "attention.sliding_window_pattern", "must be > 0", 0);
    c->embd_scale = sqrtf((float)c->n_embd);
    /* gemma_pytorch's query_pre_attn_scalar: n_embd / n_heads for the 27B shape, else head_dim */
    c->attn_scale = c->n_layers == 62 ? 1.0f / sqrtf((float)c->n_embd / (float)c->n_heads) : 0.0f;
    return AKV_OK;
}

akv_status akv_model_config_read(const akv_gguf *g, akv_model_config *out) {
    if (!g || !out) return AKV_EINVAL;
    akv_model_config c;
    memset(&c, 0, sizeof c);

    akv_gguf_str a;
    akv_status st = akv_gguf_get_str(g, "general.architecture", &a);
    if (st == AKV_ENOTFOUND) {
        AKV_LOG_E("model: required key 'general.architecture' is missing");
        return AKV_EFORMAT;
    }
    if (st) return st;
    if (a.len == 5 && !memcmp(a.ptr, "llama", 5)) {
        c.arch = AKV_MODEL_ARCH_LLAMA;
        c.rope_mode = AKV_ROPE_NORMAL; /* the converter permuted Q/K for adjacent pairs */
    } else if (a.len == 5 && !memcmp(a.ptr, "qwen2", 5)) {
        c.arch = AKV_MODEL_ARCH_QWEN2;
        c.rope_mode = AKV_ROPE_NEOX;
        c.has_qkv_bias = true;
    } else if (a.len == 5 && !memcmp(a.ptr, "qwen3", 5)) {
        c.arch = AKV_MODEL_ARCH_QWEN3;
        c.rope_mode = AKV_ROPE_NEOX;
        c.has_qk_norm = true;
    } else if (a.len == 6 && !memcmp(a.ptr, "gemma3", 6)) {
        c.arch = AKV_MODEL_ARCH_GEMMA3;
        c.rope_mode = AKV_ROPE_NEOX;
        c.has_qk_norm = c.has_post_norms = true;
        c.ffn_act = AKV_FFN_GEGLU;
    } else {
        AKV_LOG_E("model: key 'general.architecture' = '%.*s' is not supported (llama, qwen2, "
                  "qwen3, gemma3)",
                  (int)(a.len > 64 ? 64 : a.len), a.ptr);
        return AKV_EUNSUPPORTED;
    }
    memcpy(c.arch_name, a.ptr, a.len);
    const char *arch = c.arch_name;

    uint32_t n_experts, key_len, value_len;
    if ((st = cfg_u32(g, arch, "block_count", true, 0, &c.n_layers)) ||
        (st = cfg_u32(g, arch, "embedding_length", true, 0, &c.n_embd)) ||
        (st = cfg_u32(g, arch, "feed_forward_length", true, 0, &c.n_ff)) ||
        (st = cfg_u32(g, arch, "context_length", true, 0, &c.n_ctx_train)) ||
        (st = cfg_u32(g, arch, "attention.head_count", true, 0, &c.n_heads)) ||
        (st = cfg_u32(g, arch, "expert_count", false, 0, &n_experts)))
        return st;
    if (n_experts > 0) {
        AKV_LOG_E("model: key '%s.expert_count' = %u: mixtures of experts are not supported", arch,
                  n_experts);
        return AKV_EUNSUPPORTED;
    }
    if (c.n_layers == 0) return cfg_bad(arch, "block_count", "must be > 0", 0);
    /* before anything is sized by it (per-layer arrays): the K/V geometry's limit */
    if (c.n_layers > AKV_GEOM_MAX_LAYERS)
        return cfg_bad(arch, "block_count", "must be at most 4096 (the K/V geometry's limit)", c.n_layers);
    if (c.n_embd == 0) return cfg_bad(arch, "embedding_length", "must be > 0", 0);
    if (c.n_ff == 0) return cfg_bad(arch, "feed_forward_length", "must be > 0", 0);
    if (c.n_ctx_train == 0) return cfg_bad(arch, "context_length", "must be > 0", 0);
    if (c.n_heads == 0) return cfg_bad(arch, "attention.head_count", "must be > 0", 0);

    if ((st = cfg_u32(g, arch, "attention.head_count_kv", false, c.n_heads, &c.n_kv_heads)))
        return st;
    if (c.n_kv_heads == 0 || c.n_heads % c.n_kv_heads)
        return cfg_bad(arch, "attention.head_count_kv", "must divide attention.head_count",
                       c.n_kv_heads);

    uint32_t dflt_hd = c.n_embd % c.n_heads ? 0 : c.n_embd / c.n_heads;
    if ((st = cfg_u32(g, arch, "attention.key_length", false, dflt_hd, &key_len)) ||
        (st = cfg_u32(g, arch, "attention.value_length", false, key_len, &value_len)))
        return st;
    if (key_len == 0)
        return cfg_bad(arch, "attention.key_length",
                       "absent while embedding_length is not a multiple of head_count, or 0", 0);
    if (value_len != key_len) {
        AKV_LOG_E("model: keys '%s.attention.key_length' = %u and '.value_length' = %u differ: "
                  "not supported",
                  arch, key_len, value_len);
        return AKV_EUNSUPPORTED;
    }
    if (key_len > AKV_ATTN_MAX_HEAD_DIM) {
        AKV_LOG_E("model: the head dimension %s.attention.key_length = %u is not supported: the "
                  "attention takes 1..%d (64 or 128 on CUDA)",
                  arch, key_len, AKV_ATTN_MAX_HEAD_DIM);
        return AKV_EUNSUPPORTED;
    }
    c.head_dim = key_len;

    if ((st = cfg_u32(g, arch, "rope.dimension_count", false, c.head_dim, &c.n_rot))) return st;
    if (c.n_rot == 0 || c.n_rot % 2 || c.n_rot > c.head_dim)
        return cfg_bad(arch, "rope.dimension_count", "must be even, > 0 and <= the head dim",
                       c.n_rot);

    double eps;
    if ((st = cfg_f64(g, arch, "attention.layer_norm_rms_epsilon", true, 0, &eps)) ||
        (st = cfg_f64(g, arch, "rope.freq_base", false, 10000.0, &c.rope_base)) ||
        (st = cfg_rope_scaling(g, arch, &c.rope_freq_scale)))
        return st;
    if (!(eps > 0 && eps < 1))
        return cfg_bad(arch, "attention.layer_norm_rms_epsilon", "must be in (0, 1)", eps);
    c.rms_eps = (float)eps;
    if (!(c.rope_base > 1) || isinf(c.rope_base))
        return cfg_bad(arch, "rope.freq_base", "must be finite and > 1", c.rope_base);

    /* The vocabulary: the embedding's rows, which vocab_size (when present) must equal. */
    const akv_gguf_tensor *emb;
    if (akv_gguf_find_tensor(g, "token_embd.weight", &emb) != AKV_OK) {
        AKV_LOG_E("model: tensor 'token_embd.weight' is missing");
        return AKV_EFORMAT;
    }
    if (emb->n_dims != 2 || emb->ne[0] != c.n_embd || emb->ne[1] == 0 || emb->ne[1] > INT32_MAX) {
        AKV_LOG_E("model: tensor 'token_embd.weight' has shape {%llu, %llu} (%u dims); expected "
                  "{%u, n_vocab}",
                  (unsigned long long)emb->ne[0], (unsigned long long)emb->ne[1], emb->n_dims,
                  c.n_embd);
        return AKV_EFORMAT;
    }
    uint32_t n_vocab_key;
    if ((st = cfg_u32(g, arch, "vocab_size", false, (uint32_t)emb->ne[1], &n_vocab_key))) return st;
    if (n_vocab_key != emb->ne[1])
        return cfg_bad(arch, "vocab_size", "differs from the rows of token_embd.weight",
                       n_vocab_key);
    c.n_vocab = n_vocab_key;

    c.embd_scale = 1.0f;
    c.rope_base_swa = c.rope_base;
    if (c.arch == AKV_MODEL_ARCH_GEMMA3 && (st = cfg_gemma3(g, arch, &c))) return st;

    const akv_gguf_tensor *t;
    c.has_rope_factors = akv_gguf_find_tensor(g, "rope_freqs.weight", &t) == AKV_OK;
    c.tied_output = akv_gguf_find_tensor(g, "output.weight", &t) != AKV_OK;
    *out = c;
    return AKV_OK;
}
