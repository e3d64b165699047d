/* test_stage_cuda.c (gpu) — the staging lifecycle on the CUDA backend: the misuse table, one
 * lease end to end (receipts, prior readers, RAW), cancellation, failure at every submission
 * and wait point (execution faults exist only on the host backend), and the randomized run
 * with the probe kernel checking exactly the rows each attention should see.
 * AKV_STAGE_OPS sets the randomized run's length (default 200000). AKV_TEST_QUICK (set by
 * scripts/gpu-check under compute-sanitizer) shortens it to 8000 and injects each fault only at
 * its first and last pass. Skips (77) without the CUDA backend or a device. */
#include "test.h"

#include "gpu/gpu_skip.h"
#include "stage_cases/faults.h" /* with stage_cases/fixture.h, misuse.h and cancel.h */

int main(int argc, char **argv) {
    test_args(argc, argv);
    const akv_dev_backend *cuda = test_cuda_backend_or_skip();
    uint64_t seed = test_seed(20261129);
    const char *env = getenv("AKV_STAGE_OPS");
    int quick = getenv("AKV_TEST_QUICK") != NULL;
    uint64_t n_ops = env ? strtoull(env, NULL, 0) : quick ? 8000 : 200000;
    sc_params p = {.backend = cuda,
                   .n_layers = 2,
                   .n_kv_heads = 1,
                   .head_dim = 64,
                   .page_tokens = 4,
                   .n_slots = 1,
                   .slot_pages = 40,
                   .poison = 0xA5,
                   .max_tokens = 40,
                   .arena_bytes = 1 << 20};
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    sc_misuse_table(&p);
    sc_lifecycle(&p);
    p.n_slots = 2;
    sc_lifecycle(&p);
    sc_cancel(&p);
    sc_fault_sweep(&p, 0, quick);
    akv_log_set(NULL, NULL, AKV_LOG_WARN);
    /* one slot, and more slots than layers (where the RAW waits are not implied) */
    for (uint32_t n_slots = 1; n_slots <= 4; n_slots *= 4) {
        TEST_CASE(randomized_leases_on_the_device) {
            sc_params q = p;
            q.n_layers = 3;
            q.head_dim = 8;
            q.n_slots = n_slots;
            sc_stress(&q, n_ops / 2, seed + n_slots, 0, 0, NULL);
        }
    }
    return test_finish();
}
