/*
 * tests/llama3_shape.h — the synthetic Llama-3-8B shape that the GPU tests and benchmarks
 * generate on the device (akv_forward_dev_create_synthetic): n_embd 4096, n_ff 14336, 32 query
 * / 8 K/V heads of 128, vocabulary 128256, RoPE base 500000; n_layers as asked (32 = full).
 */
#ifndef AKV_TESTS_LLAMA3_SHAPE_H
#define AKV_TESTS_LLAMA3_SHAPE_H

#include "akv/model.h"

static inline akv_model_config llama3_8b_shape(uint32_t n_layers) {
    return (akv_model_config){.arch = AKV_MODEL_ARCH_LLAMA,
                              .arch_name = "llama",
                              .n_layers = n_layers,
                              .n_embd = 4096,
                              .n_ff = 14336,
                              .n_heads = 32,
                              .n_kv_heads = 8,
                              .head_dim = 128,
                              .n_rot = 128,
                              .n_vocab = 128256,
                              .n_ctx_train = 131072,
                              .rms_eps = 1e-5f,
                              .rope_base = 500000.0,
                              .rope_freq_scale = 1.0,
                              .rope_mode = AKV_ROPE_NORMAL};
}

#endif
