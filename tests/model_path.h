/*
 * tests/model_path.h — where the model-labelled tests find the default model: models/ under
 * AKV_SOURCE_DIR (ctest sets it; "." otherwise), or, where the caller allows it, the file named
 * by AKV_TEST_MODEL (a layer slice on the GPU machine, which the whole file cannot reach).
 */
#ifndef AKV_TESTS_MODEL_PATH_H
#define AKV_TESTS_MODEL_PATH_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Writes the path into out[n]; returns 1 when the file is readable, 0 otherwise. */
static inline int test_model_path(char *out, size_t n, int allow_override) {
    const char *src = getenv("AKV_SOURCE_DIR"), *over = getenv("AKV_TEST_MODEL");
    if (allow_override && over && *over)
        snprintf(out, n, "%s", over);
    else
        snprintf(out, n, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", src ? src : ".");
    return access(out, R_OK) == 0;
}

#endif
