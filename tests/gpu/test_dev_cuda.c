/* test_dev_cuda.c (gpu) — the CUDA backend: open, properties, device and pinned memory, and
 * the same queue/event/copy/op/fault cases the host backend passes (tests/dev_cases.h). */
#include "test.h"

#include "dev_cases.h"

#include "akv/dev.h"
#include "akv/testing/dev_faults.h"
#include "akv/log.h"
#ifdef AKV_HAVE_CUDA
#include "akv/dev_cuda.h"
#endif

int main(int argc, char **argv) {
    test_args(argc, argv);
#ifndef AKV_HAVE_CUDA
    test_skip("built without the CUDA backend");
#else
    akv_dev *dev = NULL;
    if (akv_dev_create(akv_dev_cuda_backend(), NULL, &dev) != AKV_OK)
        test_skip("no CUDA device answers on this machine");
    TEST_CASE(info) {
        akv_dev_info info;
        CHECK_OK(akv_dev_get_info(dev, &info));
        printf("device: %s, compute capability %d.%d, %d SMs, %zu bytes, smem/block %zu, L2 %zu\n", info.name,
               info.cc_major, info.cc_minor, info.n_sm, info.total_bytes, info.smem_per_block_bytes, info.l2_bytes);
        CHECK(info.n_sm > 0);
        CHECK(info.cc_major > 0);
        CHECK(info.total_bytes > 0);
        CHECK_EQ_INT(info.is_host, 0);
    }
    TEST_CASE(memory) {
        akv_dptr d;
        void *h;
        CHECK_OK(akv_dev_mem_alloc(dev, 1 << 20, &d));
        CHECK_OK(akv_dev_pinned_alloc(dev, 1 << 20, &h));
        CHECK_STATUS(akv_dev_destroy(dev), AKV_EBUSY);
        CHECK_OK(akv_dev_mem_free(dev, d));
        CHECK_OK(akv_dev_pinned_free(dev, h));
    }
    TEST_CASE(too_much_device_memory) {
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        akv_dptr d;
        CHECK_STATUS(akv_dev_mem_alloc(dev, (size_t)1 << 50, &d), AKV_EDEVMEM);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
    }
    akv_log_set(NULL, NULL, AKV_LOG_OFF); /* the misuse and fault cases log by design */
    dev_cases_misuse(dev, NULL);
    dev_cases_roundtrip(dev);
    dev_cases_2d(dev);
    dev_cases_batch(dev);
    dev_cases_pinned_dptr(dev, 0);
    dev_cases_ops(dev, 4ull * 1000 * 1000);
    dev_cases_faults(dev);
    dev_cases_host_fn(dev);
    dev_cases_graph(dev, NULL);
    akv_log_set(NULL, NULL, AKV_LOG_WARN);
    dev_cases_reuse_chain(dev, 400);
    TEST_CASE(exec_faults_and_delays_are_host_only) {
        CHECK_STATUS(akv_dev_inject_fault(dev, AKV_FAULT_COPY_EXEC, 1, 0), AKV_EUNSUPPORTED);
        CHECK_STATUS(akv_dev_inject_delays(dev, 1, 10, 1), AKV_EUNSUPPORTED);
    }
    CHECK_OK(akv_dev_destroy(dev));
    return test_finish();
#endif
}
