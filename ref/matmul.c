/* matmul.c — matrix products of akv/ops.h: OpenBLAS, and the plain-C oracle. */
#include "akv/ops.h"

#include <limits.h>

#include <cblas.h>

#include "core/assert.h"

/* OpenBLAS's own entry point (not in every cblas.h). */
void openblas_set_num_threads(int num_threads);

void akv_ops_ref_matmul(float *y, const float *x, const float *w, const float *bias, size_t m,
                        size_t n, size_t k) {
    AKV_ASSERT(m >= 1 && n >= 1 && k >= 1);
    AKV_ASSERT(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX); /* BLAS counts are int */
    if (m == 1) {
        /* y[n] = W[n][k] x[k] (+ bias): the decode step's matrix-vector path. */
        /* y is set even with beta = 0: some OpenBLAS versions scale it, and 0 * NaN is NaN. */
        for (size_t j = 0; j < n; j++)
            y[j] = bias ? bias[j] : 0.0f;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)k, 1.0f, w, (int)k, x, 1,
                    bias ? 1.0f : 0.0f, y, 1);
        return;
    }
    if (bias)
        for (size_t r = 0; r < m; r++)
            for (size_t j = 0; j < n; j++)
                y[r * n + j] = bias[j];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, x, (int)k, w,
                (int)k, bias ? 1.0f : 0.0f, y, (int)n);
}

void akv_ops_ref_matmul_plain(float *y, const float *x, const float *w, const float *bias, size_t m,
                              size_t n, size_t k) {
    for (size_t r = 0; r < m; r++) {
        const float *xr = x + r * k;
        for (size_t j = 0; j < n; j++) {
            const float *wj = w + j * k;
            float acc = 0;
            for (size_t i = 0; i < k; i++)
                acc += xr[i] * wj[i];
            y[r * n + j] = acc + (bias ? bias[j] : 0.0f);
        }
    }
}

void akv_ops_ref_set_threads(int n_threads) {
    AKV_ASSERT(n_threads >= 1);
    openblas_set_num_threads(n_threads);
}
