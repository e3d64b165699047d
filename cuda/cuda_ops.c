/*
 * cuda_ops.c — the CUDA op table: op name -> launcher. Later kernels add one line each.
 */
#include "cuda_ops.h"

#include <string.h>

#include "akv/forward_ops.h"
#include "akv/kvq.h"

typedef struct cuda_op {
    const char *name; /* the akv_dev_op's name */
    akv_cuda_op_fn launch;
    int needs_blas; /* the launcher uses the cuBLAS handle */
} cuda_op;

static const cuda_op cuda_ops[] = {
    {"busy", akv__cuda_busy_launch, 0},
    {"stage_probe", akv__cuda_stage_probe_launch, 0},
    {AKV_FWD_OP_EMBED, akv__cuda_fwd_embed, 0},
    {AKV_FWD_OP_RMSNORM, akv__cuda_fwd_rmsnorm, 0},
    {AKV_FWD_OP_ROPE, akv__cuda_fwd_rope, 0},
    {AKV_FWD_OP_HEAD_NORM, akv__cuda_fwd_head_norm, 0},
    {AKV_FWD_OP_SWIGLU, akv__cuda_fwd_swiglu, 0},
    {AKV_FWD_OP_ADD, akv__cuda_fwd_add, 0},
    {AKV_FWD_OP_CAST, akv__cuda_fwd_cast, 0},
    {AKV_FWD_OP_FILL, akv__cuda_fwd_fill, 0},
    {AKV_FWD_OP_ARGMAX, akv__cuda_fwd_argmax, 0},
    {AKV_FWD_OP_SAMPLE, akv__cuda_fwd_sample, 0},
    {AKV_FWD_OP_MATMUL, akv__cuda_fwd_matmul, 1},
    {AKV_FWD_OP_ATTN_APPEND, akv__cuda_fwd_attn_append, 0},
    {AKV_FWD_OP_ATTN_DECODE, akv__cuda_fwd_attn_decode, 0},
    {AKV_FWD_OP_ATTN_PREFILL, akv__cuda_fwd_attn_prefill, 0},
    {AKV_FWD_OP_ATTN_MERGE, akv__cuda_fwd_attn_merge, 0},
    {AKV_FWD_OP_ATTN_WIDEN, akv__cuda_fwd_attn_widen, 0},
    {AKV_KVQ_OP_ENCODE, akv__cuda_kvq_encode_launch, 0},
};

akv_cuda_op_fn akv__cuda_op_find(const char *name, int *needs_blas) {
    for (size_t i = 0; i < sizeof cuda_ops / sizeof cuda_ops[0]; i++) {
        if (strcmp(cuda_ops[i].name, name)) continue;
        if (needs_blas) *needs_blas = cuda_ops[i].needs_blas;
        return cuda_ops[i].launch;
    }
    return NULL;
}
