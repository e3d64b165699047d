/* test_dev.c — the device front and the host backend: memory, accounting, misuse. */
#include "test.h"

#include "akv/dev.h"
#include "akv/log.h"

int main(void) {
    akv_log_set(NULL, NULL, AKV_LOG_OFF); /* the misuse cases log errors by design */
    akv_dev *dev = NULL;
    TEST_CASE(create_host) {
        CHECK_OK(akv_dev_create(akv_dev_host_backend(), NULL, &dev));
        akv_dev_info info;
        CHECK_OK(akv_dev_get_info(dev, &info));
        CHECK_STR(info.name, "host");
        CHECK_EQ_INT(info.is_host, 1);
        CHECK_STR(akv_dev_backend_name(akv_dev_host_backend()), "host");
    }
    if (!dev) return test_finish();

    TEST_CASE(bad_params) {
        akv_dev_params p = akv_dev_default_params();
        akv_dev *d2 = NULL;
        p.device_index = 1;
        CHECK_STATUS(akv_dev_create(akv_dev_host_backend(), &p, &d2), AKV_EDEVICE);
        p.device_index = -1;
        CHECK_STATUS(akv_dev_create(akv_dev_host_backend(), &p, &d2), AKV_EINVAL);
        CHECK(d2 == NULL);
    }

    TEST_CASE(alloc_accounting) {
        akv_dptr d;
        void *h;
        CHECK_OK(akv_dev_mem_alloc(dev, 1000, &d));
        CHECK(d.addr != 0 && d.addr % 256 == 0);
        CHECK_OK(akv_dev_pinned_alloc(dev, 5000, &h));
        CHECK(((uintptr_t)h % 4096) == 0);
        akv_dev_usage u = akv_dev_get_usage(dev);
        CHECK_EQ_U64(u.device_bytes, 1000);
        CHECK_EQ_U64(u.pinned_bytes, 5000);
        CHECK_STATUS(akv_dev_destroy(dev), AKV_EBUSY);
        CHECK_OK(akv_dev_mem_free(dev, d));
        CHECK_OK(akv_dev_pinned_free(dev, h));
        u = akv_dev_get_usage(dev);
        CHECK_EQ_U64(u.device_bytes + u.pinned_bytes + u.n_device + u.n_pinned, 0);
    }

    TEST_CASE(misuse) {
        akv_dptr d;
        void *h;
        CHECK_STATUS(akv_dev_mem_alloc(dev, 0, &d), AKV_EINVAL);
        CHECK_STATUS(akv_dev_pinned_alloc(dev, 0, &h), AKV_EINVAL);
        CHECK_STATUS(akv_dev_mem_free(dev, (akv_dptr){12345}), AKV_EINVAL);
        int local;
        CHECK_STATUS(akv_dev_pinned_free(dev, &local), AKV_EINVAL);
        CHECK_OK(akv_dev_mem_free(dev, (akv_dptr){0}));
        CHECK_OK(akv_dev_pinned_free(dev, NULL));
        /* a pinned block freed as device memory is refused */
        CHECK_OK(akv_dev_pinned_alloc(dev, 64, &h));
        CHECK_STATUS(akv_dev_mem_free(dev, (akv_dptr){(uint64_t)(uintptr_t)h}), AKV_EINVAL);
        CHECK_OK(akv_dev_pinned_free(dev, h));
        CHECK_OK(akv_dev_destroy(NULL));
    }

    TEST_CASE(sync_copies_and_range_checks) {
        akv_dptr d;
        CHECK_OK(akv_dev_mem_alloc(dev, 256, &d));
        unsigned char in[256], out[256];
        for (int i = 0; i < 256; i++) in[i] = (unsigned char)(i * 7 + 1);
        CHECK_OK(akv_dev_memset_sync(dev, d, 0xAB, 256));
        CHECK_OK(akv_dev_copy_d2h_sync(dev, out, d, 256));
        CHECK_EQ_INT(out[255], 0xAB);
        CHECK_OK(akv_dev_copy_h2d_sync(dev, akv_dptr_offset(d, 16), in, 200));
        CHECK_OK(akv_dev_copy_d2d_sync(dev, d, akv_dptr_offset(d, 16), 16));
        CHECK_OK(akv_dev_copy_d2h_sync(dev, out, d, 256));
        CHECK_BYTES(out, in, 16);
        CHECK_BYTES(out + 16, in, 200);
        /* one byte past the end, and an address from nowhere */
        CHECK_STATUS(akv_dev_copy_h2d_sync(dev, akv_dptr_offset(d, 57), in, 200), AKV_EINVAL);
        CHECK_STATUS(akv_dev_copy_d2h_sync(dev, out, (akv_dptr){8}, 1), AKV_EINVAL);
        CHECK_STATUS(akv_dev_memset_sync(dev, akv_dptr_offset(d, 255), 0, 2), AKV_EINVAL);
        CHECK_OK(akv_dev_mem_free(dev, d));
    }

    TEST_CASE(injected_failures) {
        akv_dptr d = {0};
        void *h = NULL;
        CHECK_OK(akv_dev_inject_alloc_failure(dev, 2, 1));
        CHECK_STATUS(akv_dev_pinned_alloc(dev, 64, &h), AKV_ENOMEM);
        CHECK(h == NULL);
        akv_dptr d1;
        CHECK_OK(akv_dev_mem_alloc(dev, 64, &d1));
        CHECK_STATUS(akv_dev_mem_alloc(dev, 64, &d), AKV_EDEVMEM);
        CHECK(d.addr == 0);
        CHECK_OK(akv_dev_mem_free(dev, d1));
        CHECK_EQ_U64(akv_dev_get_usage(dev).n_device, 0);
    }

    TEST_CASE(destroy) {
        CHECK_OK(akv_dev_destroy(dev));
    }
    return test_finish();
}
