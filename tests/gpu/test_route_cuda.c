/* test_route_cuda.c (gpu) — THE BITWISE CELLS on CUDA (tests/route_cells.h): the staged route
 * against the resident route on the device pass, logits bit-identical at every step of a
 * 64-token greedy run, for prompts 1, P-1, P, P+1, 3P+5 and 2000, with 1 sequence and with 4
 * (stepped one at a time, and in batch steps of all 4), each set one route in its own 1 GiB
 * device pool. Then the host-attended route against resident the same way, within the pass's
 * rounding (route_cells.h).
 *
 * Models
 *   synthetic Llama-3-8B shape (n_embd 4096, n_ff 14336, 32 query / 8 K/V heads of 128,
 *             vocabulary 128256), bf16 weights generated on the device
 *             (akv_forward_dev_create_synthetic), with its layers REDUCED to 2 (AKV_TEST_LAYERS
 *             overrides, 1..32) so the 24 cells run in seconds;
 *   default   models/SmolLM2-135M-Instruct.Q4_1.gguf under AKV_SOURCE_DIR, or the file named
 *             by AKV_TEST_MODEL (e.g. a 10-layer slice: akv gguf slice); skipped if absent.
 * P = 16 tokens per page (AKV_TEST_PAGE_TOKENS overrides) and a window of 2 pages. Every cell
 * must stage pages (the cells check staged bytes > 0), so the greedy run is 64 steps or, at
 * a P where 64 steps stay inside the window (P >= 32), 2P + 1 steps: even the 1-token prompt
 * then outgrows the window. The attention's partitioning depends only on (max_pages * P,
 * n_seq, device), identical for both routes.
 * Prints "k of k cells" per model (18 each). Exit 77 without CUDA or a device. */
#include "model_build.h" /* first: it sets _POSIX_C_SOURCE (route_cells.h includes it) */

#include "test.h"
#include "model_path.h"

#include <stdlib.h>

#include "env.h"
#include "gpu_skip.h"
#include "llama3_shape.h"
#include "route_cells.h"

#include "akv/model.h"

static int cells_on(akv_dev *dev, akv_forward_dev *fd, const char *what, float host_share) {
    const akv_model_config *c = akv_forward_dev_config(fd);
    uint32_t P = (uint32_t)akv_test_env_int("AKV_TEST_PAGE_TOKENS", 4, 1024, 16);
    rc_params rc = {.dev = dev,
                    .fd = fd,
                    .n_layers = c->n_layers,
                    .n_kv_heads = c->n_kv_heads,
                    .head_dim = c->head_dim,
                    .n_vocab = c->n_vocab,
                    .dtype = AKV_DTYPE_BF16,
                    .page_tokens = P,
                    .window = 2,
                    .max_step_tokens = 256,
                    .n_gen = 2 * P + 1 > 64 ? 2 * P + 1 : 64,
                    .device_gib = 1,
                    .seed = test_seed(2026),
                    .host_share = host_share};
    return rc_cells(&rc, 2000, what);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    const akv_dev_backend *be = test_cuda_backend_or_skip();
    akv_dev *dev = NULL;
    if (!REQUIRE_OK(akv_dev_create(be, NULL, &dev))) return test_finish();
    akv_forward_params fp = {.max_step_tokens = 256};

    TEST_CASE(bitwise_cells_synthetic_llama3_8b_shape) {
        akv_model_config c = llama3_8b_shape((uint32_t)akv_test_env_int("AKV_TEST_LAYERS", 1, 32, 2));
        akv_forward_dev *fd = NULL;
        if (!CHECK(akv_forward_dev_create_synthetic(dev, &c, 7, &fp, &fd) == AKV_OK)) break;
        char what[128];
        snprintf(what, sizeof what, "synthetic Llama-3-8B shape, %u layers (reduced), CUDA",
                 c.n_layers);
        cells_on(dev, fd, what, 0.0f);
        akv_forward_dev_destroy(fd);
    }

    /* the host-attended route against resident, within the pass's rounding (route_cells.h) */
    TEST_CASE(host_attended_cells_synthetic_llama3_8b_shape) {
        akv_model_config c = llama3_8b_shape((uint32_t)akv_test_env_int("AKV_TEST_LAYERS", 1, 32, 2));
        akv_forward_dev *fd = NULL;
        if (!CHECK(akv_forward_dev_create_synthetic(dev, &c, 7, &fp, &fd) == AKV_OK)) break;
        cells_on(dev, fd, "synthetic Llama-3-8B shape, host-attended, CUDA", 0.5f);
        akv_forward_dev_destroy(fd);
    }

    TEST_CASE(bitwise_cells_default_model) {
        char path[4096];
        if (!test_model_path(path, sizeof path, 1)) {
            printf("  no default model at %s (scripts/fetch-model, or AKV_TEST_MODEL): case "
                   "skipped\n",
                   path);
            break;
        }
        akv_model *m = NULL;
        akv_forward_dev *fd = NULL;
        if (!CHECK(akv_model_load(path, NULL, &m) == AKV_OK)) break;
        if (CHECK(akv_forward_dev_create(dev, m, &fp, &fd) == AKV_OK)) {
            char what[4200];
            snprintf(what, sizeof what, "%s (%u layers), CUDA", path,
                     akv_forward_dev_config(fd)->n_layers);
            cells_on(dev, fd, what, 0.0f);
        }
        akv_forward_dev_destroy(fd);
        akv_model_destroy(m);
    }
    CHECK_OK(akv_dev_destroy(dev));
    return test_finish();
}

