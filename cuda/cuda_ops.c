/*
 * cuda_ops.c — the CUDA op table: op name -> launcher. Later kernels add one line each.
 */
#include "cuda_ops.h"

#include <string.h>

typedef struct cuda_op {
    const char *name; /* the akv_dev_op's name */
    akv_cuda_op_fn launch;
} cuda_op;

static const cuda_op cuda_ops[] = {
    {"busy", akv__cuda_busy_launch},
    {"stage_probe", akv__cuda_stage_probe_launch},
};

akv_cuda_op_fn akv__cuda_op_find(const char *name) {
    for (size_t i = 0; i < sizeof cuda_ops / sizeof cuda_ops[0]; i++)
        if (!strcmp(cuda_ops[i].name, name)) return cuda_ops[i].launch;
    return NULL;
}
